// Command hostile is the peer VM's side of the interop tests' hostile
// scenarios: a misbehaving iWARP initiator speaking over the VM kernel's
// TCP to a siwtun listener. It is built static (CGO_ENABLED=0) and copied
// into the VM.
//
//	hostile bare ADDR:PORT                      TCP connect, close at once
//	hostile truncated ADDR:PORT                 half an MPA Request, then wait for the responder to give up
//	hostile send-no-recv ADDR:PORT              MPA rev 2 + CRC, then a Send the responder has no receive for
//	hostile read-beyond-ird ADDR:PORT STAG TO N two RDMA Read Requests of N octets with IRD/ORD 1
//	hostile repeat N CASE ADDR:PORT             N connections of CASE (bad-crc, send-inv-unknown,
//	                                            send-too-long), each of which must end with the right
//	                                            Terminate before the close; prints runs and misses
//	hostile flood N CONC HOLD ADDR:PORT         N connection attempts, CONC at once: connects closed or
//	                                            reset at once, and half-open ones (nothing sent, a
//	                                            Request cut off) held up to HOLD for the responder to
//	                                            reap unanswered; prints per kind what happened
//
// Each prints what the responder did, one "key: value" per line, and
// exits 0 when that is what the RFCs ask for, 1 (with the reason on
// standard error) otherwise.
package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/offload/rdmap"
)

// truncatedWait bounds the wait for the responder to end a connection
// whose MPA Request never completes (siwtun's AcceptTimeout is 5 s).
const truncatedWait = 20 * time.Second

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "hostile:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: hostile bare|truncated|send-no-recv|read-beyond-ird ADDR:PORT [STAG TO N]")
	}
	if args[0] == "flood" {
		return flood(args[1:])
	}
	if args[0] == "repeat" {
		if len(args) != 4 {
			return errors.New("repeat needs N CASE ADDR:PORT")
		}
		n, err := strconv.Atoi(args[1])
		if err != nil || n < 1 {
			return fmt.Errorf("repeat: count %q", args[1])
		}
		return repeat(n, args[2], args[3])
	}
	addr := args[1]
	switch args[0] {
	case "bare":
		return bare(addr)
	case "truncated":
		return truncated(addr)
	case "send-no-recv":
		return sendNoRecv(addr)
	case "read-beyond-ird":
		if len(args) != 5 {
			return errors.New("read-beyond-ird needs ADDR:PORT STAG TO N")
		}
		stag, err1 := strconv.ParseUint(args[2], 0, 32)
		to, err2 := strconv.ParseUint(args[3], 0, 64)
		n, err3 := strconv.ParseUint(args[4], 0, 32)
		if err := errors.Join(err1, err2, err3); err != nil {
			return fmt.Errorf("read-beyond-ird: %w", err)
		}
		return readBeyondIRD(addr, uint32(stag), to, uint32(n))
	}
	return fmt.Errorf("unknown scenario %q", args[0])
}

func bare(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return err
	}
	fmt.Println("connected: yes")
	return c.Close()
}

// truncated sends the first 10 octets of an MPA Request and waits: the
// responder must neither answer nor wait forever (RFC 5044 leaves the
// timeout to the implementation; siwtun's is 5 s).
func truncated(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	req, _ := (&mpa.Frame{Rev: 2, Enhanced: true, IRD: 1, ORD: 1}).Append(nil)
	if _, err := c.Write(req[:10]); err != nil {
		return err
	}
	t0 := time.Now()
	c.SetReadDeadline(t0.Add(truncatedWait))
	got, err := io.ReadAll(c)
	elapsed := time.Since(t0)
	fmt.Printf("reply_octets: %d\nclosed_after: %.1fs\n", len(got), elapsed.Seconds())
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("the responder still held the connection after %v", truncatedWait)
	case len(got) > 0:
		return fmt.Errorf("the responder answered a truncated Request with %x", got)
	}
	if err != nil {
		fmt.Printf("close: %v\n", err)
	}
	return nil
}

