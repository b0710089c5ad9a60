package mpa

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"reflect"
	"testing"

	"github.com/siwtun/siwtun/internal/testkit"
)

// Golden captures of Linux kernel siw (rping, both ends siw), CRC on and
// off; the shared captures beside the checkout (../shared/captures) hold
// the originals and their README.
const (
	pcapCRC   = "testdata/siw-rping-crc-mtu1500.pcap"
	pcapNoCRC = "testdata/siw-rping-nocrc-mtu1500.pcap"
)

// recorder is a Handler that keeps every ULPDU and CRC verdict.
type recorder struct {
	ulpdus  [][]byte
	crcOK   []bool
	cur     []byte
	want    int
	t       testing.TB
	inFPDU  bool
	maxSeen int
}

func (r *recorder) BeginFPDU(n int) error {
	if r.inFPDU {
		r.t.Errorf("BeginFPDU(%d) inside an FPDU", n)
	}
	r.inFPDU, r.want, r.cur = true, n, make([]byte, 0, n)
	return nil
}

func (r *recorder) ULPDU(p []byte) error {
	if !r.inFPDU {
		r.t.Errorf("ULPDU outside an FPDU")
	}
	r.cur = append(r.cur, p...)
	if len(r.cur) > r.want {
		r.t.Errorf("ULPDU: %d octets delivered, ULPDU_Length %d", len(r.cur), r.want)
	}
	return nil
}

func (r *recorder) EndFPDU(ok bool) error {
	if len(r.cur) != r.want {
		r.t.Errorf("EndFPDU after %d of %d ULPDU octets", len(r.cur), r.want)
	}
	r.ulpdus = append(r.ulpdus, r.cur)
	r.crcOK = append(r.crcOK, ok)
	r.inFPDU, r.cur = false, nil
	return nil
}

func TestGoldenFrames(t *testing.T) {
	tests := []struct {
		name       string
		pcap       string
		wantReq    string // hex of the whole Request
		wantReqStr string
		wantRepStr string
	}{
		{
			name:       "crc",
			pcap:       pcapCRC,
			wantReq:    hex.EncodeToString([]byte(keyReq)) + "50020004" + "00010001",
			wantReqStr: "mpa req rev 2 C enhanced ird 1 ord 1 pd 0",
			wantRepStr: "mpa rep rev 2 C enhanced ird 1 ord 1 pd 0",
		},
		{
			name:       "nocrc",
			pcap:       pcapNoCRC,
			wantReq:    hex.EncodeToString([]byte(keyReq)) + "10020004" + "00010001",
			wantReqStr: "mpa req rev 2 enhanced ird 1 ord 1 pd 0",
			wantRepStr: "mpa rep rev 2 enhanced ird 1 ord 1 pd 0",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := readPcap(t, tt.pcap)
			reqB, _ := splitFrame(t, s.init)
			repB, _ := splitFrame(t, s.resp)
			if got := hex.EncodeToString(reqB); got != tt.wantReq {
				t.Errorf("Request bytes = %s, want = %s", got, tt.wantReq)
			}
			req, err := ParseFrame(reqB)
			if err != nil {
				t.Fatalf("ParseFrame(request): %v", err)
			}
			rep, err := ParseFrame(repB)
			if err != nil {
				t.Fatalf("ParseFrame(reply): %v", err)
			}
			if got := req.String(); got != tt.wantReqStr {
				t.Errorf("request = %q, want = %q", got, tt.wantReqStr)
			}
			if got := rep.String(); got != tt.wantRepStr {
				t.Errorf("reply = %q, want = %q", got, tt.wantRepStr)
			}
			for _, c := range []struct {
				f    Frame
				wire []byte
			}{{req, reqB}, {rep, repB}} {
				got, err := c.f.Append(nil)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, c.wire) {
					t.Errorf("Append(%v) = %x, want = %x", c.f, got, c.wire)
				}
			}
			// The same frames through FrameReader, one octet at a time.
			var fr FrameReader
			for i := range reqB {
				n, done, err := fr.Feed(reqB[i : i+1])
				if err != nil || n != 1 || done != (i == len(reqB)-1) {
					t.Fatalf("Feed octet %d = %d, %v, %v", i, n, done, err)
				}
			}
			got, err := fr.Frame()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, req) {
				t.Errorf("FrameReader frame = %+v, want = %+v", got, req)
			}
			// Our responder answers siw's Request the way siw did.
			c := Config{Rev: 2, IRD: 1, ORD: 1}
			reply, p, err := Respond(&c, req)
			if err != nil {
				t.Fatalf("Respond: %v", err)
			}
			if !reflect.DeepEqual(reply, rep) {
				t.Errorf("Respond reply = %+v, siw sent = %+v", reply, rep)
			}
			if p.CRC != req.CRC || !p.Enhanced || p.Rev != 2 || p.IRD != 1 || p.ORD != 1 {
				t.Errorf("Respond params = %+v", p)
			}
			if _, err := Complete(&Config{Rev: 2, CRC: req.CRC, IRD: 1, ORD: 1}, req, rep); err != nil {
				t.Errorf("Complete: %v", err)
			}
		})
	}
}

