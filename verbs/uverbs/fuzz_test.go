package uverbs

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/siwtun/siwtun/verbs/internal/uabi"
)

// fuzzReplyTimeout bounds the wait for one reply in FuzzSession.
const fuzzReplyTimeout = 5 * time.Second

// fuzzMessages cuts data into the messages of one session: each is a
// selector byte, a length byte and that many bytes. A selector with bit 7
// set sends the bytes as a whole packet, header included (garbage
// headers); otherwise op is selector%20 (0 is no op, 19 Cancel), bits 5-6
// attach descriptors (1: a sealed memfd, 2: an eventfd, 3: both), and the
// header is built around the bytes as the body. In a body, a leading u32
// below 16 (and the next two, for CreateQP's PD and CQs) names the n-th
// handle the session got so far, so sequences reach objects the daemon
// really made.
type fuzzMsg struct {
	raw  bool
	op   uint16
	fds  int
	body []byte
}

func fuzzMessages(data []byte) []fuzzMsg {
	var out []fuzzMsg
	for len(data) >= 2 && len(out) < 64 {
		sel, n := data[0], int(data[1])
		data = data[2:]
		n = min(n, len(data))
		m := fuzzMsg{body: data[:n]}
		data = data[n:]
		if sel&0x80 != 0 {
			m.raw = true
		} else {
			m.op, m.fds = uint16(sel&0x1f)%uint16(len(uabi.Ops)+1), int(sel>>5)&3
		}
		out = append(out, m)
	}
	return out
}

