package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/siwtun/siwtun/iwarp/rdmap"
	"github.com/siwtun/siwtun/verbs"
)

// errStopped is what writeUntilError returns when its stream ended (the
// completion that said so).
var errStopped = errors.New("the stream ended")

// writeUntilError writes into [addr, addr+span) (rkey) from e without
// pause, 1 KiB per Write, each Write's bytes a fresh counter value, up to
// 16 in flight, until a completion fails (the peer's Terminate ends the
// stream and flushes the rest) or ctx ends. It returns how many Writes
// completed successfully, and errStopped wrapping the failing completion.
func writeUntilError(ctx context.Context, e *end, addr uint64, rkey uint32, span int) (int, error) {
	const size, inflight = 1024, 16
	buf, err := e.dev.AllocBuffer(size * inflight)
	if err != nil {
		return 0, err
	}
	mr, err := e.pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		return 0, err
	}
	defer mr.Dereg()
	wcs := make([]verbs.WorkCompletion, inflight)
	posted, done, out := 0, 0, 0
	for {
		for out < inflight {
			slot := posted % inflight
			for i := range size {
				buf[slot*size+i] = byte(posted + 1)
			}
			off := (posted * size) % span
			wr := verbs.SendWR{ID: uint64(posted), Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled,
				SGL: []verbs.SGE{mr.SGE(slot*size, size)}, RemoteAddr: addr + uint64(off), RKey: rkey}
			if _, err := e.qp.PostSend([]verbs.SendWR{wr}); err != nil {
				return done, fmt.Errorf("%w: post: %v", errStopped, err)
			}
			posted++
			out++
		}
		n, err := e.scq.Wait(ctx, wcs)
		if err != nil {
			return done, err
		}
		for _, wc := range wcs[:n] {
			out--
			if wc.Status != verbs.WCSuccess {
				return done, fmt.Errorf("%w: %+v", errStopped, wc)
			}
			done++
		}
	}
}

