package verbs_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/rnic"
	"github.com/siwtun/siwtun/verbs"
	"github.com/siwtun/siwtun/verbs/uverbs"
)

// The examples run two in-process RNICs joined by an in-memory link. A
// program using a daemon's RNIC (siwtun up) opens it with
// verbs.Dial("siwtun0") instead and uses the same API.

// newRNIC starts an RNIC named name with address addr on link: its own
// TCP/IP stack, the iWARP engine and the verbs device in front of it.
func newRNIC(link *netstack.Link, name, addr string) *rnic.RNIC {
	r, err := rnic.New(link, rnic.Config{
		Stack:  netstack.Options{Addrs: []netip.Prefix{netip.MustParsePrefix(addr)}, MTU: 1500},
		Engine: offload.DefaultConfig(name),
	})
	if err != nil {
		log.Fatal(err)
	}
	return r
}

// endpoint is one side of a connection: on dev a PD, one CQ for both
// work queues, a QP and 4 KiB of registered memory.
type endpoint struct {
	dev *verbs.Device
	pd  *verbs.PD
	cq  *verbs.CQ
	qp  *verbs.QP
	mr  *verbs.MR
}

func newEndpoint(dev *verbs.Device) *endpoint {
	pd, err := dev.AllocPD()
	if err != nil {
		log.Fatal(err)
	}
	cq, err := dev.CreateCQ(64)
	if err != nil {
		log.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		log.Fatal(err)
	}
	buf, err := dev.AllocBuffer(4096) // memory RegMR accepts on every kind of device
	if err != nil {
		log.Fatal(err)
	}
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	if err != nil {
		log.Fatal(err)
	}
	return &endpoint{dev: dev, pd: pd, cq: cq, qp: qp, mr: mr}
}

// startPair starts two RNICs on one link, siwtun0 at 198.18.0.1 and siwtun1
// at 198.18.0.2, with an endpoint on each. done closes both RNICs.
func startPair() (a, b *endpoint, done func()) {
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	ra, rb := newRNIC(la, "siwtun0", "198.18.0.1/24"), newRNIC(lb, "siwtun1", "198.18.0.2/24")
	return newEndpoint(ra.Device), newEndpoint(rb.Device), func() { ra.Close(); rb.Close() }
}

// connectPair starts two RNICs and connects a QP of each: b listens and
// accepts (rdma_listen, rdma_accept), a connects (rdma_connect), as
// ExampleDevice_Listen shows step by step. done closes both RNICs.
func connectPair() (a, b *endpoint, done func()) {
	a, b, done = startPair()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	addr := netip.MustParseAddrPort("198.18.0.2:7174")
	l, err := b.dev.Listen(addr, 1)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err == nil {
			err = req.Accept(b.qp, verbs.ConnParam{})
		}
		accepted <- err
	}()
	if err := a.qp.Connect(ctx, addr, verbs.ConnParam{}); err != nil {
		log.Fatal(err)
	}
	if err := <-accepted; err != nil {
		log.Fatal(err)
	}
	return a, b, done
}

// wait blocks until cq has a completion and returns it.
func wait(cq *verbs.CQ) verbs.WorkCompletion {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wc [1]verbs.WorkCompletion
	if _, err := cq.Wait(ctx, wc[:]); err != nil {
		log.Fatal(err)
	}
	return wc[0]
}

// post posts one send work request.
func post(qp *verbs.QP, wr verbs.SendWR) {
	if _, err := qp.PostSend([]verbs.SendWR{wr}); err != nil {
		log.Fatal(err)
	}
}

// A Send, an RDMA Write and an RDMA Read between two connected QPs.
func Example() {
	a, b, done := connectPair()
	defer done()

	// Send: the receiver posts a receive first; the Send fills it.
	if _, err := b.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{b.mr.SGE(0, 64)}}}); err != nil {
		log.Fatal(err)
	}
	copy(a.mr.Bytes(), "hello")
	post(a.qp, verbs.SendWR{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.mr.SGE(0, 5)}})
	wc := wait(a.cq)
	fmt.Println("a:", wc.Opcode, wc.Status)
	wc = wait(b.cq)
	fmt.Printf("b: %v %d bytes %q\n", wc.Opcode, wc.ByteLen, b.mr.Bytes()[:wc.ByteLen])

	// RDMA Write: a places bytes in b's memory, named by b's address and
	// rkey (which b would send a in a real program); b's CPU is not told.
	copy(a.mr.Bytes()[100:], "written")
	post(a.qp, verbs.SendWR{ID: 3, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{a.mr.SGE(100, 7)}, RemoteAddr: b.mr.Addr() + 100, RKey: b.mr.RKey()})
	wc = wait(a.cq)
	fmt.Println("a:", wc.Opcode, wc.Status)

	// RDMA Read: a reads those bytes back into its own memory. RDMAP
	// keeps order, so the Read sees the Write before it.
	post(a.qp, verbs.SendWR{ID: 4, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{a.mr.SGE(200, 7)}, RemoteAddr: b.mr.Addr() + 100, RKey: b.mr.RKey()})
	wc = wait(a.cq)
	fmt.Printf("a: %v %v %q\n", wc.Opcode, wc.Status, a.mr.Bytes()[200:207])
	// Output:
	// a: SEND success
	// b: RECV 5 bytes "hello"
	// a: RDMA_WRITE success
	// a: RDMA_READ success "written"
}