// FuzzSession drives a live session of the daemon with arbitrary message
// sequences over a socket pair: garbage headers, any op with any body,
// descriptors where they do and do not belong, handles of objects the
// session made. The server must answer every request (Cancel has no
// reply; a Connect or GetRequest is canceled right after it is sent) or
// close the session, never panic, and free what the session held.
func FuzzSession(f *testing.F) {
	r := newRig(f)
	r.srv.SetLimits(Limits{QPs: 4, CQs: 8, MRs: 8, PDs: 4, Listeners: 2, MRBytes: 1 << 20, WRs: 256, CQEs: 1024})
	r.srv.sendTimeout.Store(int64(fuzzReplyTimeout))
	le := binary.LittleEndian
	u32 := func(vs ...uint32) []byte {
		var b []byte
		for _, v := range vs {
			b = le.AppendUint32(b, v)
		}
		return b
	}
	msg := func(op uint16, fds int, body []byte) []byte {
		return append([]byte{byte(op) | byte(fds)<<5, byte(len(body))}, body...)
	}
	cat := func(ms ...[]byte) []byte {
		var b []byte
		for _, m := range ms {
			b = append(b, m...)
		}
		return b
	}
	var e uabi.Enc
	enc := func(m uabi.Msg) []byte {
		e.Begin(0, 0)
		e.Msg(m)
		return append([]byte(nil), e.B[uabi.MsgHeaderLen:]...)
	}
	hello := msg(uabi.OpHello, 0, u32(uabi.Version))
	// Handles: 0 the PD, 1 the CQ, 2 the region, 3 the QP.
	setup := cat(hello, msg(uabi.OpAllocPD, 0, nil), msg(uabi.OpCreateCQ, 0, u32(16)),
		msg(uabi.OpRegMR, 1, enc(&uabi.RegMR{PD: 0, Offset: 0, Length: 4096, Access: 7})),
		msg(uabi.OpCreateQP, 0, enc(&uabi.CreateQP{PD: 0, SendCQ: 1, RecvCQ: 1, MaxSendWR: 8, MaxRecvWR: 8})))
	f.Add(hello)
	f.Add(setup)
	f.Add(cat(setup, msg(uabi.OpModifyQP, 0, u32(3, 1)), msg(uabi.OpQueryQP, 0, u32(3)),
		msg(uabi.OpDestroyCQ, 0, u32(1)), msg(uabi.OpDeallocPD, 0, u32(0)), msg(uabi.OpDestroyQP, 0, u32(3)),
		msg(uabi.OpDestroyQP, 0, u32(3)), msg(uabi.OpDeregMR, 0, u32(2)), msg(uabi.OpDestroyCQ, 0, u32(1)),
		msg(uabi.OpDeallocPD, 0, u32(0))))
	f.Add(cat(setup, msg(uabi.OpConnect, 0, enc(&uabi.Connect{Handle: 3, Remote: netip.AddrPortFrom(peerAddr.Addr(), 9)})), msg(uabi.OpDisconnect, 0, u32(3))))
	f.Add(cat(hello, msg(uabi.OpListen, 0, enc(&uabi.Listen{Backlog: 4})), msg(uabi.OpGetRequest, 0, u32(0)),
		msg(uabi.OpCloseListener, 0, u32(0)), msg(uabi.OpAccept, 0, enc(&uabi.Accept{Request: 1, QP: 0})),
		msg(uabi.OpReject, 0, enc(&uabi.Reject{Request: 1}))))
	// Handles 4, the SRQ, and 5, a QP on it.
	f.Add(cat(setup, msg(uabi.OpCreateSRQ, 0, enc(&uabi.CreateSRQ{PD: 0, MaxWR: 8, Limit: 2})),
		msg(uabi.OpCreateQP, 0, enc(&uabi.CreateQP{PD: 0, SendCQ: 1, RecvCQ: 1, MaxSendWR: 8, MaxRecvWR: 8, SRQ: 4})),
		msg(uabi.OpModifySRQ, 0, enc(&uabi.ModifySRQ{Handle: 4, Mask: 3, MaxWR: 40, Limit: 4})), msg(uabi.OpQuerySRQ, 0, u32(4)),
		msg(uabi.OpDestroySRQ, 0, u32(4)), msg(uabi.OpReregMR, 1, enc(&uabi.ReregMR{Handle: 2, PD: 0, Length: 4096, Access: 1})),
		msg(uabi.OpDestroyQP, 0, u32(5)), msg(uabi.OpDestroySRQ, 0, u32(4)), msg(uabi.OpDeallocPD, 0, u32(0))))
	// Handles 4 and 5, memory windows of both types.
	f.Add(cat(setup, msg(uabi.OpAllocMW, 0, enc(&uabi.AllocMW{PD: 0, Type: 1})), msg(uabi.OpAllocMW, 0, enc(&uabi.AllocMW{PD: 0, Type: 2})),
		msg(uabi.OpAllocMW, 0, enc(&uabi.AllocMW{PD: 0, Type: 9})), msg(uabi.OpDeregMR, 0, u32(2)), msg(uabi.OpDeallocMW, 0, u32(4)),
		msg(uabi.OpDeallocMW, 0, u32(5)), msg(uabi.OpDeallocMW, 0, u32(5)), msg(uabi.OpDeallocPD, 0, u32(0))))
	// Handles 0 and 1: a port reserved, a listener on it; then released.
	f.Add(cat(hello, msg(uabi.OpReservePort, 0, enc(&uabi.ReservePort{Addr: netip.AddrPortFrom(daemonAddr.Addr(), 0)})),
		msg(uabi.OpListen, 0, enc(&uabi.Listen{Addr: netip.AddrPortFrom(daemonAddr.Addr(), 7300)})),
		msg(uabi.OpReservePort, 0, enc(&uabi.ReservePort{Addr: netip.AddrPortFrom(daemonAddr.Addr(), 7300)})),
		msg(uabi.OpReleasePort, 0, u32(0)), msg(uabi.OpReleasePort, 0, u32(0)), msg(uabi.OpCloseListener, 0, u32(1))))
	f.Add(cat(msg(uabi.OpRegMR, 3, nil), msg(uabi.OpCancel, 0, u32(1)), []byte{0x80, 3, 1, 2, 3},
		[]byte{0x80, 12, 12, 0, 0, 0, 1, 0, 9, 0, 1, 0, 0, 0}, msg(0, 0, nil)))

	f.Fuzz(func(t *testing.T, data []byte) {
		msgs := fuzzMessages(data)
		a, b, err := socketPair()
		if err != nil {
			t.Fatal(err)
		}
		r.srv.start(b)
		c := uabi.NewConn(a)
		memfd, mem, err := uabi.NewShared("fuzz", 2*4096, false)
		if err != nil {
			t.Fatal(err)
		}
		efd, err := uabi.NewEventfd()
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			a.Close()
			uabi.Unmap(mem)
			uabi.Close(memfd)
			uabi.Close(efd)
			// The session ends and frees what it held.
			deadline := time.Now().Add(testTimeout)
			for r.srv.Sessions() != 0 || len(r.daemon.QPs()) != 0 || r.daemon.Regions().Len() != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("session not cleaned up: %d sessions, %d QPs, %d regions",
						r.srv.Sessions(), len(r.daemon.QPs()), r.daemon.Regions().Len())
				}
				time.Sleep(time.Millisecond)
			}
		}()
		var handles []uint32
		var enc uabi.Enc
		for i, m := range msgs {
			seq := uint32(i + 1)
			var pkt []byte
			var fds []int
			expect := true
			cancelSeq := seq
			if m.raw {
				pkt = m.body
				h, _, err := uabi.ParseHeader(pkt, false)
				if err == nil {
					cancelSeq = h.Seq
				}
				// An empty packet reads as the client's close.
				expect = len(pkt) > 0 && (err != nil || h.Op != uabi.OpCancel)
			} else {
				if m.fds&1 != 0 {
					fds = append(fds, memfd)
				}
				if m.fds&2 != 0 {
					fds = append(fds, efd)
				}
				body := append([]byte(nil), m.body...)
				for k := 0; k < 3 && len(body) >= 4*(k+1) && len(handles) > 0; k++ {
					if v := le.Uint32(body[4*k:]); v < 16 {
						le.PutUint32(body[4*k:], handles[int(v)%len(handles)])
					}
					if m.op != uabi.OpCreateQP {
						break
					}
				}
				enc.Begin(m.op, seq)
				enc.B = append(enc.B, body...)
				pkt = enc.Finish(len(fds))
				expect = m.op != uabi.OpCancel
			}
			if err := c.Send(pkt, fds...); err != nil {
				if isClosed(err) {
					return // the daemon closed the session
				}
				t.Fatalf("message %d: %v", i, err)
			}
			if !expect {
				continue
			}
			// A request that waits (Connect, GetRequest) is canceled.
			c.Send(enc.Message(uabi.OpCancel, 0, &uabi.Cancel{Seq: cancelSeq}, 0))
			a.SetReadDeadline(time.Now().Add(fuzzReplyTimeout))
			for {
				h, body, rfds, err := c.Recv()
				uabi.CloseFDs(rfds)
				if err != nil && !errors.Is(err, uabi.ErrBadMessage) {
					if uabi.IsEOF(err) || isClosed(err) {
						return
					}
					t.Fatalf("message %d (%+v): no reply: %v", i, m, err)
				}
				if err != nil {
					t.Fatalf("message %d: the daemon sent a malformed message: %v", i, err)
				}
				if h.Op == uabi.OpEvent {
					continue
				}
				var st uabi.Status
				d := &uabi.Dec{B: body}
				if err := st.Decode(d); err != nil {
					t.Fatalf("message %d: reply status: %v", i, err)
				}
				if st.Code == uabi.StOK && len(d.B) >= 4 {
					switch h.Op &^ uabi.ReplyBit {
					case uabi.OpAllocPD, uabi.OpRegMR, uabi.OpCreateCQ, uabi.OpCreateQP, uabi.OpListen, uabi.OpGetRequest:
						handles = append(handles, le.Uint32(d.B))
					}
				}
				break
			}
		}
	})
}

// socketPair is a connected pair of seqpacket Unix sockets.
func socketPair() (*net.UnixConn, *net.UnixConn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	conn := func(fd int) (*net.UnixConn, error) {
		f := os.NewFile(uintptr(fd), "fuzz-socket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			return nil, err
		}
		return c.(*net.UnixConn), nil
	}
	a, err := conn(fds[0])
	if err != nil {
		syscall.Close(fds[1])
		return nil, nil, err
	}
	b, err := conn(fds[1])
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}

// isClosed reports whether err is the daemon's side gone.
func isClosed(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed)
}
