package capture

import (
	"bytes"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/testkit"
	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/mpa"
	"github.com/siwtun/siwtun/offload/mpa/inspect"
	"github.com/siwtun/siwtun/offload/rdmap"
)

// siwCaptures are Linux siw's rping traffic (no markers, CRC on and off):
// 44 FPDUs, each in a segment of its own.
var siwCaptures = []struct {
	file string
	crc  bool
}{
	{"siw-rping-crc-mtu1500.pcap", true},
	{"siw-rping-nocrc-mtu1500.pcap", false},
}

// TestSiwCaptures checks the captures of kernel siw: no markers, every
// segment aligned (siw sends one FPDU per segment), every CRC good.
func TestSiwCaptures(t *testing.T) {
	dirs := []string{filepath.Join("..", "offload", "mpa", "testdata")}
	// The shared captures beside the checkout (../shared/captures), when
	// they are there: the originals the testdata copies came from.
	if d, ok := testkit.SharedDir("captures"); ok {
		dirs = append(dirs, d)
	}
	for _, dir := range dirs {
		for _, c := range siwCaptures {
			t.Run(filepath.Join(filepath.Base(dir), c.file), func(t *testing.T) {
				segs, err := ReadFile(filepath.Join(dir, c.file))
				if err != nil {
					t.Fatal(err)
				}
				a := inspect.New()
				for _, s := range segs {
					for _, r := range a.Add(s) {
						if !r.Clean() {
							t.Errorf("segment seq %d: %+v", r.Seq, r)
						}
					}
				}
				sum := a.Summary()
				if len(sum) != 2 {
					t.Fatalf("%d directions, want 2", len(sum))
				}
				want := []struct {
					role  string
					fpdus int
				}{{"initiator", 20}, {"responder", 24}}
				for i, s := range sum {
					good := 0
					if c.crc {
						good = want[i].fpdus
					}
					if s.Role != want[i].role || s.CRC != c.crc || s.Markers || s.FPDUs != want[i].fpdus ||
						s.FPDUSegments != want[i].fpdus || s.Aligned != want[i].fpdus || s.CRCGood != good || s.CRCBad != 0 ||
						s.MarkersOK+s.MarkersBad != 0 || s.Note != "" {
						t.Errorf("direction %d: %+v", i, s)
					}
				}
			})
		}
	}
}

// synthetic returns the packets of a connection between two siwtun-like
// ends with CRC and markers on: handshake, MPA Request and Reply, then
// RDMA Writes, a Read Request and its Read Response, each FPDU in its own
// segment, the initiator's last FPDUs cut across two segments.
func synthetic(t testing.TB) []Packet {
	t.Helper()
	cli := netip.MustParseAddrPort("198.18.1.2:40001")
	srv := netip.MustParseAddrPort("198.18.2.2:7174")
	req, _ := (&mpa.Frame{Rev: 2, CRC: true, Markers: true, Enhanced: true, IRD: 4, ORD: 4}).Append(nil)
	rep, _ := (&mpa.Frame{Reply: true, Rev: 2, CRC: true, Markers: true, Enhanced: true, IRD: 4, ORD: 4}).Append(nil)
	var cs, ss mpa.Sender
	cs.Init(true, true)
	ss.Init(true, true)
	fpdu := func(s *mpa.Sender, h ddp.Header, extra []byte, payload int) []byte {
		var hb [ddp.UntaggedHeaderLen]byte
		n := h.Marshal(hb[:])
		s.Begin(nil, n+len(extra)+payload)
		s.Write(hb[:n])
		s.Write(extra)
		p := make([]byte, payload)
		for i := range p {
			p[i] = byte(i * 7)
		}
		s.Write(p)
		return s.Finish()
	}
	write := func(to uint64, n int, last bool) []byte {
		return fpdu(&cs, ddp.Header{Tagged: true, Last: last, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpWrite), STag: 0x200, TO: to}, nil, n)
	}
	var rr [rdmap.ReadRequestLen]byte
	(&rdmap.ReadRequest{SinkSTag: 0x300, SinkTO: 0x9000, Size: 2000, SrcSTag: 0x200, SrcTO: 0x1000}).Marshal(rr[:])
	t0 := time.Unix(1700000000, 0)
	var pkts []Packet
	cseq, sseq := uint32(100), uint32(5000)
	add := func(fromCli bool, flags uint8, p []byte) {
		pk := Packet{Time: t0.Add(time.Duration(len(pkts)) * 50 * time.Microsecond), Flags: flags | inspect.FlagACK, Window: 64000, Payload: p}
		if fromCli {
			pk.Src, pk.Dst, pk.Seq, pk.Ack = cli, srv, cseq, sseq
			cseq += uint32(len(p))
		} else {
			pk.Src, pk.Dst, pk.Seq, pk.Ack = srv, cli, sseq, cseq
			sseq += uint32(len(p))
		}
		if flags&inspect.FlagSYN != 0 {
			pk.MSS = 1460
			if fromCli {
				pk.Flags &^= inspect.FlagACK
				cseq++
			} else {
				sseq++
			}
		}
		pkts = append(pkts, pk)
	}
	add(true, inspect.FlagSYN, nil)
	add(false, inspect.FlagSYN, nil)
	add(true, 0, nil)
	add(true, inspect.FlagPSH, req)
	add(false, inspect.FlagPSH, rep)
	for i := range 5 {
		add(true, 0, write(0x1000+uint64(i)*1380, 1380, i == 4))
	}
	add(false, 0, nil)
	add(true, inspect.FlagPSH, fpdu(&cs, ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpReadRequest), QN: 1, MSN: 1}, rr[:], 0))
	for i, n := range []int{1400, 600} {
		add(false, 0, fpdu(&ss, ddp.Header{Tagged: true, Last: i == 1, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpReadResponse), STag: 0x300, TO: 0x9000 + uint64(i)*1400}, nil, n))
	}
	// Two more Writes in three segments: the middle cut splits an FPDU.
	two := append(write(0x5000, 700, false), write(0x5000+700, 300, true)...)
	add(true, 0, two[:500])
	add(true, 0, two[500:900])
	add(true, inspect.FlagPSH, two[900:])
	add(false, 0, nil)
	return pkts
}

