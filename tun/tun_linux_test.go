package tun_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/tun"
)

var _ netstack.PacketDevice = (*tun.PacketDevice)(nil)

// Addresses of the root tests, all in benchmarking ranges: 198.18.0.0/15
// (RFC 2544) and its IPv6 counterpart 2001:2::/48 (RFC 5180), chosen over
// a ULA because it is reserved for exactly this use and, like 198.18/15,
// never globally routed.
var (
	hostAddr4  = netip.MustParsePrefix("198.18.0.1/24")
	stackAddr4 = netip.MustParsePrefix("198.18.0.2/24")
	hostAddr6  = netip.MustParsePrefix("2001:2::1/64")
	stackAddr6 = netip.MustParsePrefix("2001:2::2/64")
)

const devName = "siwtun0"

// needRoot skips the test without root or /dev/net/tun.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_NET_ADMIN) and /dev/net/tun")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("needs root (CAP_NET_ADMIN) and /dev/net/tun: %v", err)
	}
}

// inNewNetns locks the calling test goroutine to its OS thread and moves
// the thread into a new, empty network namespace; cleanup moves it back.
// The namespace has no name and disappears with its last user (this
// thread, the sockets and the TUN created in it), so nothing outlives the
// test. Everything that creates a socket or a link must run on this
// goroutine.
func inNewNetns(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("get current netns: %v", err)
	}
	ns, err := netns.New()
	if err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		t.Skipf("cannot create a network namespace: %v", err)
	}
	t.Cleanup(func() {
		ns.Close()
		if err := netns.Set(orig); err != nil {
			// Stay locked: Go discards the thread when the goroutine ends.
			t.Errorf("restore netns: %v", err)
			return
		}
		orig.Close()
		runtime.UnlockOSThread()
	})
}

// nextEvent waits for the next event on ch, skipping none.
func nextEvent(t *testing.T, ch <-chan tun.Event) tun.Event {
	t.Helper()
	select {
	case e, ok := <-ch:
		if !ok {
			t.Fatal("Events closed")
		}
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
	}
	return 0
}

func TestDeviceInNetns(t *testing.T) {
	needRoot(t)
	checkLeaks(t)
	for _, mtu := range []int{1500, 9000} {
		t.Run(fmt.Sprintf("mtu%d", mtu), func(t *testing.T) {
			inNewNetns(t)
			testDevice(t, mtu)
		})
	}
}

// checkLeaks fails the test if, once it and its cleanups are done, a
// goroutine it started is still running or a /dev/net/tun descriptor is
// still open (which would also keep its namespace alive).
func checkLeaks(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<20)
			t.Errorf("%d goroutines leaked:\n%s", n-before, buf[:runtime.Stack(buf, true)])
		}
		if n := openTUNFiles(t); n > 0 {
			t.Errorf("%d /dev/net/tun descriptors left open", n)
		}
	})
}

// openTUNFiles counts this process's open /dev/net/tun descriptors.
func openTUNFiles(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && target == "/dev/net/tun" {
			n++
		}
	}
	return n
}

