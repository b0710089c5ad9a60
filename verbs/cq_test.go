package verbs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

// notified reports whether a notification is pending, and consumes it.
// Push notifies synchronously, so no waiting is needed.
func notified(cq *verbs.CQ) bool {
	select {
	case <-cq.Notify():
		return true
	default:
		return false
	}
}

func newCQ(t testing.TB, depth int) *verbs.CQ {
	t.Helper()
	s := loneSide(t, 1)
	cq, err := s.dev.CreateCQ(depth)
	if err != nil {
		t.Fatal(err)
	}
	return cq
}

func TestCreateCQDepth(t *testing.T) {
	s := loneSide(t, 1)
	tests := []struct {
		name  string
		depth int
		ok    bool
	}{
		{"zero", 0, false},
		{"negative", -1, false},
		{"one", 1, true},
		{"typical", 4096, true},
		{"above-max", verbs.MaxCQE + 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cq, err := s.dev.CreateCQ(tt.depth)
			if (err == nil) != tt.ok {
				t.Fatalf("CreateCQ(%d) = %v, want ok=%v", tt.depth, err, tt.ok)
			}
			if tt.ok && cq.Depth() != tt.depth {
				t.Fatalf("depth %d, want %d", cq.Depth(), tt.depth)
			}
		})
	}
	s.dev.Close()
	if _, err := s.dev.CreateCQ(1); !errors.Is(err, verbs.ErrDestroyed) {
		t.Fatalf("CreateCQ on a closed device = %v, want ErrDestroyed", err)
	}
}

// TestCQPollOrder: Poll fills the caller's slice oldest first, in as many
// calls as the slice size takes, across the ring's wrap.
func TestCQPollOrder(t *testing.T) {
	tests := []struct {
		name   string
		depth  int
		rounds int // push/poll rounds, to wrap the ring
		push   int // per round
		slice  int
	}{
		{"one-by-one", 4, 1, 4, 1},
		{"all-at-once", 8, 1, 8, 8},
		{"bigger-slice", 8, 1, 5, 16},
		{"odd-slices-wrapping", 5, 7, 4, 3},
		{"empty-slice", 2, 1, 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cq := newCQ(t, tt.depth)
			id := uint64(0)
			next := uint64(0)
			buf := make([]verbs.WorkCompletion, tt.slice)
			for r := 0; r < tt.rounds; r++ {
				for i := 0; i < tt.push; i++ {
					id++
					cq.Push(&verbs.WorkCompletion{ID: id, Opcode: verbs.WCRecv, ByteLen: uint32(id)}, false)
				}
				if tt.slice == 0 {
					if n, err := cq.Poll(buf); n != 0 || err != nil {
						t.Fatalf("Poll into an empty slice = %d, %v", n, err)
					}
					return
				}
				for next < id {
					n, err := cq.Poll(buf)
					if err != nil || n == 0 || n > len(buf) {
						t.Fatalf("Poll = %d, %v with %d queued", n, err, id-next)
					}
					if want := min(len(buf), int(id-next)); n != want {
						t.Fatalf("Poll = %d, want %d", n, want)
					}
					for _, wc := range buf[:n] {
						next++
						if wc.ID != next || wc.ByteLen != uint32(next) {
							t.Fatalf("completion %d polled, want %d", wc.ID, next)
						}
					}
				}
				if n, err := cq.Poll(buf); n != 0 || err != nil {
					t.Fatalf("Poll of an empty queue = %d, %v", n, err)
				}
			}
		})
	}
}

