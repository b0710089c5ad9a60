package verbs_test

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// BenchmarkWriteVsTCP moves the same bytes between the same two in-process
// stacks twice: as RDMA WRITEs of size bytes (placed by the engine inside
// the TCP receive path), and as plain TCP writes of size bytes read by a
// copying socket reader. MB/s of both are reported side by side.
func BenchmarkWriteVsTCP(b *testing.B) {
	for _, mtu := range []int{1500, 9000} {
		for _, size := range []int{64 << 10, 1 << 20} {
			name := fmt.Sprintf("mtu%d/%dKiB", mtu, size>>10)
			b.Run(name+"/rdma-write", func(b *testing.B) { benchWrite(b, mtu, size, true) })
			b.Run(name+"/rdma-write-nocrc", func(b *testing.B) { benchWrite(b, mtu, size, false) })
			b.Run(name+"/rdma-write-batch64", func(b *testing.B) { benchWriteOpts(b, mtu, size, true, 64) })
			b.Run(name+"/tcp", func(b *testing.B) { benchTCP(b, mtu, size) })
		}
	}
}

func benchWrite(b *testing.B, mtu, size int, crc bool) { benchWriteOpts(b, mtu, size, crc, 0) }

// benchWriteOpts is benchWrite with FPDUsPerWrite set on the sender.
func benchWriteOpts(b *testing.B, mtu, size int, crc bool, perWrite int) {
	cli, srv := newPair(b, pairOpts{mtu: mtu, depth: 256,
		cli: func(c *offload.Config) { c.CRC, c.FPDUsPerWrite = crc, perWrite },
		srv: func(c *offload.Config) { c.CRC = crc }})
	src := cli.region(size, verbs.AccessLocalWrite)
	fill(src.buf(), 1)
	dst := srv.region(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	done := srv.region(8, verbs.AccessLocalWrite)
	wrs := []verbs.SendWR{{Opcode: verbs.WRWrite, SGL: []verbs.SGE{src.mr.SGE(0, size)}, RemoteAddr: dst.mr.Addr(), RKey: dst.mr.RKey()}}
	wr := &wrs[0]
	const window = 64
	wcs := make([]verbs.WorkCompletion, window)
	ctx := context.Background()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	before, cpu0 := cli.link.Stats(), cpuTime()
	outstanding := 0
	for i := 0; i < b.N; i++ {
		wr.ID = uint64(i)
		wr.Flags = 0
		if i%16 == 15 || i == b.N-1 {
			wr.Flags = verbs.FlagSignaled
		}
		for outstanding >= window-16 {
			n, err := cli.scq.Wait(ctx, wcs)
			if err != nil {
				b.Fatal(err)
			}
			for _, wc := range wcs[:n] {
				if wc.Status != verbs.WCSuccess {
					b.Fatalf("completion %+v", wc)
				}
				outstanding -= 16
			}
		}
		if _, err := cli.qp.PostSend(wrs); err != nil {
			b.Fatal(err)
		}
		outstanding++
	}
	// A Send after the Writes: when it arrives, every Write is placed.
	srv.recv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{done.mr.SGE(0, 8)}})
	cli.post(verbs.SendWR{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("done")})
	poll(b, srv.rcq, 1)
	b.StopTimer()
	b.ReportMetric(float64(size)*float64(b.N)/b.Elapsed().Seconds()/1e6, "MB/s")
	reportPackets(b, size, before, cli.link.Stats(), cpuTime()-cpu0)
}

func benchTCP(b *testing.B, mtu, size int) {
	c, sc, la := tcpPair(b, mtu)
	got := make(chan error, 1)
	total := int64(size) * int64(b.N)
	go func() {
		buf := make([]byte, size)
		var n int64
		for n < total {
			k, err := sc.Read(buf)
			n += int64(k)
			if err != nil {
				got <- err
				return
			}
		}
		got <- nil
	}()
	src := make([]byte, size)
	fill(src, 1)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	before, cpu0 := la.Stats(), cpuTime()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(src); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-got; err != nil && err != io.EOF {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64(total)/b.Elapsed().Seconds()/1e6, "MB/s")
	reportPackets(b, size, before, la.Stats(), cpuTime()-cpu0)
}

// reportPackets reports the packets each direction of the sender's link
// carried per operation (data segments out, ACKs back) and the process's
// CPU time per byte moved, both ends together: on a busy machine that is a
// steadier measure of the work than the rate.
func reportPackets(b *testing.B, size int, before, after netstack.LinkStats, cpu time.Duration) {
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/float64(size), "cpu-ns/B")
	b.ReportMetric(float64(after.Tx.Sent-before.Tx.Sent)/float64(b.N), "pkts-out/op")
	b.ReportMetric(float64(after.Rx.Sent-before.Rx.Sent)/float64(b.N), "pkts-back/op")
}

// cpuTime is the process's user plus system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tcpPair connects a TCP client on one stack to a server on another, the
// two joined by an in-memory link of the given MTU, and returns both ends
// and the client's link. Everything is closed when the benchmark ends.
func tcpPair(b *testing.B, mtu int) (cli, srv *netstack.Conn, link *netstack.Link) {
	la, lb := netstack.Pipe(mtu, netstack.Impairments{})
	cs := newStack(b, la, cliAddr, mtu)
	ss := newStack(b, lb, srvAddr, mtu)
	addr := netip.AddrPortFrom(srvAddr.Addr(), 5001)
	l, err := ss.Listen(addr)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	cli, err = cs.Dial(ctx, netip.Addr{}, addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Close() })
	if srv, err = l.Accept(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Close() })
	return cli, srv, la
}