// TestCreateErrorsInNetns checks Create's refusals against a real kernel:
// the kernel itself answers EBUSY for a TUN name that is held (so Create's
// netlink pre-check agrees with TUNSETIFF), a name held by another kind of
// link is refused, and nothing is left open.
func TestCreateErrorsInNetns(t *testing.T) {
	needRoot(t)
	checkLeaks(t)
	inNewNetns(t)

	dev, err := tun.Create(devName, 1500)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	defer dev.Close()
	if n := openTUNFiles(t); n != 1 {
		t.Fatalf("%d /dev/net/tun descriptors open with one device, want 1", n)
	}
	if err := rawTUNSETIFF(devName, false); !errors.Is(err, unix.EBUSY) {
		t.Errorf("raw TUNSETIFF on a held name = %v, want EBUSY", err)
	}
	for range 3 { // repeated failures leak nothing (see checkLeaks)
		if _, err := tun.Create(devName, 1500); !errors.Is(err, syscall.EBUSY) {
			t.Fatalf("Create on a held name = %v, want EBUSY", err)
		}
	}

	const vethName = "siwveth0"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: vethName}, PeerName: "siwveth1"}); err != nil {
		t.Fatalf("add a veth pair: %v", err)
	}
	_, err = tun.Create(vethName, 1500)
	if err == nil || !errors.Is(err, os.ErrExist) || !strings.Contains(err.Error(), "is not a free TUN") {
		t.Errorf("Create over a veth link = %v, want the exists error", err)
	}
	t.Logf("Create over a veth link: %v", err)

	// A persistent TUN nobody holds is free: Create attaches to it. water
	// clears the persist flag, so it goes away on Close.
	const persistName = "siwtun2"
	if err := rawTUNSETIFF(persistName, true); err != nil {
		t.Fatalf("make a persistent TUN: %v", err)
	}
	pdev, err := tun.Create(persistName, 1500)
	if err != nil {
		t.Fatalf("Create on a free persistent TUN: %v", err)
	}
	if err := pdev.Close(); err != nil {
		t.Fatal(err)
	}
	if ok, err := tun.Exists(persistName); err != nil || ok {
		t.Errorf("Exists after Close of a formerly persistent TUN = %v, %v; want false", ok, err)
	}

	for _, tc := range []struct {
		name  string
		link  string
		mtu   int
		addrs []netip.Prefix
		want  error
	}{
		{"missing link", "nosuch0", 1500, nil, os.ErrNotExist},
		{"IPv6 below 1280", devName, 1000, []netip.Prefix{hostAddr6}, nil},
		{"MTU too large", devName, 65536, nil, nil},
		{"unspecified address", devName, 1500, []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, nil},
	} {
		err := tun.Configure(tc.link, tc.mtu, tc.addrs)
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: Configure = %v, want an error (%v)", tc.name, err, tc.want)
		}
	}
	if err := tun.Delete("nosuch0"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Delete of a missing link = %v, want os.ErrNotExist", err)
	}
	for _, name := range []string{"this-name-is-too-long", "a/b"} {
		if _, err := tun.Create(name, 1500); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("Create(%q) = %v, want EINVAL", name, err)
		}
	}
	if _, err := tun.Create("siwtun1", 20); err == nil {
		t.Error("Create with MTU 20: no error")
	}
}

// rawTUNSETIFF asks the kernel for a TUN named name on a fresh descriptor,
// makes it persistent if persist is set, and closes the descriptor.
func rawTUNSETIFF(name string, persist bool) error {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return err
	}
	if persist {
		return unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1)
	}
	return nil
}

func testDevice(t *testing.T, mtu int) {
	if ok, err := tun.Exists(devName); err != nil || ok {
		t.Fatalf("Exists(%q) in a new netns = %v, %v", devName, ok, err)
	}
	dev, err := tun.Create(devName, mtu)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { dev.Close() })
	if name, _ := dev.Name(); name != devName || dev.BatchSize() != 1 || dev.File() == nil {
		t.Fatalf("Name, BatchSize, File = %q, %d, %v", name, dev.BatchSize(), dev.File())
	}
	if ok, err := tun.Exists(devName); err != nil || !ok {
		t.Fatalf("Exists after Create = %v, %v", ok, err)
	}

	// The name is taken while dev holds it.
	_, err = tun.Create(devName, mtu)
	if err == nil || !errors.Is(err, syscall.EBUSY) || !strings.Contains(err.Error(), "is in use (is another siwtun up running?)") {
		t.Fatalf("second Create = %v, want the in-use error", err)
	}
	t.Logf("second Create: %v", err)

	if err := tun.Configure(devName, mtu, []netip.Prefix{hostAddr4, hostAddr6}); err != nil {
		t.Fatalf("Configure: %v", err)
	}
	if err := tun.Configure(devName, mtu, []netip.Prefix{hostAddr4, hostAddr6}); err != nil {
		t.Fatalf("Configure again: %v", err)
	}
	checkLink(t, mtu)
	if e := nextEvent(t, dev.Events()); e != tun.EventUp {
		t.Fatalf("event after Configure = %v, want up", e)
	}

	// An MTU change made outside is seen by Events and MTU.
	link, err := netlink.LinkByName(devName)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetMTU(link, 1400); err != nil {
		t.Fatal(err)
	}
	if e := nextEvent(t, dev.Events()); e != tun.EventMTUUpdate {
		t.Fatalf("event after an MTU change = %v, want mtu-update", e)
	}
	if got, err := dev.MTU(); err != nil || got != 1400 {
		t.Fatalf("MTU after the change = %d, %v; want 1400", got, err)
	}
	if err := netlink.LinkSetMTU(link, mtu); err != nil {
		t.Fatal(err)
	}
	if e := nextEvent(t, dev.Events()); e != tun.EventMTUUpdate {
		t.Fatalf("event after restoring the MTU = %v, want mtu-update", e)
	}

	pd := tun.NewPacketDevice(dev)
	if pd.MTU() != mtu {
		t.Fatalf("PacketDevice.MTU = %d, want %d", pd.MTU(), mtu)
	}
	st, err := netstack.New(netstack.NewDeviceLink(pd), netstack.Options{Addrs: []netip.Prefix{stackAddr4, stackAddr6}})
	if err != nil {
		t.Fatalf("netstack.New: %v", err)
	}
	t.Cleanup(func() { st.Close() })

	for _, tc := range []struct {
		name        string
		host, stack netip.Addr
	}{
		{"ipv4", hostAddr4.Addr(), stackAddr4.Addr()},
		{"ipv6", hostAddr6.Addr(), stackAddr6.Addr()},
	} {
		// Not t.Run: the kernel sockets must be created on this
		// goroutine, whose thread is in the namespace.
		kernelToStack(t, tc.name, st, tc.stack)
		stackToKernel(t, tc.name, st, tc.host)
	}

	// Delete removes the link under the open device: its I/O reports
	// os.ErrClosed, Events reports down, and the name is free again.
	if err := tun.Delete(devName); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if ok, err := tun.Exists(devName); err != nil || ok {
		t.Fatalf("Exists after Delete = %v, %v", ok, err)
	}
	if _, err := dev.Write([][]byte{ipv4Header()}, 0); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Write after Delete = %v, want os.ErrClosed", err)
	}
	for e := nextEvent(t, dev.Events()); e != tun.EventDown; e = nextEvent(t, dev.Events()) {
	}
	if err := tun.Delete(devName); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("second Delete = %v, want os.ErrNotExist", err)
	}
	again, err := tun.Create(devName, mtu)
	if err != nil {
		t.Fatalf("Create after Delete: %v", err)
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
	if ok, _ := tun.Exists(devName); ok {
		t.Error("the link outlived Close of its only descriptor")
	}
}

