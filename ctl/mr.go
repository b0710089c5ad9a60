package ctl

import (
	"errors"
)

// MR is a registered memory region as the engine's region table holds it
// (like `rdma resource show mr`).
type MR struct {
	// STag is its steering tag (lkey and rkey).
	STag uint32 `json:"stag"`
	// PDN is its protection domain.
	PDN uint32 `json:"pdn"`
	// Addr and Len are its bounds: the tagged offset of its first byte and
	// its length in bytes.
	Addr uint64 `json:"addr"`
	Len  int    `json:"len"`
	// Access are its access rights ("LOCAL_WRITE|REMOTE_WRITE").
	Access string `json:"access"`
}

// MRLister is implemented by a Provider that can list its device's memory
// regions for OpMR (the engine's Provider does).
type MRLister interface {
	// MRs returns the valid regions, by STag.
	MRs() []MR
}

// MRs implements MRLister.
func (p *engineProvider) MRs() []MR {
	var out []MR
	for _, r := range p.eng.Regions().List() {
		out = append(out, MR{STag: r.STag(), PDN: r.PD(), Addr: r.Addr(), Len: r.Len(), Access: r.Access().String()})
	}
	return out
}

// mrs answers OpMR.
func (s *Server) mrs() Response {
	l, ok := s.p.(MRLister)
	if !ok {
		return errorResponse(errors.New("this daemon cannot list its memory regions"))
	}
	return Response{OK: true, MRs: l.MRs()}
}

// MRs asks for the device's registered memory regions.
func (c *Client) MRs() ([]MR, error) {
	resp, err := c.Call(Request{Op: OpMR})
	if err != nil {
		return nil, err
	}
	return resp.MRs, nil
}

var _ MRLister = (*engineProvider)(nil)
