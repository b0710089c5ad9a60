package inspect

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/rdmap"
)

// Endpoints of the synthetic connections.
var (
	cliAP = netip.MustParseAddrPort("198.18.0.1:40000")
	srvAP = netip.MustParseAddrPort("198.18.0.2:7174")
)

const (
	cliISN = 0xfffff000 // wraps within the first few KiB
	srvISN = 1000
)

// stream is an FPDU stream built with the engine's Sender.
type stream struct {
	b      []byte
	starts []uint64 // FPDU start offsets
	lens   []int    // FPDU wire lengths
}

// buildStream builds FPDUs carrying RDMA Writes with the given ULPDU
// lengths (each ≥ the tagged header) at stream offset 0.
func buildStream(t testing.TB, crc, markers bool, ulpdus []int) stream {
	t.Helper()
	var s mpa.Sender
	s.Init(crc, markers)
	var st stream
	to := uint64(0x7f0000001000)
	for i, n := range ulpdus {
		if n < ddp.TaggedHeaderLen {
			t.Fatalf("ULPDU %d shorter than a tagged header", n)
		}
		h := ddp.Header{Tagged: true, Last: i == len(ulpdus)-1, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpWrite), STag: 0x200, TO: to}
		var hdr [ddp.TaggedHeaderLen]byte
		h.Marshal(hdr[:])
		payload := make([]byte, n-ddp.TaggedHeaderLen)
		for j := range payload {
			payload[j] = byte(i + j)
		}
		to += uint64(len(payload))
		start := s.StreamOffset()
		want := s.WireLen(n)
		before := len(st.b)
		s.Begin(st.b, n)
		s.Write(hdr[:])
		s.Write(payload)
		st.b = s.Finish()
		if got := len(st.b) - before; got != want {
			t.Fatalf("FPDU %d: %d octets, WireLen said %d", i+1, got, want)
		}
		st.starts = append(st.starts, start)
		st.lens = append(st.lens, want)
	}
	return st
}

// frames returns the MPA Request and Reply of a connection whose initiator
// wants markers towards it when mInit, the responder when mResp.
func frames(t testing.TB, crc, mInit, mResp bool) (req, rep []byte) {
	t.Helper()
	fq := mpa.Frame{Rev: 2, CRC: crc, Markers: mInit, Enhanced: true, IRD: 4, ORD: 4}
	fp := mpa.Frame{Reply: true, Rev: 2, CRC: crc, Markers: mResp, Enhanced: true, IRD: 4, ORD: 4}
	req, err := fq.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	rep, err = fp.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	return req, rep
}

// conversation builds the segments of a connection: handshake, MPA
// Request and Reply, then the initiator's FPDU stream cut at cuts (offsets
// into fpdus, ascending, excluding 0 and len).
func conversation(t testing.TB, crc, markers bool, fpdus []byte, cuts []int) []Segment {
	t.Helper()
	req, rep := frames(t, crc, false, markers)
	t0 := time.Unix(1700000000, 0)
	var segs []Segment
	add := func(src, dst netip.AddrPort, seq uint32, flags uint8, p []byte) {
		segs = append(segs, Segment{Time: t0.Add(time.Duration(len(segs)) * time.Microsecond), Src: src, Dst: dst, Seq: seq, Flags: flags, Payload: p})
	}
	add(cliAP, srvAP, cliISN, FlagSYN, nil)
	add(srvAP, cliAP, srvISN, FlagSYN|FlagACK, nil)
	add(cliAP, srvAP, cliISN+1, FlagACK, nil)
	add(cliAP, srvAP, cliISN+1, FlagACK|FlagPSH, req)
	add(srvAP, cliAP, srvISN+1, FlagACK|FlagPSH, rep)
	seq := uint32(cliISN + 1 + len(req))
	prev := 0
	for _, c := range append(cuts, len(fpdus)) {
		add(cliAP, srvAP, seq+uint32(prev), FlagACK, fpdus[prev:c])
		prev = c
	}
	return segs
}

// analyse feeds segs to a new Analyzer and returns every Report.
func analyse(segs []Segment) (*Analyzer, []Report) {
	a := New()
	var out []Report
	for _, s := range segs {
		out = append(out, a.Add(s)...)
	}
	return a, out
}

// fpduReports returns the Reports of kind KindFPDU.
func fpduReports(rs []Report) []Report {
	var out []Report
	for _, r := range rs {
		if r.Kind == KindFPDU {
			out = append(out, r)
		}
	}
	return out
}

// be16 reads a big-endian field.
func be16(b []byte) uint16 { return binary.BigEndian.Uint16(b) }
