package rping

import (
	"encoding/binary"
	"fmt"
)

// AdvertLen is the length of rping's only message, struct rping_rdma_info:
// a receiver rejects a Send of any other length ("Received bogus data").
const AdvertLen = 16

// Advert names a buffer the peer may access: rping's struct rping_rdma_info,
// every field big-endian on the wire.
//
//	off 0  8 bytes  buf   the buffer's address (the tagged offset)
//	off 8  4 bytes  rkey  its STag
//	off 12 4 bytes  size  its length
//
// The client sends two per ping: its source buffer (the server RDMA READs
// it) and its sink buffer (the server RDMA WRITEs the data back). The
// server's "go ahead" Sends carry 16 bytes it never fills: only their length
// matters.
type Advert struct {
	Addr uint64
	RKey uint32
	Size uint32
}

// Put writes the advert into b, which must hold AdvertLen bytes.
func (a Advert) Put(b []byte) {
	binary.BigEndian.PutUint64(b[0:8], a.Addr)
	binary.BigEndian.PutUint32(b[8:12], a.RKey)
	binary.BigEndian.PutUint32(b[12:16], a.Size)
}

// Append appends the advert's 16 bytes to b.
func (a Advert) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, a.Addr)
	b = binary.BigEndian.AppendUint32(b, a.RKey)
	return binary.BigEndian.AppendUint32(b, a.Size)
}

// ParseAdvert decodes a received message; anything but exactly AdvertLen
// bytes is an error, as in rping.
func ParseAdvert(b []byte) (Advert, error) {
	if len(b) != AdvertLen {
		return Advert{}, fmt.Errorf("rping: message of %d bytes, want %d", len(b), AdvertLen)
	}
	return Advert{
		Addr: binary.BigEndian.Uint64(b[0:8]),
		RKey: binary.BigEndian.Uint32(b[8:12]),
		Size: binary.BigEndian.Uint32(b[12:16]),
	}, nil
}
