package offload

import (
	"crypto/rand"
	"encoding/binary"
)

// STags must not be predictable (RFC 5042 §5.1.1, §6.4): a peer that has
// seen the STag of one region, or every STag a slot has had so far, must
// not be able to name another region or the slot's next region. An STag is
// a 24-bit index and an 8-bit key, as in Linux siw; here the index is a
// keyed permutation of the region table's slot number and the key a keyed
// permutation of the slot's generation, both under a secret drawn from
// crypto/rand when the table is made. A permutation keeps what the table
// needs: one index per slot (Lookup inverts it without a map), and 256
// different keys for a slot's next 256 regions, so a stale STag never
// names a newer region of its slot.

// stagSecret keys the permutations of one region table.
type stagSecret [4]uint64

func newSTagSecret() stagSecret {
	var b [32]byte
	rand.Read(b[:]) // never fails on Linux (Go 1.24+ crashes the process instead)
	var s stagSecret
	for i := range s {
		s[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return s
}

// mix is splitmix64's finalizer: every input bit changes about half the
// output bits.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// feistel permutes the 2·half-bit value v with four rounds keyed by s and
// tweak; inverse undoes it.
func (s *stagSecret) feistel(v uint32, half uint, tweak uint64, inverse bool) uint32 {
	mask := uint32(1)<<half - 1
	l, r := v>>half&mask, v&mask
	round := func(i int, x uint32) uint32 {
		return uint32(mix(s[i]^tweak<<32^uint64(x))) & mask
	}
	if !inverse {
		for i := range 4 {
			l, r = r, l^round(i, r)
		}
	} else {
		for i := 3; i >= 0; i-- {
			l, r = r^round(i, l), l
		}
	}
	return l<<half | r
}

// index is slot's 24-bit STag index.
func (s *stagSecret) index(slot uint32) uint32 { return s.feistel(slot, 12, 0, false) }

// slot is the slot whose STag index is idx.
func (s *stagSecret) slot(idx uint32) uint32 { return s.feistel(idx, 12, 0, true) }

// key is the 8-bit key of a slot's gen-th region.
func (s *stagSecret) key(slot uint32, gen uint8) uint8 {
	return uint8(s.feistel(uint32(gen), 4, 1<<24|uint64(slot), false))
}
