package ctl

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/siwtun/siwtun/anatomy"
)

// The anatomy op drives the daemon's recorder of hop stamps (package
// anatomy): start it before a ping-pong, stop it after, hand it the
// applications' own stamps and fetch everything, from both daemons, to
// take the round trip apart (`siwtun perf write --lat --anatomy`).

// Actions of an AnatomyRequest.
const (
	// AnatomyStart forgets the stamps of any earlier run and records.
	AnatomyStart = "start"
	// AnatomyStop stops recording; the stamps stay.
	AnatomyStop = "stop"
	// AnatomyGet answers with the state and the stamps.
	AnatomyGet = "get"
	// AnatomyApp adds an application's stamps (AnatomyRequest.App).
	AnatomyApp = "app"
)

// AnatomyRecord is one stamp on the wire: hop, source port, destination
// port, sequence number, length, time (CLOCK_MONOTONIC nanoseconds), as
// one JSON array.
type AnatomyRecord [6]int64

// AnatomyRequest is the request of OpAnatomy.
type AnatomyRequest struct {
	// Action is AnatomyStart, AnatomyStop, AnatomyGet or AnatomyApp.
	Action string `json:"action"`
	// App holds, with AnatomyApp, an application's Post and Seen stamps
	// (as many as fit a request line: Client.AnatomyApp splits them).
	App []AnatomyRecord `json:"app,omitempty"`
}

// Check validates r.
func (r AnatomyRequest) Check() error {
	switch r.Action {
	case AnatomyStart, AnatomyStop, AnatomyGet:
		if len(r.App) > 0 {
			return fmt.Errorf("anatomy: app stamps only with action %q", AnatomyApp)
		}
	case AnatomyApp:
		for _, a := range r.App {
			if _, err := recordOf(a); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("anatomy: unknown action %q (want start, stop, get or app)", r.Action)
	}
	return nil
}

// AnatomyState answers OpAnatomy: whether the daemon records, and with
// AnatomyGet its stamps.
type AnatomyState struct {
	On      bool            `json:"on"`
	Records []AnatomyRecord `json:"records,omitempty"`
	// Lost counts stamps the daemon could not keep (its ring's oldest).
	Lost uint64 `json:"lost,omitempty"`
}

// recordOf checks and converts a stamp from the wire.
func recordOf(a AnatomyRecord) (anatomy.Record, error) {
	h := anatomy.Hop(a[0])
	if a[0] < 0 || a[0] > 255 || !h.Valid() {
		return anatomy.Record{}, fmt.Errorf("anatomy: bad hop %d", a[0])
	}
	for _, p := range a[1:3] {
		if p < 0 || p > 0xffff {
			return anatomy.Record{}, fmt.Errorf("anatomy: bad port %d", p)
		}
	}
	for _, v := range a[3:5] {
		if v < 0 || v > 0xffffffff {
			return anatomy.Record{}, fmt.Errorf("anatomy: bad sequence number or length %d", v)
		}
	}
	return anatomy.Record{Hop: h, SrcPort: uint16(a[1]), DstPort: uint16(a[2]), Seq: uint32(a[3]), Len: uint32(a[4]), T: a[5]}, nil
}

// wireRecord converts a stamp for the wire.
func wireRecord(r anatomy.Record) AnatomyRecord {
	return AnatomyRecord{int64(r.Hop), int64(r.SrcPort), int64(r.DstPort), int64(r.Seq), int64(r.Len), r.T}
}

// anatomyOp answers OpAnatomy.
func (s *Server) anatomyOp(req AnatomyRequest) Response {
	rec := s.Anatomy
	if rec == nil {
		return errorResponse(errors.New("this daemon does not record hop stamps"))
	}
	switch req.Action {
	case AnatomyStart:
		rec.Start()
	case AnatomyStop:
		rec.Stop()
	case AnatomyApp:
		recs := make([]anatomy.Record, 0, len(req.App))
		for _, a := range req.App {
			r, _ := recordOf(a) // checked by ParseRequest
			recs = append(recs, r)
		}
		if err := rec.AddApp(recs); err != nil {
			return errorResponse(err)
		}
	case AnatomyGet:
		snap := rec.Snapshot()
		st := &AnatomyState{On: snap.On, Lost: snap.Lost, Records: make([]AnatomyRecord, len(snap.Records))}
		for i, r := range snap.Records {
			st.Records[i] = wireRecord(r)
		}
		return Response{OK: true, Anatomy: st}
	}
	return Response{OK: true, Anatomy: &AnatomyState{On: rec.On()}}
}

// Anatomy sends an anatomy action other than AnatomyApp and returns the
// daemon's answer.
func (c *Client) Anatomy(action string) (AnatomyState, error) {
	r, err := c.Call(Request{Op: OpAnatomy, Anatomy: &AnatomyRequest{Action: action}})
	if err != nil {
		return AnatomyState{}, err
	}
	if r.Anatomy == nil {
		return AnatomyState{}, fmt.Errorf("%s: response without anatomy", c.dev)
	}
	return *r.Anatomy, nil
}

// AnatomyRecords returns the daemon's stamps.
func (c *Client) AnatomyRecords() ([]anatomy.Record, AnatomyState, error) {
	st, err := c.Anatomy(AnatomyGet)
	if err != nil {
		return nil, st, err
	}
	recs := make([]anatomy.Record, 0, len(st.Records))
	for _, a := range st.Records {
		r, err := recordOf(a)
		if err != nil {
			return nil, st, fmt.Errorf("%s: %w", c.dev, err)
		}
		recs = append(recs, r)
	}
	return recs, st, nil
}

// AnatomyApp hands an application's stamps to the daemon, in as many
// requests as the request size limit asks for.
func (c *Client) AnatomyApp(recs []anatomy.Record) error {
	const room = MaxRequestSize - 128 // the request's envelope and newline
	for len(recs) > 0 {
		req := AnatomyRequest{Action: AnatomyApp}
		size := 0
		for len(recs) > 0 {
			a := wireRecord(recs[0])
			b, _ := json.Marshal(a)
			if size+len(b)+1 > room {
				break
			}
			size += len(b) + 1
			req.App = append(req.App, a)
			recs = recs[1:]
		}
		if _, err := c.Call(Request{Op: OpAnatomy, Anatomy: &req}); err != nil {
			return err
		}
	}
	return nil
}
