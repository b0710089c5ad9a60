package mpa

import (
	"encoding/binary"
	"os"
	"testing"

	"github.com/siwtun/siwtun/iwarp/mpa/internal/crc32c"
)

// TestSiwBadCRCGolden: two FPDUs Linux siw (6.12, in the peer VM) sent in
// make interop's p2p-read scenario, one after the other on the wire
// (testdata/siw-bad-crc-fpdus.bin, frames 2867 and 2868 of that run's
// capture). The second carries a CRC32c that does not match its octets;
// its TCP checksum was good, and tshark found the same: "0xc8f9af99 (Bad
// CRC32, should be 0xc35100ef)". The receiver must pass the first and
// refuse the second, and the CRC it computes must be tshark's (tshark
// reads the field's four octets big-endian; MPA sends the CRC32c value
// least significant octet first, as siw and siwtun do).
func TestSiwBadCRCGolden(t *testing.T) {
	b, err := os.ReadFile("testdata/siw-bad-crc-fpdus.bin")
	if err != nil {
		t.Fatal(err)
	}
	fpdus := splitFPDUs(t, b)
	if len(fpdus) != 2 {
		t.Fatalf("%d FPDUs in the golden, want 2", len(fpdus))
	}
	bad := fpdus[1]
	if got := binary.BigEndian.Uint32(bad[len(bad)-4:]); got != 0xc8f9af99 {
		t.Fatalf("the golden's second CRC field is %#08x, want siw's 0xc8f9af99", got)
	}
	var field [4]byte
	binary.LittleEndian.PutUint32(field[:], crc32c.Checksum(bad[:len(bad)-4]))
	if got := binary.BigEndian.Uint32(field[:]); got != 0xc35100ef {
		t.Errorf("CRC32c of the second FPDU, as tshark reads the field: %#08x, want 0xc35100ef", got)
	}
	for _, chunk := range []int{len(b), 1448, 100, 7} {
		rec := &recorder{t: t}
		var r Receiver
		r.Init(true, false, rec)
		for p := b; len(p) > 0; {
			n := min(chunk, len(p))
			if _, err := r.Write(p[:n]); err != nil {
				t.Fatalf("chunk %d: Write: %v", chunk, err)
			}
			p = p[n:]
		}
		if len(rec.crcOK) != 2 || !rec.crcOK[0] || rec.crcOK[1] {
			t.Errorf("chunk %d: CRC verdicts %v, want [true false]", chunk, rec.crcOK)
		}
		if st := r.Stats(); st.CRCErrors != 1 {
			t.Errorf("chunk %d: %d CRC errors counted, want 1", chunk, st.CRCErrors)
		}
	}
}
