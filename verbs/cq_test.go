package verbs

import (
	"context"
	"errors"
	"testing"
	"time"
)

// notified reports whether a notification is pending, and consumes it.
// Push notifies synchronously, so no waiting is needed.
func notified(cq *CQ) bool {
	select {
	case <-cq.Notify():
		return true
	default:
		return false
	}
}

func newCQ(t testing.TB, depth int) *CQ {
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
		{"above-max", MaxCQE + 1, false},
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
	if _, err := s.dev.CreateCQ(1); !errors.Is(err, ErrDestroyed) {
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
			buf := make([]WorkCompletion, tt.slice)
			for r := 0; r < tt.rounds; r++ {
				for i := 0; i < tt.push; i++ {
					id++
					cq.Push(&WorkCompletion{ID: id, Opcode: WCRecv, ByteLen: uint32(id)}, false)
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
		status       WCStatus
		solicited    bool
		wantNotified bool
	}
	push := func(st WCStatus, sol, want bool) step {
		return step{status: st, solicited: sol, wantNotified: want}
	}
	armAny := step{arm: 1}
	armSol := step{arm: 2}
	tests := []struct {
		name  string
		steps []step
	}{
		{"unarmed", []step{push(WCSuccess, false, false), push(WCSuccess, true, false), push(WCFlushErr, false, false)}},
		{"next-once", []step{armAny, push(WCSuccess, false, true), push(WCSuccess, false, false), push(WCSuccess, true, false)}},
		{"rearm", []step{armAny, push(WCSuccess, false, true), armAny, push(WCSuccess, false, true), push(WCSuccess, false, false)}},
		{"queued-before-arm", []step{push(WCSuccess, false, false), armAny, push(WCSuccess, false, true)}},
		{"solicited-skips-plain", []step{armSol, push(WCSuccess, false, false), push(WCSuccess, false, false), push(WCSuccess, true, true), push(WCSuccess, true, false)}},
		{"solicited-error", []step{armSol, push(WCSuccess, false, false), push(WCRemAccessErr, false, true), push(WCFlushErr, false, false)}},
		{"solicited-flush", []step{armSol, push(WCFlushErr, false, true)}},
		{"any-after-solicited", []step{armSol, armAny, push(WCSuccess, false, true)}},
		{"solicited-after-any", []step{armAny, armSol, push(WCSuccess, false, false), push(WCSuccess, true, true)}},
		{"double-arm-one-notification", []step{armAny, armAny, push(WCSuccess, false, true), push(WCSuccess, false, false)}},
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
				cq.Push(&WorkCompletion{ID: uint64(i), Status: s.status}, s.solicited)
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
				cq.Push(&WorkCompletion{ID: uint64(i)}, false)
			}
			buf := make([]WorkCompletion, tt.slice)
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
				if n, err := cq.Poll(buf); n != 0 || !errors.Is(err, ErrCQOverflow) {
					t.Fatalf("Poll after the overflow = %d, %v; want ErrCQOverflow", n, err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			if _, err := cq.Wait(ctx, buf); !errors.Is(err, ErrCQOverflow) {
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
		call func(cq *CQ) error
	}{
		{"poll", func(cq *CQ) error {
			_, err := cq.Poll(make([]WorkCompletion, 1))
			return err
		}},
		{"req-notify", func(cq *CQ) error { return cq.ReqNotify(false) }},
		{"wait", func(cq *CQ) error {
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			_, err := cq.Wait(ctx, make([]WorkCompletion, 1))
			return err
		}},
		{"destroy-again", func(cq *CQ) error { return cq.Destroy() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cq := newCQ(t, 4)
			cq.Push(&WorkCompletion{ID: 1}, false)
			if err := cq.Destroy(); err != nil {
				t.Fatal(err)
			}
			cq.Push(&WorkCompletion{ID: 2}, true) // dropped, not an overflow
			if err := tt.call(cq); !errors.Is(err, ErrDestroyed) {
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
			_, err := cq.Wait(ctx, make([]WorkCompletion, 1))
			done <- err
		}()
		if err := cq.Destroy(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, ErrDestroyed) {
			t.Fatalf("Wait across Destroy = %v, want ErrDestroyed", err)
		}
	})
}

// TestCQZeroAllocs: the completion path of the CQ allocates nothing.
func TestCQZeroAllocs(t *testing.T) {
	cq := newCQ(t, 64)
	wc := WorkCompletion{ID: 1, Opcode: WCRecv}
	buf := make([]WorkCompletion, 8)
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
	rb := srv.region(4*64, AccessLocalWrite)
	for i := 0; i < 3; i++ {
		srv.recv(RecvWR{ID: uint64(i), SGL: []SGE{rb.mr.SGE(i*64, 64)}})
	}
	srv.recv(RecvWR{ID: 3, SGL: []SGE{rb.mr.SGE(3*64, 4)}}) // too small for the last Send
	remote := srv.region(8, AccessRemoteRead)
	sink := cli.region(8, AccessLocalWrite)
	read := SendWR{ID: 100, Opcode: WRRead, Flags: FlagSignaled, SGL: []SGE{sink.mr.SGE(0, 8)}, RemoteAddr: remote.mr.Addr(), RKey: remote.mr.RKey()}
	waitNotify := func(what string) {
		t.Helper()
		select {
		case <-srv.rcq.Notify():
		case <-time.After(testTimeout):
			t.Fatalf("no notification for %s", what)
		}
	}
	var wc [2]WorkCompletion
	pollOne := func(id uint64, st WCStatus) {
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
			cli.post(SendWR{ID: 1, Opcode: WRSend, Flags: FlagInline, Inline: []byte("plain")}, read)
			wantWC(t, poll(t, cli.scq, 1)[0], 100, WCRead, WCSuccess, 8)
			if notified(srv.rcq) {
				t.Fatal("plain Send notified a solicited-only CQ")
			}
			pollOne(0, WCSuccess)
		}},
		{"solicited-send-notifies-once", func(t *testing.T) {
			cli.post(SendWR{ID: 2, Opcode: WRSend, Flags: FlagInline | FlagSolicited, Inline: []byte("solicited")})
			waitNotify("a Send with Solicited Event")
			pollOne(1, WCSuccess)
			// Not re-armed: the next solicited Send is silent.
			cli.post(SendWR{ID: 3, Opcode: WRSend, Flags: FlagInline | FlagSolicited, Inline: []byte("again")}, read)
			wantWC(t, poll(t, cli.scq, 1)[0], 100, WCRead, WCSuccess, 8)
			if notified(srv.rcq) {
				t.Fatal("second solicited Send notified without re-arming")
			}
			pollOne(2, WCSuccess)
		}},
		{"error-notifies", func(t *testing.T) {
			if err := srv.rcq.ReqNotify(true); err != nil {
				t.Fatal(err)
			}
			cli.post(SendWR{ID: 4, Opcode: WRSend, Flags: FlagInline, Inline: []byte("too long for 4 bytes")})
			waitNotify("an error completion")
			pollOne(3, WCLocLenErr)
		}},
	}
	for _, tt := range tests {
		if !t.Run(tt.name, tt.run) {
			return
		}
	}
}
