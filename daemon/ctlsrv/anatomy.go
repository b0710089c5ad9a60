package ctlsrv

import (
	"errors"

	"github.com/siwtun/siwtun/anatomy"
	"github.com/siwtun/siwtun/ctl"
)

// anatomyOp answers OpAnatomy.
func (s *Server) anatomyOp(req ctl.AnatomyRequest) ctl.Response {
	rec := s.Anatomy
	if rec == nil {
		return errorResponse(errors.New("this daemon does not record hop stamps"))
	}
	switch req.Action {
	case ctl.AnatomyStart:
		rec.Start()
	case ctl.AnatomyStop:
		rec.Stop()
	case ctl.AnatomyApp:
		recs := make([]anatomy.Record, 0, len(req.App))
		for _, a := range req.App {
			r, _ := a.Record() // checked by ctl.ParseRequest
			recs = append(recs, r)
		}
		if err := rec.AddApp(recs); err != nil {
			return errorResponse(err)
		}
	case ctl.AnatomyGet:
		snap := rec.Snapshot()
		st := &ctl.AnatomyState{On: snap.On, Lost: snap.Lost, Records: make([]ctl.AnatomyRecord, len(snap.Records))}
		for i, r := range snap.Records {
			st.Records[i] = ctl.WireRecord(r)
		}
		return ctl.Response{OK: true, Anatomy: st}
	}
	return ctl.Response{OK: true, Anatomy: &ctl.AnatomyState{On: rec.On()}}
}
