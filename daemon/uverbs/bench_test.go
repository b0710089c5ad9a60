package uverbs

import (
	"context"
	"runtime"
	"testing"

	"github.com/siwtun/siwtun/verbs"
)

// BenchmarkPostPoll is the cost of one small RDMA Write: post it (inline,
// signaled) on a connected QP and poll until its completion arrives, with
// the in-process API (Local) and through the verbs socket (Socket), the
// same engine and peer behind both.
//
// Poll spins with runtime.Gosched between polls (a busy poller that leaves
// the engine's goroutines their CPU); Wait blocks on the notification.
func BenchmarkPostPollLocal(b *testing.B)  { benchPostPoll(b, false, false) }
func BenchmarkPostPollSocket(b *testing.B) { benchPostPoll(b, true, false) }
func BenchmarkPostWaitLocal(b *testing.B)  { benchPostPoll(b, false, true) }
func BenchmarkPostWaitSocket(b *testing.B) { benchPostPoll(b, true, true) }

func benchPostPoll(b *testing.B, socket, wait bool) {
	r := newRig(b)
	dev := r.local
	if socket {
		dev = r.dial()
	}
	cli := newEnd(b, dev, 64)
	srv := newEnd(b, r.peer, 64)
	connect(b, cli, srv)
	dst := srv.region(b, 4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	wr := []verbs.SendWR{{Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled | verbs.FlagInline,
		Inline: make([]byte, 32), RemoteAddr: dst.Addr(), RKey: dst.RKey()}}
	var wcs [1]verbs.WorkCompletion
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := cli.qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		for {
			var n int
			var err error
			if wait {
				n, err = cli.scq.Wait(ctx, wcs[:])
			} else {
				n, err = cli.scq.Poll(wcs[:])
			}
			if err != nil {
				b.Fatal(err)
			}
			if n == 1 {
				if wcs[0].Status != verbs.WCSuccess {
					b.Fatalf("completion %+v", wcs[0])
				}
				break
			}
			runtime.Gosched()
		}
	}
}