// conn is an established iWARP stream from the initiator's side.
type conn struct {
	c   net.Conn
	rep mpa.Frame
	tx  mpa.Sender
	rx  mpa.Receiver
	h   *collector
}

// dial connects and runs the MPA exchange (rev 2, enhanced, CRC asked,
// IRD/ORD 1).
func dial(addr string) (*conn, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	req := mpa.Frame{Rev: 2, Enhanced: true, CRC: true, IRD: 1, ORD: 1}
	b, _ := req.Append(nil)
	if _, err := c.Write(b); err != nil {
		c.Close()
		return nil, err
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var fr mpa.FrameReader
	buf := make([]byte, 1)
	var raw []byte
	for {
		if _, err := io.ReadFull(c, buf); err != nil {
			c.Close()
			return nil, fmt.Errorf("MPA Reply: %w", err)
		}
		raw = append(raw, buf[0])
		_, done, err := fr.Feed(buf)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("MPA Reply: %w", err)
		}
		if done {
			break
		}
	}
	rep, err := fr.Frame()
	if err != nil {
		c.Close()
		return nil, err
	}
	if !quiet {
		fmt.Printf("reply: %v\n", rep)
	}
	if !rep.Reply || rep.Reject {
		c.Close()
		return nil, fmt.Errorf("MPA Reply %v: not an acceptance", rep)
	}
	// RFC 5044 §7.1: reserved bits are sent as zero (this Reply is
	// revision 2 and enhanced, so 0x0f are the reserved ones).
	if res := raw[16] & 0x0f; res != 0 {
		c.Close()
		return nil, fmt.Errorf("MPA Reply %x: reserved flag bits %#02x set", raw, res)
	}
	cn := &conn{c: c, rep: rep, h: &collector{}}
	crc := req.CRC || rep.CRC
	cn.tx.Init(crc, rep.Markers)
	cn.rx.Init(crc, false, cn.h)
	return cn, nil
}

// send writes one FPDU holding the DDP header h and payload.
func (cn *conn) send(h ddp.Header, extra, payload []byte) error {
	hdr := make([]byte, h.Len())
	h.Marshal(hdr)
	cn.tx.Begin(nil, len(hdr)+len(extra)+len(payload))
	cn.tx.Write(hdr)
	cn.tx.Write(extra)
	cn.tx.Write(payload)
	_, err := cn.c.Write(cn.tx.Finish())
	return err
}

// readAll reads FPDUs until the responder closes (or the deadline).
func (cn *conn) readAll(d time.Duration) error {
	cn.c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(&cn.rx, cn.c)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("the responder did not close the stream within %v", d)
		}
		if !quiet {
			fmt.Printf("close: %v\n", err) // a reset after the Terminate is allowed
		}
	}
	return nil
}

// collector keeps every FPDU's ULPDU and CRC verdict.
type collector struct {
	cur    []byte
	ulpdus [][]byte
	badCRC int
}

func (h *collector) BeginFPDU(int) error { h.cur = nil; return nil }
func (h *collector) ULPDU(p []byte) error {
	h.cur = append(h.cur, p...)
	return nil
}
func (h *collector) EndFPDU(ok bool) error {
	if !ok {
		h.badCRC++
	}
	h.ulpdus = append(h.ulpdus, h.cur)
	return nil
}