// TestCQNotify: ReqNotify arms for exactly one notification: the next
// completion, or with solicitedOnly the next solicited or error completion.
func TestCQNotify(t *testing.T) {
	type step struct {
		arm          int // 0: push; 1: ReqNotify(false); 2: ReqNotify(true)
		status       verbs.WCStatus
		solicited    bool
		wantNotified bool
	}
	push := func(st verbs.WCStatus, sol, want bool) step {
		return step{status: st, solicited: sol, wantNotified: want}
	}
	armAny := step{arm: 1}
	armSol := step{arm: 2}
	tests := []struct {
		name  string
		steps []step
	}{
		{"unarmed", []step{push(verbs.WCSuccess, false, false), push(verbs.WCSuccess, true, false), push(verbs.WCFlushErr, false, false)}},
		{"next-once", []step{armAny, push(verbs.WCSuccess, false, true), push(verbs.WCSuccess, false, false), push(verbs.WCSuccess, true, false)}},
		{"rearm", []step{armAny, push(verbs.WCSuccess, false, true), armAny, push(verbs.WCSuccess, false, true), push(verbs.WCSuccess, false, false)}},
		{"queued-before-arm", []step{push(verbs.WCSuccess, false, false), armAny, push(verbs.WCSuccess, false, true)}},
		{"solicited-skips-plain", []step{armSol, push(verbs.WCSuccess, false, false), push(verbs.WCSuccess, false, false), push(verbs.WCSuccess, true, true), push(verbs.WCSuccess, true, false)}},
		{"solicited-error", []step{armSol, push(verbs.WCSuccess, false, false), push(verbs.WCRemAccessErr, false, true), push(verbs.WCFlushErr, false, false)}},
		{"solicited-flush", []step{armSol, push(verbs.WCFlushErr, false, true)}},
		{"any-after-solicited", []step{armSol, armAny, push(verbs.WCSuccess, false, true)}},
		{"solicited-after-any", []step{armAny, armSol, push(verbs.WCSuccess, false, false), push(verbs.WCSuccess, true, true)}},
		{"double-arm-one-notification", []step{armAny, armAny, push(verbs.WCSuccess, false, true), push(verbs.WCSuccess, false, false)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cq := newCQ(t, 16)
			for i, s := range tt.steps {
				switch s.arm {
				case 1, 2:
					if err := cq.ReqNotify(s.arm == 2); err != nil {
						t.Fatal(err)
					}
					continue
				}
				cq.Push(&verbs.WorkCompletion{ID: uint64(i), Status: s.status}, s.solicited)
				if got := notified(cq); got != s.wantNotified {
					t.Fatalf("step %d (status %v solicited %v): notified %v, want %v", i, s.status, s.solicited, got, s.wantNotified)
				}
			}
		})
	}
}

