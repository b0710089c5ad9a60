package mpa

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

// markedStream builds a stream of FPDUs with the given options and returns
// it with each FPDU's stream offset.
func markedStream(rng *rand.Rand, n int, crc, markers bool, maxLen int) (stream []byte, starts []uint64, ulpdus [][]byte) {
	var s Sender
	s.Init(crc, markers)
	if rng.IntN(2) == 0 {
		s.SetMarkerPtr(PtrFromULPDULength)
	}
	for range n {
		l := rng.IntN(maxLen + 1)
		if rng.IntN(8) == 0 {
			l = rng.IntN(4)
		}
		u := make([]byte, l)
		for i := range u {
			u[i] = byte(rng.Uint32())
		}
		starts = append(starts, s.StreamOffset())
		s.Begin(stream, l)
		s.Write(u)
		stream = s.Finish()
		ulpdus = append(ulpdus, u)
	}
	return stream, starts, ulpdus
}

// feedRandom writes stream to r in random chunks (many of 1 octet).
func feedRandom(rng *rand.Rand, r *Receiver, stream []byte) (int, error) {
	done := 0
	for len(stream) > 0 {
		var n int
		switch rng.IntN(4) {
		case 0:
			n = 1
		case 1:
			n = rng.IntN(8) + 1
		case 2:
			n = rng.IntN(1500) + 1
		default:
			n = rng.IntN(9000) + 1
		}
		n = min(n, len(stream))
		m, err := r.Write(stream[:n])
		done += m
		if err != nil {
			return done, err
		}
		stream = stream[n:]
	}
	return done, nil
}

func TestRoundTripProperty(t *testing.T) {
	for _, crc := range []bool{false, true} {
		for _, markers := range []bool{false, true} {
			for seed := range uint64(20) {
				rng := rand.New(rand.NewPCG(seed, 0x6d7061))
				maxLen := 3000
				if seed%4 == 3 {
					maxLen = 9000
				}
				stream, starts, want := markedStream(rng, 60, crc, markers, maxLen)
				rec := &recorder{t: t}
				var r Receiver
				r.Init(crc, markers, rec)
				if n, err := feedRandom(rng, &r, stream); err != nil || n != len(stream) {
					t.Fatalf("crc=%v markers=%v seed=%d: fed %d of %d: %v", crc, markers, seed, n, len(stream), err)
				}
				if len(rec.ulpdus) != len(want) {
					t.Fatalf("seed %d: %d ULPDUs, want %d", seed, len(rec.ulpdus), len(want))
				}
				for i := range want {
					if !bytes.Equal(rec.ulpdus[i], want[i]) || !rec.crcOK[i] {
						t.Fatalf("crc=%v markers=%v seed=%d: FPDU %d differs or bad CRC", crc, markers, seed, i)
					}
				}

				// A corrupted octet inside the ULPDU (not a Marker, not the
				// length): the CRC catches it, or with CRC off the data differs.
				i := rng.IntN(len(want))
				for len(want[i]) == 0 {
					i = rng.IntN(len(want))
				}
				var pos uint64
				for {
					pos = starts[i] + 2 + uint64(rng.IntN(len(want[i])+8))
					if markers && starts[i]%512 == 0 {
						pos += 4
					}
					end := uint64(len(stream))
					if i+1 < len(starts) {
						end = starts[i+1]
					}
					if pos < end-4 && (!markers || pos%512 >= 4) {
						break
					}
				}
				bad := append([]byte(nil), stream...)
				bad[pos] ^= 0x40
				rec = &recorder{t: t}
				r.Init(crc, markers, rec)
				if _, err := feedRandom(rng, &r, bad); err != nil {
					t.Fatalf("seed %d: corrupted data octet gave error %v", seed, err)
				}
				if crc {
					for j, ok := range rec.crcOK {
						if ok == (j == i) {
							t.Fatalf("seed %d: corrupted FPDU %d: crcOK %v for FPDU %d", seed, i, ok, j)
						}
					}
					if r.Stats().CRCErrors != 1 {
						t.Errorf("seed %d: CRCErrors = %d", seed, r.Stats().CRCErrors)
					}
				}

				if !markers {
					continue
				}
				// A corrupted Marker: FPDUPTR high octet.
				m := uint64(rng.IntN(len(stream)/512+1)) * 512
				if m >= uint64(len(stream)) {
					m = 0
				}
				bad = append([]byte(nil), stream...)
				bad[m+2] ^= 0x10
				rec = &recorder{t: t}
				r.Init(crc, markers, rec)
				n, err := feedRandom(rng, &r, bad)
				if crc {
					// The CRC covers the Marker: damaged with it, the
					// FPDU ends in the CRC error, not the Marker's
					// (RFC 5044 §8), and the stream goes on.
					if err != nil || n != len(bad) || r.Stats().CRCErrors != 1 || r.Stats().BadMarkers != 1 {
						t.Fatalf("seed %d: corrupted marker at %d: fed %d of %d, %v, %+v; want a CRC error", seed, m, n, len(bad), err, r.Stats())
					}
					continue
				}
				var me *Error
				if !errors.As(err, &me) || me.Code != CodeMarkerMismatch {
					t.Fatalf("seed %d: corrupted marker at %d: err %v, want code 0x03", seed, m, err)
				}
				if uint64(n) != m+4 {
					t.Errorf("seed %d: consumed %d, marker ends at %d", seed, n, m+4)
				}
				if r.Stats().BadMarkers != 1 {
					t.Errorf("seed %d: BadMarkers = %d", seed, r.Stats().BadMarkers)
				}
				if _, err2 := r.Write([]byte{0}); err2 != err {
					t.Errorf("error not sticky: %v", err2)
				}
			}
		}
	}
}
