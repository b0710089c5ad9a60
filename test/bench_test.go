package test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

// BenchmarkDaemonWrite: RDMA WRITEs of 1 MiB from an application on
// siwtun0's verbs socket to one on siwtun1's, through the two daemons and
// the namespace's kernel routing between their TUN devices, at MTU 1500
// and 9000. Like verbs' BenchmarkWriteVsTCP: a window of 64 requests, one
// in 16 signaled, and a Send behind the last Write so the clock stops when
// every byte is placed.
//
//	go test ./test -run XXX -bench BenchmarkDaemonWrite
func BenchmarkDaemonWrite(b *testing.B) {
	for _, mtu := range []int{1500, 9000} {
		b.Run(fmt.Sprintf("mtu%d", mtu), func(b *testing.B) {
			r := newTwoRNICs(b, mtu, strings.Fields(os.Getenv("SIWTUN_UP_FLAGS"))...)
			cli, srv := r.connect(b, 7174, 64)
			const size = 1 << 20
			b.Run("1MiB", func(b *testing.B) { benchDaemonWrite(b, cli, srv, size) })
		})
	}
}

func benchDaemonWrite(b *testing.B, cli, srv *end, size int) {
	src, sbuf := cli.mr(b, size, verbs.AccessLocalWrite)
	copy(sbuf, pattern(size, 5))
	dst, dbuf := srv.mr(b, size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	done, _ := srv.mr(b, 8, verbs.AccessLocalWrite)
	wr := verbs.SendWR{Opcode: verbs.WRWrite, SGL: []verbs.SGE{src.SGE(0, size)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}
	const window = 64
	wcs := make([]verbs.WorkCompletion, window)
	c := timeoutCtx(b, 10*time.Minute)
	b.SetBytes(int64(size))
	b.ResetTimer()
	outstanding := 0
	for i := 0; i < b.N; i++ {
		wr.ID = uint64(i)
		wr.Flags = 0
		if i%16 == 15 || i == b.N-1 {
			wr.Flags = verbs.FlagSignaled
		}
		for outstanding >= window-16 {
			n, err := cli.scq.Wait(c, wcs)
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
		if _, err := cli.qp.PostSend([]verbs.SendWR{wr}); err != nil {
			b.Fatal(err)
		}
		outstanding++
	}
	// A Send behind the Writes: when it arrives, every Write is placed.
	if _, err := srv.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{done.SGE(0, 8)}}}); err != nil {
		b.Fatal(err)
	}
	if _, err := cli.qp.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("done")}}); err != nil {
		b.Fatal(err)
	}
	if wc := srv.wait(b, srv.rcq); wc.Status != verbs.WCSuccess {
		b.Fatalf("final Send: %+v", wc)
	}
	b.StopTimer()
	b.ReportMetric(float64(size)*float64(b.N)/b.Elapsed().Seconds()/1e6, "MB/s")
	// Drain the client's completions up to the last Write for the next run.
	for last := false; !last; {
		n, err := cli.scq.Wait(c, wcs)
		if err != nil {
			b.Fatal(err)
		}
		for _, wc := range wcs[:n] {
			last = last || wc.ID == uint64(b.N-1)
		}
	}
	if dbuf[size-1] != sbuf[size-1] || dbuf[0] != sbuf[0] {
		b.Fatal("RDMA Write target differs")
	}
}