// checkLink verifies with netlink that the link is up with the MTU and
// both host addresses.
func checkLink(t *testing.T, mtu int) {
	t.Helper()
	link, err := netlink.LinkByName(devName)
	if err != nil {
		t.Fatal(err)
	}
	a := link.Attrs()
	if a.Flags&net.FlagUp == 0 || a.MTU != mtu || a.TxQLen != tun.HostQueueLen {
		t.Fatalf("link flags %v MTU %d queue %d; want up, MTU %d, queue %d", a.Flags, a.MTU, a.TxQLen, mtu, tun.HostQueueLen)
	}
	if tt, ok := link.(*netlink.Tuntap); !ok || tt.Mode != netlink.TUNTAP_MODE_TUN || tt.Flags&netlink.TUNTAP_NO_PI == 0 {
		t.Fatalf("link is %T %+v, want a TUN with IFF_NO_PI", link, link)
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var got []netip.Prefix
	for _, ad := range addrs {
		ip, _ := netip.AddrFromSlice(ad.IP)
		ones, _ := ad.Mask.Size()
		got = append(got, netip.PrefixFrom(ip.Unmap(), ones))
	}
	for _, want := range []netip.Prefix{hostAddr4, hostAddr6} {
		if !slices.Contains(got, want) {
			t.Errorf("addresses %v lack %v", got, want)
		}
	}
	t.Logf("link %s: flags %v, MTU %d, addresses %v", a.Name, a.Flags, a.MTU, got)
}

// payload returns n seeded pseudo-random bytes.
func payload(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

const transferSize = 1 << 20

// kernelToStack dials from a kernel socket to a netstack listener, sends
// transferSize bytes and checks they come back echoed.
func kernelToStack(t *testing.T, family string, st *netstack.Stack, addr netip.Addr) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ln, err := st.Listen(netip.AddrPortFrom(addr, 7174))
	if err != nil {
		t.Fatalf("%s: Listen: %v", family, err)
	}
	defer ln.Close()
	echoErr := make(chan error, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err != nil {
			echoErr <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(c, c)
		echoErr <- err
	}()

	d := net.Dialer{Timeout: 10 * time.Second}
	kc, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(addr, 7174).String())
	if err != nil {
		t.Fatalf("%s: kernel dial %v: %v", family, addr, err)
	}
	defer kc.Close()
	kc.SetDeadline(time.Now().Add(30 * time.Second))
	data := payload(transferSize, 1)
	writeErr := make(chan error, 1)
	go func() {
		_, err := kc.Write(data)
		if err == nil {
			err = kc.(*net.TCPConn).CloseWrite()
		}
		writeErr <- err
	}()
	got, err := io.ReadAll(kc)
	if err != nil {
		t.Fatalf("%s: read the echo: %v", family, err)
	}
	if err := <-writeErr; err != nil {
		t.Fatalf("%s: kernel write: %v", family, err)
	}
	if err := <-echoErr; err != nil {
		t.Fatalf("%s: netstack echo: %v", family, err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("%s: echo differs: got %d bytes, want %d", family, len(got), len(data))
	}
	t.Logf("%s: kernel %v -> netstack %v: %d bytes echoed", family, kc.LocalAddr(), kc.RemoteAddr(), len(got))
}

// stackToKernel dials from netstack to a kernel listener, sends
// transferSize bytes and checks they come back echoed.
func stackToKernel(t *testing.T, family string, st *netstack.Stack, addr netip.Addr) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kl, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatalf("%s: kernel listen: %v", family, err)
	}
	defer kl.Close()
	echoErr := make(chan error, 1)
	go func() {
		c, err := kl.Accept()
		if err != nil {
			echoErr <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		_, err = io.Copy(c, c)
		echoErr <- err
	}()
	c, err := st.Dial(ctx, netip.Addr{}, netip.MustParseAddrPort(kl.Addr().String()))
	if err != nil {
		t.Fatalf("%s: netstack dial %v: %v", family, kl.Addr(), err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	data := payload(transferSize, 2)
	writeErr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.CloseWrite()
		}
		writeErr <- err
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("%s: read the echo: %v", family, err)
	}
	if err := <-writeErr; err != nil {
		t.Fatalf("%s: netstack write: %v", family, err)
	}
	if err := <-echoErr; err != nil {
		t.Fatalf("%s: kernel echo: %v", family, err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("%s: echo differs: got %d bytes, want %d", family, len(got), len(data))
	}
	t.Logf("%s: netstack %v -> kernel %v: %d bytes echoed", family, c.LocalAddr(), c.RemoteAddr(), len(got))
}

// ipv4Header returns a minimal IPv4 header (no payload) for a write probe.
func ipv4Header() []byte {
	h := make([]byte, 20)
	h[0], h[3], h[8], h[9] = 0x45, 20, 64, 253
	copy(h[12:], stackAddr4.Addr().AsSlice())
	copy(h[16:], hostAddr4.Addr().AsSlice())
	return h
}

// superCounter counts the super-segments a device link reads whole.
type superCounter struct {
	*tun.PacketDevice
	supers, wire atomic.Int64
}

func (c *superCounter) ReadSuper(p []byte) (int, int, error) {
	n, gso, err := c.PacketDevice.ReadSuper(p)
	if gso > 0 {
		c.supers.Add(1)
		c.wire.Add(int64(n))
	}
	return n, gso, err
}

// TestOffloadDeviceInNetns: a netstack on a TUN device with segmentation
// offload talks TCP with the kernel both ways, IPv4 and IPv6, and the
// kernel's super-segments reach the stack whole (ReadSuper) yet intact.
func TestOffloadDeviceInNetns(t *testing.T) {
	needRoot(t)
	checkLeaks(t)
	for _, mtu := range []int{1500, 9000} {
		t.Run(fmt.Sprintf("mtu%d", mtu), func(t *testing.T) {
			inNewNetns(t)
			dev, err := tun.CreateOffload(devName, mtu)
			if err != nil {
				t.Fatalf("CreateOffload: %v", err)
			}
			t.Cleanup(func() { dev.Close() })
			if err := tun.Configure(devName, mtu, []netip.Prefix{hostAddr4, hostAddr6}); err != nil {
				t.Fatalf("Configure: %v", err)
			}
			sc := &superCounter{PacketDevice: tun.NewPacketDevice(dev)}
			if !sc.SupportsSuper() {
				t.Fatal("an offload device's PacketDevice does not support ReadSuper")
			}
			st, err := netstack.New(netstack.NewDeviceLink(sc), netstack.Options{Addrs: []netip.Prefix{stackAddr4, stackAddr6}})
			if err != nil {
				t.Fatalf("netstack.New: %v", err)
			}
			t.Cleanup(func() { st.Close() })
			for _, tc := range []struct {
				name        string
				host, stack netip.Addr
			}{
				{"ipv4", hostAddr4.Addr(), stackAddr4.Addr()},
				{"ipv6", hostAddr6.Addr(), stackAddr6.Addr()},
			} {
				kernelToStack(t, tc.name, st, tc.stack)
				stackToKernel(t, tc.name, st, tc.host)
			}
			t.Logf("%d super-segments read whole, %d octets", sc.supers.Load(), sc.wire.Load())
			if sc.supers.Load() == 0 {
				t.Error("no super-segment reached the stack whole: the kernel cut everything, or ReadSuper was not used")
			}
		})
	}
}