// Connect two queue pairs: the server listens, takes the request and
// accepts it into its QP (rdma_listen, rdma_get_request, rdma_accept); the
// client connects (rdma_connect), here from a goroutine, in a real program
// from another process. Each side's private data reaches the other.
func ExampleDevice_Listen() {
	client, server, done := startPair()
	defer done()
	l, err := server.dev.Listen(netip.MustParseAddrPort("198.18.0.2:7174"), 1)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	connected := make(chan error, 1)
	go func() {
		connected <- client.qp.Connect(ctx, l.Addr(), verbs.ConnParam{PrivateData: []byte("hello from siwtun0")})
	}()

	req, err := l.Accept(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("server: request from %v: %q\n", req.Remote.Addr(), req.PrivateData)
	if err := req.Accept(server.qp, verbs.ConnParam{PrivateData: []byte("welcome")}); err != nil {
		log.Fatal(err)
	}
	if err := <-connected; err != nil {
		log.Fatal(err)
	}
	// The client's EventEstablished carries the server's private data.
	for e := range client.qp.Events() {
		if e.Type == verbs.EventEstablished {
			fmt.Printf("client: %v %q, %v\n", e.Type, e.PrivateData, client.qp.State())
			break
		}
	}
	// The client offered peer-to-peer mode (RFC 6581): the server's QP
	// enters RTS when the client's RTR has arrived.
	for e := range server.qp.Events() {
		if e.Type == verbs.EventEstablished {
			fmt.Printf("server: %v, %v\n", e.Type, server.qp.State())
			break
		}
	}
	// Output:
	// server: request from 198.18.0.1: "hello from siwtun0"
	// client: ESTABLISHED "welcome", RTS
	// server: ESTABLISHED, RTS
}

// Open an RNIC's verbs device and register memory with it.
func ExampleDevice_AllocBuffer() {
	link, _ := netstack.Pipe(1500, netstack.Impairments{})
	r := newRNIC(link, "siwtun0", "198.18.0.1/24")
	defer r.Close()
	dev := r.Device // or verbs.Dial("siwtun0") for a daemon's RNIC

	pd, err := dev.AllocPD()
	if err != nil {
		log.Fatal(err)
	}
	buf, err := dev.AllocBuffer(1 << 16)
	if err != nil {
		log.Fatal(err)
	}
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Dereg()
	attr := dev.Query()
	fmt.Printf("%s: %d SGEs per request, %d inline bytes\n", dev.Name(), attr.MaxSGE, attr.MaxInline)
	// An iWARP region has one STag: the lkey of local work requests and the
	// rkey a peer names in RDMA Reads and Writes.
	fmt.Printf("registered %d bytes, lkey == rkey: %v\n", mr.Len(), mr.LKey() == mr.RKey())
	// Output:
	// siwtun0: 6 SGEs per request, 256 inline bytes
	// registered 65536 bytes, lkey == rkey: true
}

// Open a device a daemon serves on its verbs socket. Here the daemon's
// side (what siwtun up does) runs in the same process; an application
// calls only verbs.Dial("siwtun0"), or DialPath with the socket's path.
func ExampleDialPath() {
	link, _ := netstack.Pipe(1500, netstack.Impairments{})
	r := newRNIC(link, "siwtun0", "198.18.0.1/24")
	defer r.Close()
	dir, err := os.MkdirTemp("", "siwtun-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "siwtun0.sock")
	l, err := uverbs.Listen(path, -1)
	if err != nil {
		log.Fatal(err)
	}
	srv, err := uverbs.NewServer(r.Device, nil)
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Close()

	dev, err := verbs.DialPath(path)
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Close()
	pd, err := dev.AllocPD()
	if err != nil {
		log.Fatal(err)
	}
	buf, err := dev.AllocBuffer(4096) // shared with the daemon, which places data in it
	if err != nil {
		log.Fatal(err)
	}
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s over the verbs socket (remote %v): registered %d bytes\n", dev.Name(), dev.Remote(), mr.Len())
	// Output:
	// siwtun0 over the verbs socket (remote true): registered 4096 bytes
}

// Poll completions without blocking (ibv_poll_cq): the busy loop of a
// latency-bound program. CQ.Wait sleeps instead until one arrives.
func ExampleCQ_Poll() {
	a, b, done := connectPair()
	defer done()
	if _, err := b.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{b.mr.SGE(0, 64)}}}); err != nil {
		log.Fatal(err)
	}
	post(a.qp, verbs.SendWR{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("ping")})

	wcs := make([]verbs.WorkCompletion, 8) // reused: polling does not allocate
	for {
		n, err := b.cq.Poll(wcs)
		if err != nil {
			log.Fatal(err)
		}
		if n > 0 {
			fmt.Printf("%d completion: id %d %v %q\n", n, wcs[0].ID, wcs[0].Status, b.mr.Bytes()[:wcs[0].ByteLen])
			break
		}
	}
	// Output:
	// 1 completion: id 1 success "ping"
}

// A failed work request is a completion with an error status, not a Go
// error: an RDMA Read from an rkey the peer never gave completes with
// WCRemAccessErr. The peer ended the connection with a Terminate, which
// the QP reports as an event; what was still queued is flushed. (An RDMA
// Write has no response: one to a bad rkey completes with WCSuccess, and
// only the Terminate that follows tells.)
func ExampleQP_PostSend_remoteAccessError() {
	a, b, done := connectPair()
	defer done()
	post(a.qp, verbs.SendWR{ID: 7, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{a.mr.SGE(0, 16)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey() + 1})
	wc := wait(a.cq)
	fmt.Printf("id %d: %v %v (%v)\n", wc.ID, wc.Opcode, wc.Status, wc.Status == verbs.WCRemAccessErr)
	for e := range a.qp.Events() {
		if e.Type == verbs.EventTerminateReceived {
			fmt.Println(e.Type, e.Code)
			break
		}
	}
	// Output:
	// id 7: RDMA_READ remote access error (true)
	// TERMINATE_RECEIVED RDMAP/remote-protection/invalid STag (0x00)
}
