package verbs_test

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/siwtun/siwtun/verbs"
)

// BenchmarkLatencyVsTCP measures round trips between the same two in-process
// stacks twice: as a Send/Receive ping-pong of size bytes (each side waits
// for its receive completion, then answers; ib_send_lat's pattern), and as a
// ping-pong of size-byte TCP writes and reads. One op is one round trip.
func BenchmarkLatencyVsTCP(b *testing.B) {
	for _, mtu := range []int{1500, 9000} {
		for _, size := range []int{4, 64 << 10} {
			name := fmt.Sprintf("mtu%d/%dB", mtu, size)
			b.Run(name+"/rdma-send", func(b *testing.B) { benchSendLat(b, mtu, size) })
			b.Run(name+"/tcp", func(b *testing.B) { benchTCPLat(b, mtu, size) })
		}
	}
}

func benchSendLat(b *testing.B, mtu, size int) {
	cli, srv := newPair(b, pairOpts{mtu: mtu, depth: 16})
	cbuf := cli.region(size, verbs.AccessLocalWrite)
	sbuf := srv.region(size, verbs.AccessLocalWrite)
	cwr := verbs.SendWR{Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{cbuf.mr.SGE(0, size)}}
	swr := verbs.SendWR{Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{sbuf.mr.SGE(0, size)}}
	if size <= 64 {
		cwr.SGL, cwr.Flags, cwr.Inline = nil, cwr.Flags|verbs.FlagInline, cbuf.buf()
		swr.SGL, swr.Flags, swr.Inline = nil, swr.Flags|verbs.FlagInline, sbuf.buf()
	}
	crecv := []verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{cbuf.mr.SGE(0, size)}}}
	srecv := []verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{sbuf.mr.SGE(0, size)}}}
	srv.recv(srecv...)
	cli.recv(crecv...)
	ctx := context.Background()
	done := make(chan error, 1)
	n := b.N
	// wait takes completions from cq until a receive arrives.
	wait := func(cq *verbs.CQ, wcs []verbs.WorkCompletion) error {
		for {
			k, err := cq.Wait(ctx, wcs)
			if err != nil {
				return err
			}
			for _, wc := range wcs[:k] {
				if wc.Status != verbs.WCSuccess {
					return fmt.Errorf("completion %+v", wc)
				}
				if wc.Opcode == verbs.WCRecv {
					return nil
				}
			}
		}
	}
	go func() {
		wcs := make([]verbs.WorkCompletion, 4)
		for i := 0; i < n; i++ {
			if err := wait(srv.rcq, wcs); err != nil {
				done <- err
				return
			}
			if _, err := srv.qp.PostRecv(srecv); err != nil {
				done <- err
				return
			}
			if _, err := srv.qp.PostSend([]verbs.SendWR{swr}); err != nil {
				done <- err
				return
			}
			for drained := false; !drained; { // the Send's completion
				k, err := srv.scq.Poll(wcs)
				if err != nil {
					done <- err
					return
				}
				drained = k == 0
			}
		}
		done <- nil
	}()
	wcs := make([]verbs.WorkCompletion, 4)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < n; i++ {
		if _, err := cli.qp.PostSend([]verbs.SendWR{cwr}); err != nil {
			b.Fatal(err)
		}
		if err := wait(cli.rcq, wcs); err != nil {
			b.Fatal(err)
		}
		if _, err := cli.qp.PostRecv(crecv); err != nil {
			b.Fatal(err)
		}
		for { // drain the Send's completion
			k, err := cli.scq.Poll(wcs)
			if err != nil {
				b.Fatal(err)
			}
			if k == 0 {
				break
			}
		}
	}
	b.StopTimer()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n)/1e3, "µs/rtt")
}

func benchTCPLat(b *testing.B, mtu, size int) {
	c, sc, _ := tcpPair(b, mtu)
	n := b.N
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for i := 0; i < n; i++ {
			if _, err := io.ReadFull(sc, buf); err != nil {
				done <- err
				return
			}
			if _, err := sc.Write(buf); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	buf := make([]byte, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < n; i++ {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n)/1e3, "µs/rtt")
}