// TestDaemonsMWInvalidateRace: two daemons, an application on each verbs
// socket. The peer writes without pause into a memory window of the
// owner's region while the owner takes the window back: a type 2 window
// by IBV_WR_LOCAL_INV, a type 1 window by binding it again elsewhere
// (MW.Bind), a type 1 window by unbinding it (a zero-length bind). Once
// the owner has polled that completion, the window's memory never changes
// again: snapshots of the whole region taken over the next 300 ms and
// after the writer stopped equal the one taken right after the
// completion. The writer's stream ends with the owner's Terminate (DDP
// tagged buffer, invalid STag), Writes having landed before.
func TestDaemonsMWInvalidateRace(t *testing.T) {
	r := newTwoRNICs(t, 1500)
	const size = 64 << 10
	cases := []struct {
		name string
		typ  verbs.MWType
		take func(t *testing.T, srv *end, mw *verbs.MW, mr *verbs.MR, rkey uint32)
	}{
		{"type 2, local invalidate", verbs.MWType2, func(t *testing.T, srv *end, _ *verbs.MW, _ *verbs.MR, rkey uint32) {
			if _, err := srv.qp.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRLocalInv, Flags: verbs.FlagSignaled, InvalidateRKey: rkey}}); err != nil {
				t.Fatal(err)
			}
			if wc := srv.wait(t, srv.scq); wc.ID != 2 || wc.Opcode != verbs.WCLocalInv || wc.Status != verbs.WCSuccess {
				t.Fatalf("local invalidate: %+v", wc)
			}
		}},
		{"type 1, bound elsewhere", verbs.MWType1, func(t *testing.T, srv *end, mw *verbs.MW, mr *verbs.MR, _ uint32) {
			if err := mw.Bind(srv.qp, verbs.MWBindInfo{ID: 2, Flags: verbs.FlagSignaled, MR: mr, Addr: mr.Addr() + size/2, Length: 4096,
				Access: verbs.AccessRemoteRead}); err != nil {
				t.Fatal(err)
			}
			if wc := srv.wait(t, srv.scq); wc.ID != 2 || wc.Opcode != verbs.WCBindMW || wc.Status != verbs.WCSuccess {
				t.Fatalf("rebind: %+v", wc)
			}
		}},
		{"type 1, unbound", verbs.MWType1, func(t *testing.T, srv *end, mw *verbs.MW, _ *verbs.MR, _ uint32) {
			if err := mw.Bind(srv.qp, verbs.MWBindInfo{ID: 2, Flags: verbs.FlagSignaled}); err != nil {
				t.Fatal(err)
			}
			if wc := srv.wait(t, srv.scq); wc.ID != 2 || wc.Opcode != verbs.WCBindMW || wc.Status != verbs.WCSuccess {
				t.Fatalf("unbind: %+v", wc)
			}
		}},
	}
	port := uint16(7300)
	for round := range 2 {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/%d", tc.name, round), func(t *testing.T) {
				port++
				cli, srv := r.connect(t, port, 64)
				buf, err := srv.dev.AllocBuffer(size)
				if err != nil {
					t.Fatal(err)
				}
				mr, err := srv.pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessMWBind)
				if err != nil {
					t.Fatal(err)
				}
				mw, err := srv.pd.AllocMW(tc.typ)
				if err != nil {
					t.Fatal(err)
				}
				// The window: the region's first half.
				var rkey uint32
				if tc.typ == verbs.MWType2 {
					rkey = verbs.IncRKey(mw.RKey())
					bind := verbs.SendWR{ID: 1, Opcode: verbs.WRBindMW, Flags: verbs.FlagSignaled, Bind: verbs.MWBind{
						MW: mw.RKey(), RKey: rkey, MRKey: mr.LKey(), Addr: mr.Addr(), Length: size / 2, Access: verbs.AccessRemoteWrite}}
					if _, err := srv.qp.PostSend([]verbs.SendWR{bind}); err != nil {
						t.Fatal(err)
					}
				} else {
					if err := mw.Bind(srv.qp, verbs.MWBindInfo{ID: 1, Flags: verbs.FlagSignaled, MR: mr, Addr: mr.Addr(), Length: size / 2,
						Access: verbs.AccessRemoteWrite}); err != nil {
						t.Fatal(err)
					}
					rkey = mw.RKey()
				}
				if wc := srv.wait(t, srv.scq); wc.ID != 1 || wc.Opcode != verbs.WCBindMW || wc.Status != verbs.WCSuccess {
					t.Fatalf("bind: %+v", wc)
				}

				type result struct {
					n   int
					err error
				}
				res := make(chan result, 1)
				wctx, cancel := context.WithTimeout(ctx(t), 30*time.Second)
				defer cancel()
				go func() {
					n, err := writeUntilError(wctx, cli, mr.Addr(), rkey, size/2)
					res <- result{n, err}
				}()
				// Let Writes land, then take the window back while
				// they go on.
				eventually(t, 10*time.Second, "the peer's Writes land", func() (bool, string) {
					return buf[size/2-1] != 0, "the window's last byte is still 0"
				})
				tc.take(t, srv, mw, mr, rkey)
				snap := append([]byte(nil), buf...)
				for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
					if !bytes.Equal(buf, snap) {
						t.Fatal("the window's memory changed after the invalidation completed")
					}
				}
				got := <-res
				if !errors.Is(got.err, errStopped) {
					t.Fatalf("writer: %v after %d Writes, want its stream ended", got.err, got.n)
				}
				if !bytes.Equal(buf, snap) {
					t.Fatal("the window's memory changed after the invalidation completed")
				}
				if bytes.ContainsFunc(buf[size/2:], func(r rune) bool { return r != 0 }) {
					t.Fatal("bytes past the window changed")
				}
				ev := waitEventOf(t, cli.qp, verbs.EventTerminateReceived)
				if ev.Code != rdmap.TermDDPTaggedInvalidSTag {
					t.Fatalf("writer's Terminate %v, want %v", ev.Code, rdmap.TermDDPTaggedInvalidSTag)
				}
				t.Logf("%d Writes completed before the stream ended (%v)", got.n, got.err)
				if err := mw.Dealloc(); err != nil {
					t.Fatal(err)
				}
				if err := mr.Dereg(); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// waitEventOf waits for an event of type want on qp.
func waitEventOf(t testing.TB, qp *verbs.QP, want verbs.EventType) verbs.Event {
	t.Helper()
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	for {
		select {
		case e := <-qp.Events():
			if e.Type == want {
				return e
			}
		case <-timer.C:
			t.Fatalf("no %v event", want)
		}
	}
}