// terminate finds the Terminate among the FPDUs received and checks it is
// the last one and well formed.
func (cn *conn) terminate() (rdmap.Terminate, error) {
	var t rdmap.Terminate
	if cn.h.badCRC > 0 {
		return t, fmt.Errorf("%d FPDUs with a bad CRC", cn.h.badCRC)
	}
	for i, u := range cn.h.ulpdus {
		var h ddp.Header
		n, err := h.Unmarshal(u)
		if err != nil {
			return t, fmt.Errorf("FPDU %d: %w", i, err)
		}
		if _, op := rdmap.ParseCtrl(h.ULPCtrl); op != rdmap.OpTerminate {
			continue
		}
		if i != len(cn.h.ulpdus)-1 {
			return t, fmt.Errorf("FPDUs after the Terminate")
		}
		if h.QN != ddp.QNTerminate || h.MSN != 1 || h.MO != 0 || !h.Last {
			return t, fmt.Errorf("Terminate with DDP header %v, want QN 2 MSN 1 MO 0 L", h)
		}
		if err := t.Unmarshal(u[n:]); err != nil {
			return t, fmt.Errorf("Terminate: %w", err)
		}
		if !quiet {
			fmt.Printf("terminate: %v\n", t)
		}
		return t, nil
	}
	return t, fmt.Errorf("no Terminate among %d FPDUs", len(cn.h.ulpdus))
}

// terminated reads until the responder closes the stream (within d) and
// returns the Terminate it sent before.
func (cn *conn) terminated(d time.Duration) (rdmap.Terminate, error) {
	if err := cn.readAll(d); err != nil {
		return rdmap.Terminate{}, err
	}
	return cn.terminate()
}

// sendNoRecv sends a 16-octet Send (MSN 1) to a QP that has no receive
// posted: RFC 5041 asks for a Terminate DDP, untagged buffer error,
// 0x02 (invalid MSN, no buffer available), with the DDP header copied,
// then the stream closes.
func sendNoRecv(addr string) error {
	cn, err := dial(addr)
	if err != nil {
		return err
	}
	defer cn.c.Close()
	h := ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpSend), QN: 0, MSN: 1}
	if err := cn.send(h, nil, []byte("no buffer for me")); err != nil {
		return err
	}
	t, err := cn.terminated(15 * time.Second)
	if err != nil {
		return err
	}
	if t.Code != rdmap.TermDDPNoBuffer || !t.HasDDPHeader {
		return fmt.Errorf("Terminate %v, want %v with the DDP header", t, rdmap.TermDDPNoBuffer)
	}
	return nil
}

// readBeyondIRD negotiates IRD/ORD 1 and sends two Read Requests of n
// octets back to back: the second exceeds the responder's IRD, and the
// responder terminates the stream with RDMAP remote operation error 0x07
// (catastrophic, localized to the stream), as siw does; the Read Response
// of the first may or may not get out before the Terminate.
func readBeyondIRD(addr string, stag uint32, to uint64, n uint32) error {
	cn, err := dial(addr)
	if err != nil {
		return err
	}
	defer cn.c.Close()
	if cn.rep.IRD != 1 {
		return fmt.Errorf("responder's IRD %d, the test needs 1", cn.rep.IRD)
	}
	var out []byte
	for msn := uint32(1); msn <= 2; msn++ {
		h := ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpReadRequest), QN: ddp.QNReadRequest, MSN: msn}
		hdr := make([]byte, h.Len())
		h.Marshal(hdr)
		rr := rdmap.ReadRequest{SinkSTag: 0x1000 + msn, SinkTO: 0, Size: n, SrcSTag: stag, SrcTO: to}
		body := make([]byte, rdmap.ReadRequestLen)
		rr.Marshal(body)
		cn.tx.Begin(nil, len(hdr)+len(body))
		cn.tx.Write(hdr)
		cn.tx.Write(body)
		out = append(out, cn.tx.Finish()...)
	}
	if _, err := cn.c.Write(out); err != nil { // both in one segment
		return err
	}
	if err := cn.readAll(30 * time.Second); err != nil {
		return err
	}
	var placed uint64
	for _, u := range cn.h.ulpdus {
		var h ddp.Header
		k, err := h.Unmarshal(u)
		if err == nil && h.Tagged {
			if _, op := rdmap.ParseCtrl(h.ULPCtrl); op == rdmap.OpReadResponse && h.STag == 0x1001 {
				placed += uint64(len(u) - k)
			}
		}
	}
	fmt.Printf("read_response_octets: %d\n", placed)
	t, err := cn.terminate()
	if err != nil {
		return err
	}
	if t.Code != rdmap.TermRDMAPCatastrophicStream {
		return fmt.Errorf("Terminate %v, want %v", t, rdmap.TermRDMAPCatastrophicStream)
	}
	if placed > uint64(n) {
		return fmt.Errorf("%d octets of Read Response for a %d-octet Read", placed, n)
	}
	return nil
}