// TestWriteReadSynthetic writes a synthetic connection with markers and
// CRC on as pcapng, reads it back and checks the verdicts.
func TestWriteReadSynthetic(t *testing.T) {
	pkts := synthetic(t)
	path := filepath.Join(t.TempDir(), "synthetic.pcapng")
	writeFile(t, path, pkts)
	segs, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(segs) != len(pkts) {
		t.Fatalf("read %d segments, wrote %d", len(segs), len(pkts))
	}
	a := inspect.New()
	notAligned := 0
	for i, s := range segs {
		if s.Seq != pkts[i].Seq || s.Src != pkts[i].Src || s.Flags != pkts[i].Flags || !bytes.Equal(s.Payload, pkts[i].Payload) || !s.Time.Equal(pkts[i].Time) {
			t.Fatalf("segment %d read back as %+v", i, s)
		}
		for _, r := range a.Add(s) {
			if r.Aligned != nil && !*r.Aligned {
				notAligned++
			}
		}
	}
	sum := a.Summary()
	if s := sum[0]; s.FPDUs != 8 || s.CRCGood != 8 || s.MarkersBad != 0 || s.MarkersOK == 0 || s.Aligned != 6 || s.FPDUSegments != 9 {
		t.Errorf("initiator: %+v", s)
	}
	if s := sum[1]; s.FPDUs != 2 || s.CRCGood != 2 || s.MarkersBad != 0 || s.MarkersOK != 5 || s.Aligned != 2 {
		t.Errorf("responder: %+v", s)
	}
	if notAligned != 3 {
		t.Errorf("%d segments not aligned, want 3", notAligned)
	}
}

// writeFile writes pkts to path with the Analyzer's comments.
func writeFile(t testing.TB, path string, pkts []Packet) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := NewWriter(f, "siwtun0")
	if err != nil {
		t.Fatal(err)
	}
	a := inspect.New()
	for i := range pkts {
		rs := a.Add(pkts[i].Segment())
		var comments []string
		for j := range rs {
			if rs[j].Len > 0 {
				comments = append(comments, rs[j].Comment())
			}
		}
		if err := w.Write(&pkts[i], comments...); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestTsharkDecodesSynthetic has Wireshark's dissectors check what Writer
// writes, when tshark is installed: with markers and CRC on, every FPDU
// in a segment of its own shows "Good CRC32" and nothing is malformed.
// (Wireshark's MPA dissector assumes one FPDU per segment, so the
// connection here is the aligned part of the synthetic one.)
func TestTsharkDecodesSynthetic(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark is not installed (apt-get install tshark; make setup, which make test runs first, installs it)")
	}
	pkts := synthetic(t)
	pkts = pkts[:len(pkts)-4] // the aligned part
	path := filepath.Join(t.TempDir(), "aligned.pcapng")
	writeFile(t, path, pkts)
	res := RunTshark(t.Context(), tshark, path)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if res.FPDUs != 8 || res.GoodCRC != 8 || res.BadCRC != 0 || res.Malformed != 0 || res.Comments == 0 {
		t.Errorf("tshark: %+v\n%s", res, strings.Join(res.Lines, "\n"))
	}
}
