package rdmap

import (
	"encoding/binary"
	"fmt"
)

// ReadRequestLen is the length in octets of the RDMA Read Request header
// that follows the untagged DDP header (RFC 5040 §4.4).
const ReadRequestLen = 28

// ReadRequest is the RDMA Read Request header (RFC 5040 §4.4). The
// responder answers with a Read Response of Size octets read from
// (SrcSTag, SrcTO) and targeted at (SinkSTag, SinkTO).
type ReadRequest struct {
	// SinkSTag is the requester's STag the Read Response is placed into.
	SinkSTag uint32
	// SinkTO is the tagged offset in the sink buffer.
	SinkTO uint64
	// Size is the RDMA Read Message Size in octets (zero is allowed).
	Size uint32
	// SrcSTag is the responder's STag to read from (the remote key).
	SrcSTag uint32
	// SrcTO is the tagged offset in the source buffer.
	SrcTO uint64
}

// Marshal writes the ReadRequestLen octets of r to the front of b and
// returns ReadRequestLen. It panics if b is shorter.
func (r *ReadRequest) Marshal(b []byte) int {
	_ = b[ReadRequestLen-1]
	binary.BigEndian.PutUint32(b[0:4], r.SinkSTag)
	binary.BigEndian.PutUint64(b[4:12], r.SinkTO)
	binary.BigEndian.PutUint32(b[12:16], r.Size)
	binary.BigEndian.PutUint32(b[16:20], r.SrcSTag)
	binary.BigEndian.PutUint64(b[20:28], r.SrcTO)
	return ReadRequestLen
}

// Unmarshal decodes the Read Request header at the front of b (the octets
// after the untagged DDP header). Extra octets are ignored; the only error
// is a short buffer (wrapping ErrShort), in which case r is unchanged.
func (r *ReadRequest) Unmarshal(b []byte) error {
	if len(b) < ReadRequestLen {
		return fmt.Errorf("rdmap: read request: need %d octets, have %d: %w", ReadRequestLen, len(b), ErrShort)
	}
	*r = ReadRequest{
		SinkSTag: binary.BigEndian.Uint32(b[0:4]),
		SinkTO:   binary.BigEndian.Uint64(b[4:12]),
		Size:     binary.BigEndian.Uint32(b[12:16]),
		SrcSTag:  binary.BigEndian.Uint32(b[16:20]),
		SrcTO:    binary.BigEndian.Uint64(b[20:28]),
	}
	return nil
}

// String returns a one-line summary of r.
func (r ReadRequest) String() string {
	return fmt.Sprintf("read request sink 0x%x@0x%x size %d src 0x%x@0x%x",
		r.SinkSTag, r.SinkTO, r.Size, r.SrcSTag, r.SrcTO)
}