func TestGoldenFPDUs(t *testing.T) {
	tests := []struct {
		name      string
		pcap      string
		crc       bool
		wantFPDUs int
	}{
		{name: "crc", pcap: pcapCRC, crc: true, wantFPDUs: 44},
		{name: "nocrc", pcap: pcapNoCRC, crc: false, wantFPDUs: 44},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := readPcap(t, tt.pcap)
			total := 0
			for _, dir := range []struct {
				name   string
				stream []byte
			}{{"initiator", s.init}, {"responder", s.resp}} {
				_, fpduStream := splitFrame(t, dir.stream)
				fpdus := splitFPDUs(t, fpduStream)
				total += len(fpdus)
				for _, chunk := range []int{len(fpduStream), 1460, 7, 1} {
					rec := &recorder{t: t}
					var r Receiver
					r.Init(tt.crc, false, rec)
					for b := fpduStream; len(b) > 0; {
						n := min(chunk, len(b))
						if m, err := r.Write(b[:n]); err != nil || m != n {
							t.Fatalf("%s: Write = %d, %v", dir.name, m, err)
						}
						b = b[n:]
					}
					if len(rec.ulpdus) != len(fpdus) {
						t.Fatalf("%s chunk %d: %d FPDUs, want %d", dir.name, chunk, len(rec.ulpdus), len(fpdus))
					}
					for i, ok := range rec.crcOK {
						if !ok {
							t.Errorf("%s chunk %d: FPDU %d: CRC mismatch", dir.name, chunk, i)
						}
					}
					if st := r.Stats(); st.CRCErrors != 0 || st.Bytes != uint64(len(fpduStream)) {
						t.Errorf("%s: stats %+v", dir.name, st)
					}
				}
				// Our Sender rebuilds siw's FPDUs octet for octet.
				var snd Sender
				snd.Init(tt.crc, false)
				buf := make([]byte, 0, 1<<16)
				for i, f := range fpdus {
					ulpdu := f[2 : 2+int(binary.BigEndian.Uint16(f))]
					snd.Begin(buf[:0], len(ulpdu))
					snd.Write(ulpdu)
					got := snd.Finish()
					if !bytes.Equal(got, f) {
						t.Errorf("%s FPDU %d: Sender built\n%x\nsiw sent\n%x", dir.name, i, got, f)
					}
				}
				if !tt.crc {
					for i, f := range fpdus {
						if tr := f[len(f)-4:]; !bytes.Equal(tr, []byte{0, 0, 0, 0}) {
							t.Errorf("%s FPDU %d: CRC field %x with CRC off, want zeros", dir.name, i, tr)
						}
					}
				}
			}
			if total != tt.wantFPDUs {
				t.Errorf("%d FPDUs in the capture, want %d", total, tt.wantFPDUs)
			}
		})
	}
}

// TestSiwFPDUVectors checks single FPDUs copied from the captures (the
// first FPDU of each direction: rping's Send carrying its buffer advert,
// and the Read Request): siw's CRC trailer is the CRC32c of everything
// before it, least-significant octet first.
func TestSiwFPDUVectors(t *testing.T) {
	tests := []struct {
		name  string
		wire  string
		crc   bool // siw sent it with CRC on
		ulpdu int
	}{
		{
			name:  "send crc",
			wire:  "0022 4143000000000000000000000001000000000000 55e9a6e1c7c01537c60000000bb8 8cbccdb8",
			crc:   true,
			ulpdu: 0x22,
		},
		{
			name:  "read request crc",
			wire:  "002e 414100000000000000010000000100000000 91b82000000055c655e4a0f000000bb81537c600000055e9a6e1c7c0 98190e2b",
			crc:   true,
			ulpdu: 0x2e,
		},
		{
			name:  "send nocrc",
			wire:  "0022 4143000000000000000000000001000000000000 5651ada2c7c0f023470000000bb8 00000000",
			ulpdu: 0x22,
		},
		{
			name:  "read request nocrc",
			wire:  "002e 414100000000000000010000000100000000 578faf00000055d275f450f000000bb8f023470000005651ada2c7c0 00000000",
			ulpdu: 0x2e,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wire := testkit.Hex(t, tt.wire)
			body, trailer := wire[:len(wire)-4], wire[len(wire)-4:]
			if tt.crc {
				want := crc32.Checksum(body, castagnoli)
				if got := binary.LittleEndian.Uint32(trailer); got != want {
					t.Errorf("trailer %x = LE %#x, CRC32c of the FPDU is %#x", trailer, got, want)
				}
			}
			for _, crcOn := range []bool{false, true} {
				rec := &recorder{t: t}
				var r Receiver
				r.Init(crcOn, false, rec)
				if n, err := r.Write(wire); err != nil || n != len(wire) {
					t.Fatalf("Write = %d, %v", n, err)
				}
				if len(rec.ulpdus) != 1 || len(rec.ulpdus[0]) != tt.ulpdu || !bytes.Equal(rec.ulpdus[0], wire[2:2+tt.ulpdu]) {
					t.Fatalf("ULPDUs %x", rec.ulpdus)
				}
				// With CRC checking on, siw's zero trailer (CRC off) fails.
				if want := !crcOn || tt.crc; rec.crcOK[0] != want {
					t.Errorf("crc checking %v: crcOK = %v, want %v", crcOn, rec.crcOK[0], want)
				}
			}
			var s Sender
			s.Init(tt.crc, false)
			s.Begin(nil, tt.ulpdu)
			s.Write(wire[2 : 2+tt.ulpdu])
			if got := s.Finish(); !bytes.Equal(got, wire) {
				t.Errorf("Sender = %x, want %x", got, wire)
			}
		})
	}
}
