package web

import (
	"net/netip"
	"testing"
	"time"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
	"github.com/siwtun/siwtun/iwarp/rdmap"
)

// synthTrace builds the View of a synthetic connection: the TCP and MPA
// handshakes (CRC on, markers as asked) and then n RDMA Write segments
// of one emss-sized FPDU each, every tenth answered by an ACK, as the
// local device (the initiator) sends them. It returns the Builder and
// every segment fed to it.
func synthTrace(t testing.TB, n, emss int, markers bool) (*Builder, []inspect.Segment) {
	t.Helper()
	a := netip.MustParseAddrPort("198.18.0.1:40000")
	z := netip.MustParseAddrPort("198.18.0.2:7174")
	b := NewBuilder("synthetic", "siwtun0", "", nil)
	var segs []inspect.Segment
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	seqA, seqZ := uint32(1000), uint32(5000)
	add := func(out bool, flags uint8, p []byte) {
		s := inspect.Segment{Time: start.Add(time.Duration(len(segs)) * 10 * time.Microsecond), Flags: flags, Payload: p}
		dir := "out"
		if out {
			s.Src, s.Dst, s.Seq = a, z, seqA
			seqA += uint32(len(p))
		} else {
			s.Src, s.Dst, s.Seq, dir = z, a, seqZ, "in"
			seqZ += uint32(len(p))
		}
		if flags&inspect.FlagSYN != 0 {
			if out {
				seqA++
			} else {
				seqZ++
			}
		}
		segs = append(segs, s)
		b.Event(true, ctl.WatchEvent{Time: s.Time, Segment: &ctl.WatchSegment{Dir: dir, Src: s.Src, Dst: s.Dst, Seq: s.Seq, Flags: flags, Payload: p}})
	}
	add(true, inspect.FlagSYN, nil)
	add(false, inspect.FlagSYN|inspect.FlagACK, nil)
	add(true, inspect.FlagACK, nil)
	req, err := (&mpa.Frame{Rev: 2, CRC: true, Markers: markers, Enhanced: true, IRD: 4, ORD: 4}).Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := (&mpa.Frame{Reply: true, Rev: 2, CRC: true, Markers: markers, Enhanced: true, IRD: 4, ORD: 4}).Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	add(true, inspect.FlagPSH|inspect.FlagACK, req)
	add(false, inspect.FlagPSH|inspect.FlagACK, rep)
	var snd mpa.Sender
	snd.Init(true, markers)
	payload := make([]byte, emss)
	for i := range payload {
		payload[i] = byte(i)
	}
	to := uint64(0x10000)
	var hdr [ddp.TaggedHeaderLen]byte
	for i := 0; len(segs) < n; i++ {
		if i%10 == 9 {
			add(false, inspect.FlagACK, nil)
			continue
		}
		ulpdu := snd.MaxULPDULen(emss)
		pl := ulpdu - ddp.TaggedHeaderLen
		h := ddp.Header{Tagged: true, Last: i%3 == 2, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpWrite), STag: 0x200, TO: to}
		h.Marshal(hdr[:])
		snd.Begin(nil, ulpdu)
		snd.Write(hdr[:])
		snd.Write(payload[:pl])
		add(true, inspect.FlagPSH|inspect.FlagACK, snd.Finish())
		to += uint64(pl)
	}
	b.Finish()
	return b, segs
}