// quiet silences the per-connection lines of repeat's runs.
var quiet bool

// badMessages are repeat's cases: the FPDU the initiator sends once the
// stream is up (CRC on), whether its CRC is broken, how many of its
// payload octets it sends (cut; 0: all, with the CRC), and the Terminate
// the responder must send before it closes the stream (RFC 5040 §7, RFC
// 5044 §8).
var badMessages = map[string]struct {
	h       ddp.Header
	payload []byte
	corrupt bool
	cut     int
	code    rdmap.Code
}{
	// A Send announcing 65,517 octets toward the 16-octet receive, of
	// which 16 come, then nothing: the header shows the error, and the
	// responder must answer it at once (a cut-through RNIC), not after
	// an FPDU timeout and not with a CRC error it never saw.
	"send-announces-too-much": {ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpSend), MSN: 1},
		make([]byte, 65517), false, 16, rdmap.TermDDPTooLong},
	"bad-crc": {ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpSend), MSN: 1},
		[]byte("a corrupted Send"), true, 0, rdmap.TermLLPCRC},
	"send-inv-unknown": {ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpSendInv), ULPData: 0x00abcd01, MSN: 1},
		[]byte("inv?"), false, 0, rdmap.TermRDMAPCannotInvalidate},
	"send-too-long": {ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpSend), MSN: 1},
		make([]byte, 8192), false, 0, rdmap.TermDDPTooLong},
}

// repeat runs n connections of one bad-message case and counts those that
// did not end with the right Terminate before the close.
func repeat(n int, name, addr string) error {
	m, ok := badMessages[name]
	if !ok {
		return fmt.Errorf("repeat: unknown case %q (bad-crc, send-inv-unknown, send-too-long, send-announces-too-much)", name)
	}
	quiet = true
	misses := 0
	var first error
	for i := range n {
		err := func() error {
			cn, err := dial(addr)
			if err != nil {
				return err
			}
			defer cn.c.Close()
			if m.cut > 0 {
				hdr := make([]byte, m.h.Len())
				m.h.Marshal(hdr)
				b := binary.BigEndian.AppendUint16(nil, uint16(len(hdr)+len(m.payload)))
				if _, err := cn.c.Write(append(append(b, hdr...), m.payload[:m.cut]...)); err != nil {
					return err
				}
			} else if m.corrupt {
				cn.tx.Begin(nil, m.h.Len()+len(m.payload))
				hdr := make([]byte, m.h.Len())
				m.h.Marshal(hdr)
				cn.tx.Write(hdr)
				cn.tx.Write(m.payload)
				f := cn.tx.Finish()
				f[len(f)-1] ^= 0x10
				if _, err := cn.c.Write(f); err != nil {
					return err
				}
			} else if err := cn.send(m.h, nil, m.payload); err != nil {
				return err
			}
			t, err := cn.terminated(15 * time.Second)
			if err != nil {
				return err
			}
			if t.Code != m.code {
				return fmt.Errorf("Terminate %v, want %v", t.Code, m.code)
			}
			return nil
		}()
		if err != nil {
			misses++
			if first == nil {
				first = fmt.Errorf("run %d: %w", i, err)
			}
		}
	}
	fmt.Printf("case: %s\nruns: %d\nmisses: %d\n", name, n, misses)
	if misses > 0 {
		return fmt.Errorf("%d of %d connections without the right Terminate; first: %v", misses, n, first)
	}
	return nil
}
