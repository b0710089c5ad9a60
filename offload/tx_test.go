package offload

import (
	"bytes"
	"io"
	"sync"
	"testing"

	"github.com/siwtun/siwtun/iwarp/ddp"
	"github.com/siwtun/siwtun/iwarp/rdmap"
)

// TestFPDUPayloadShortReads: a write whose FPDUs gVisor takes in pieces
// smaller than the write (a short write) is built once in a buffer the
// device lends and copied from there, giving the octets a whole read
// gives; the buffer goes back once the write is handed over.
func TestFPDUPayloadShortReads(t *testing.T) {
	msg := make([]byte, 3000)
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	var lent, returned int
	var pool sync.Pool
	pool.New = func() any {
		lent++
		b := make([]byte, 0, maxBatch)
		return &b
	}
	// read builds the write's three FPDUs (1024 octets of payload each at
	// most) and reads it chunk octets at a time (0: all at once).
	read := func(chunk int) []byte {
		ts := &txState{emss: 1100, bufs: &pool}
		ts.mpa.Init(true, false)
		ts.src[0], ts.nsrc = msg, 1
		h := &ddp.Header{Tagged: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpWrite), STag: 0x100}
		f := &fpduPayload{t: ts, h: h, hl: h.Len(), base: 0x1000, msgLen: uint64(len(msg)), full: 1024, count: 3}
		for n := uint64(0); n < f.msgLen; n += min(f.full, f.msgLen-n) {
			f.total += ts.mpa.WireLenAt(uint64(f.total), f.hl+int(min(f.full, f.msgLen-n)))
		}
		var out []byte
		for {
			p := make([]byte, f.total+16)
			if chunk > 0 {
				p = p[:chunk]
			}
			n, err := f.Read(p)
			out = append(out, p[:n]...)
			if err == io.EOF || f.Len() == 0 {
				break
			}
		}
		if f.buf != nil {
			t.Fatalf("chunk %d: the lent buffer was kept after the write", chunk)
		}
		if chunk > 0 {
			returned++
		}
		return out
	}
	whole := read(0)
	if lent != 0 {
		t.Fatalf("a whole read borrowed %d buffers", lent)
	}
	for _, chunk := range []int{7, 1000, len(whole) - 1} {
		if got := read(chunk); !bytes.Equal(got, whole) {
			t.Fatalf("read %d octets at a time: %d octets differ from the whole read's %d", chunk, len(got), len(whole))
		}
	}
	if lent > returned {
		t.Errorf("%d buffers lent for %d short writes", lent, returned)
	}
}