// TestCQOverflow: completions beyond the depth are lost; Poll returns those
// that fitted, then ErrCQOverflow, and keeps returning it.
func TestCQOverflow(t *testing.T) {
	tests := []struct {
		name  string
		depth int
		push  int
		slice int
	}{
		{"depth2-push3", 2, 3, 8},
		{"depth2-push3-one-by-one", 2, 3, 1},
		{"depth1-push5", 1, 5, 4},
		{"depth4-push100", 4, 100, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cq := newCQ(t, tt.depth)
			for i := 0; i < tt.push; i++ {
				cq.Push(&verbs.WorkCompletion{ID: uint64(i)}, false)
			}
			buf := make([]verbs.WorkCompletion, tt.slice)
			var got []uint64
			for len(got) < tt.depth {
				n, err := cq.Poll(buf)
				if err != nil || n == 0 {
					t.Fatalf("Poll = %d, %v after %d of the %d that fitted", n, err, len(got), tt.depth)
				}
				for _, wc := range buf[:n] {
					got = append(got, wc.ID)
				}
			}
			for i, id := range got {
				if id != uint64(i) {
					t.Fatalf("polled %v, want the first %d", got, tt.depth)
				}
			}
			for i := 0; i < 2; i++ {
				if n, err := cq.Poll(buf); n != 0 || !errors.Is(err, verbs.ErrCQOverflow) {
					t.Fatalf("Poll after the overflow = %d, %v; want ErrCQOverflow", n, err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			if _, err := cq.Wait(ctx, buf); !errors.Is(err, verbs.ErrCQOverflow) {
				t.Fatalf("Wait after the overflow = %v; want ErrCQOverflow", err)
			}
		})
	}
}

// TestCQDestroy: a destroyed CQ drops completions and refuses every call;
// a Wait in progress returns.
func TestCQDestroy(t *testing.T) {
	tests := []struct {
		name string
		call func(cq *verbs.CQ) error
	}{
		{"poll", func(cq *verbs.CQ) error {
			_, err := cq.Poll(make([]verbs.WorkCompletion, 1))
			return err
		}},
		{"req-notify", func(cq *verbs.CQ) error { return cq.ReqNotify(false) }},
		{"wait", func(cq *verbs.CQ) error {
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			_, err := cq.Wait(ctx, make([]verbs.WorkCompletion, 1))
			return err
		}},
		{"destroy-again", func(cq *verbs.CQ) error { return cq.Destroy() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cq := newCQ(t, 4)
			cq.Push(&verbs.WorkCompletion{ID: 1}, false)
			if err := cq.Destroy(); err != nil {
				t.Fatal(err)
			}
			cq.Push(&verbs.WorkCompletion{ID: 2}, true) // dropped, not an overflow
			if err := tt.call(cq); !errors.Is(err, verbs.ErrDestroyed) {
				t.Fatalf("%s on a destroyed CQ = %v, want ErrDestroyed", tt.name, err)
			}
		})
	}
	t.Run("wakes-waiter", func(t *testing.T) {
		cq := newCQ(t, 4)
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		done := make(chan error, 1)
		go func() {
			_, err := cq.Wait(ctx, make([]verbs.WorkCompletion, 1))
			done <- err
		}()
		if err := cq.Destroy(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, verbs.ErrDestroyed) {
			t.Fatalf("Wait across Destroy = %v, want ErrDestroyed", err)
		}
	})
}

// TestCQZeroAllocs: the completion path of the CQ allocates nothing.
func TestCQZeroAllocs(t *testing.T) {
	cq := newCQ(t, 64)
	wc := verbs.WorkCompletion{ID: 1, Opcode: verbs.WCRecv}
	buf := make([]verbs.WorkCompletion, 8)
	allocs := testing.AllocsPerRun(1000, func() {
		cq.Push(&wc, false)
		cq.Push(&wc, true)
		cq.ReqNotify(false)
		cq.Push(&wc, false)
		notified(cq)
		if n, err := cq.Poll(buf); n != 3 || err != nil {
			panic("poll")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per push/poll round, want 0", allocs)
	}
}

// TestSolicitedNotifyEndToEnd: a receive CQ armed for solicited events is
// not woken by a plain Send, is woken by a Send with Solicited Event, only
// once, and by an error completion.
func TestSolicitedNotifyEndToEnd(t *testing.T) {
	cli, srv := newPair(t, pairOpts{depth: 16})
	rb := srv.region(4*64, verbs.AccessLocalWrite)
	for i := 0; i < 3; i++ {
		srv.recv(verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{rb.mr.SGE(i*64, 64)}})
	}
	srv.recv(verbs.RecvWR{ID: 3, SGL: []verbs.SGE{rb.mr.SGE(3*64, 4)}}) // too small for the last Send
	remote := srv.region(8, verbs.AccessRemoteRead)
	sink := cli.region(8, verbs.AccessLocalWrite)
	read := verbs.SendWR{ID: 100, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{sink.mr.SGE(0, 8)}, RemoteAddr: remote.mr.Addr(), RKey: remote.mr.RKey()}
	waitNotify := func(what string) {
		t.Helper()
		select {
		case <-srv.rcq.Notify():
		case <-time.After(testTimeout):
			t.Fatalf("no notification for %s", what)
		}
	}
	var wc [2]verbs.WorkCompletion
	pollOne := func(id uint64, st verbs.WCStatus) {
		t.Helper()
		n, err := srv.rcq.Poll(wc[:])
		if n != 1 || err != nil || wc[0].ID != id || wc[0].Status != st {
			t.Fatalf("Poll = %d, %v, %+v; want receive %d %v", n, err, wc[0], id, st)
		}
	}

	tests := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"plain-send-no-notification", func(t *testing.T) {
			if err := srv.rcq.ReqNotify(true); err != nil {
				t.Fatal(err)
			}
			// The Read behind the Send is answered after the peer handled
			// the Send: when it completes, the receive completion is queued.
			cli.post(verbs.SendWR{ID: 1, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("plain")}, read)
			wantWC(t, poll(t, cli.scq, 1)[0], 100, verbs.WCRead, verbs.WCSuccess, 8)
			if notified(srv.rcq) {
				t.Fatal("plain Send notified a solicited-only CQ")
			}
			pollOne(0, verbs.WCSuccess)
		}},
		{"solicited-send-notifies-once", func(t *testing.T) {
			cli.post(verbs.SendWR{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagInline | verbs.FlagSolicited, Inline: []byte("solicited")})
			waitNotify("a Send with Solicited Event")
			pollOne(1, verbs.WCSuccess)
			// Not re-armed: the next solicited Send is silent.
			cli.post(verbs.SendWR{ID: 3, Opcode: verbs.WRSend, Flags: verbs.FlagInline | verbs.FlagSolicited, Inline: []byte("again")}, read)
			wantWC(t, poll(t, cli.scq, 1)[0], 100, verbs.WCRead, verbs.WCSuccess, 8)
			if notified(srv.rcq) {
				t.Fatal("second solicited Send notified without re-arming")
			}
			pollOne(2, verbs.WCSuccess)
		}},
		{"error-notifies", func(t *testing.T) {
			if err := srv.rcq.ReqNotify(true); err != nil {
				t.Fatal(err)
			}
			cli.post(verbs.SendWR{ID: 4, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("too long for 4 bytes")})
			waitNotify("an error completion")
			pollOne(3, verbs.WCLocLenErr)
		}},
	}
	for _, tt := range tests {
		if !t.Run(tt.name, tt.run) {
			return
		}
	}
}
