package tcpperf

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"
)

func TestHeaderGolden(t *testing.T) {
	for _, tc := range []struct {
		h    Header
		want []byte
	}{
		{Header{Bulk, 65536}, []byte{'S', 'T', 'P', 'F', 1, 0, 0, 0, 0, 1, 0, 0}},
		{Header{RR, 64}, []byte{'S', 'T', 'P', 'F', 2, 0, 0, 0, 0, 0, 0, 64}},
	} {
		got := tc.h.Marshal()
		if !bytes.Equal(got[:], tc.want) {
			t.Errorf("%+v: % x, want % x", tc.h, got, tc.want)
		}
		back, err := ParseHeader(got[:])
		if err != nil || back != tc.h {
			t.Errorf("ParseHeader(% x) = %+v, %v", got, back, err)
		}
	}
}

func TestParseHeaderErrors(t *testing.T) {
	good := Header{RR, 64}.Marshal()
	for _, tc := range []struct {
		name string
		edit func(b []byte) []byte
		want string
	}{
		{"short", func(b []byte) []byte { return b[:11] }, "11 bytes"},
		{"magic", func(b []byte) []byte { b[0] = 'X'; return b }, "magic"},
		{"mode", func(b []byte) []byte { b[4] = 3; return b }, "unknown mode 3"},
		{"reserved", func(b []byte) []byte { b[6] = 1; return b }, "reserved"},
		{"size 0", func(b []byte) []byte { b[11] = 0; return b }, "size 0"},
		{"size too big", func(b []byte) []byte { b[8] = 2; return b }, "size 33554496"},
	} {
		b := good
		_, err := ParseHeader(tc.edit(b[:]))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

func TestSummaryGolden(t *testing.T) {
	s := Summary{Bytes: 0x0102030405060708, Nanos: 3e9}
	b := s.Marshal()
	want := []byte{1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0xb2, 0xd0, 0x5e, 0x00}
	if !bytes.Equal(b[:], want) {
		t.Fatalf("% x, want % x", b, want)
	}
	if got, err := ParseSummary(b[:]); err != nil || got != s {
		t.Fatalf("ParseSummary = %+v, %v", got, err)
	}
	if _, err := ParseSummary(b[:15]); err == nil {
		t.Fatal("15-byte summary accepted")
	}
}

func FuzzParseHeader(f *testing.F) {
	b := Header{Bulk, 65536}.Marshal()
	f.Add(b[:])
	f.Add([]byte("STPF"))
	f.Fuzz(func(t *testing.T, in []byte) {
		h, err := ParseHeader(in)
		if err != nil {
			return
		}
		out := h.Marshal()
		if !bytes.Equal(out[:], in) {
			t.Fatalf("% x parsed as %+v, marshals back as % x", in, h, out)
		}
	})
}

// pipeConn is one end of an in-memory full-duplex connection with
// half-close.
type pipeConn struct {
	r *io.PipeReader
	w *io.PipeWriter
}

func (p pipeConn) Read(b []byte) (int, error)  { return p.r.Read(b) }
func (p pipeConn) Write(b []byte) (int, error) { return p.w.Write(b) }
func (p pipeConn) CloseWrite() error           { return p.w.Close() }

func connPair() (pipeConn, pipeConn) {
	ar, bw := io.Pipe()
	br, aw := io.Pipe()
	return pipeConn{ar, aw}, pipeConn{br, bw}
}

func TestRunServe(t *testing.T) {
	for _, h := range []Header{{Bulk, 4096}, {RR, 64}, {RR, 65536}} {
		t.Run(h.Mode.String(), func(t *testing.T) {
			cli, srv := connPair()
			type res struct {
				r   Result
				err error
			}
			done := make(chan res, 1)
			go func() {
				r, err := Serve(srv)
				done <- res{r, err}
			}()
			got, err := Run(cli, h, 50*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			s := <-done
			if s.err != nil {
				t.Fatal(s.err)
			}
			if got.Mode != h.Mode.String() || got.Size != h.Size || got.Bytes == 0 || got.Seconds <= 0 {
				t.Fatalf("client result %+v", got)
			}
			switch h.Mode {
			case Bulk:
				if got.Bytes != s.r.Bytes || got.MBps <= 0 || got.Bytes%uint64(h.Size) != 0 {
					t.Fatalf("client %+v, server %+v", got, s.r)
				}
			case RR:
				if got.RoundTrips == 0 || got.RoundTrips != s.r.RoundTrips || got.RTTMedian <= 0 ||
					got.RTTAvg <= 0 || got.RTTP99 < got.RTTMedian {
					t.Fatalf("client %+v, server %+v", got, s.r)
				}
			}
		})
	}
}

func TestRRResult(t *testing.T) {
	us := time.Microsecond
	r := rrResult(64, []time.Duration{40 * us, 10 * us, 30 * us, 20 * us}, time.Millisecond)
	want := Result{Mode: "rr", Size: 64, Bytes: 512, Seconds: 0.001, RoundTrips: 4,
		RTTMedian: 25, RTTAvg: 25, RTTP99: 40}
	if r != want {
		t.Fatalf("%+v, want %+v", r, want)
	}
}

func TestServeBadHeader(t *testing.T) {
	cli, srv := connPair()
	go func() { cli.Write([]byte("GET / HTTP/1.1\r\n")) }()
	if _, err := Serve(srv); err == nil || !strings.Contains(err.Error(), "magic") {
		t.Fatalf("Serve: %v", err)
	}
}
