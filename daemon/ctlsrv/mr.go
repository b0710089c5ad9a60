package ctlsrv

import (
	"errors"

	"github.com/siwtun/siwtun/ctl"
)

// MRLister is implemented by a Provider that can list its device's memory
// regions for OpMR (the engine's Provider does).
type MRLister interface {
	// MRs returns the valid regions, by STag.
	MRs() []ctl.MR
}

// MRs implements MRLister.
func (p *engineProvider) MRs() []ctl.MR {
	var out []ctl.MR
	for _, r := range p.eng.Regions().List() {
		out = append(out, ctl.MR{STag: r.STag(), PDN: r.PD(), Addr: r.Addr(), Len: r.Len(), Access: r.Access().String()})
	}
	return out
}

// mrs answers OpMR.
func (s *Server) mrs() ctl.Response {
	l, ok := s.p.(MRLister)
	if !ok {
		return errorResponse(errors.New("this daemon cannot list its memory regions"))
	}
	return ctl.Response{OK: true, MRs: l.MRs()}
}

var _ MRLister = (*engineProvider)(nil)
