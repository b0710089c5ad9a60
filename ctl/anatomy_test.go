package ctl

import (
	"testing"

	"github.com/siwtun/siwtun/anatomy"
)

func TestServerAnatomy(t *testing.T) {
	rec := anatomy.NewRecorder()
	s := startServer(t, fakeProvider{}, func(s *Server) { s.Anatomy = rec })
	c := dial(t, s.Path())
	st, err := c.Anatomy(AnatomyGet)
	if err != nil || st.On || len(st.Records) != 0 {
		t.Fatalf("get before start: %+v, %v", st, err)
	}
	if err := c.AnatomyApp([]anatomy.Record{{Hop: anatomy.Post, T: 1}}); err == nil {
		t.Fatal("app stamps taken before start")
	}
	if st, err := c.Anatomy(AnatomyStart); err != nil || !st.On || !rec.On() {
		t.Fatalf("start: %+v, %v", st, err)
	}
	rec.Stamp(anatomy.TUNRead, 40000, 18515, 0xfffffff0, 24, 1234)
	// More application stamps than one request line holds.
	var app []anatomy.Record
	for i := range 1000 {
		app = append(app, anatomy.Record{Hop: anatomy.Seen, SrcPort: 18515, DstPort: 40000, T: 1_000_000_000_000 + int64(i)})
	}
	if err := c.AnatomyApp(app); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Anatomy(AnatomyStop); err != nil || st.On || rec.On() {
		t.Fatalf("stop: %+v, %v", st, err)
	}
	recs, st, err := c.AnatomyRecords()
	if err != nil {
		t.Fatal(err)
	}
	if st.On || len(recs) != 1001 {
		t.Fatalf("get: on %v, %d records, want 1001", st.On, len(recs))
	}
	if want := (anatomy.Record{Hop: anatomy.TUNRead, SrcPort: 40000, DstPort: 18515, Seq: 0xfffffff0, Len: 24, T: 1234}); recs[0] != want {
		t.Errorf("record 0 = %+v, want %+v", recs[0], want)
	}
	if recs[1000] != app[999] {
		t.Errorf("last record %+v, want %+v", recs[1000], app[999])
	}
}

func TestServerAnatomyRefused(t *testing.T) {
	s := startServer(t, fakeProvider{})
	c := dial(t, s.Path())
	if _, err := c.Anatomy(AnatomyStart); err == nil {
		t.Fatal("a server without a recorder started one")
	}
	r := dialRaw(t, s.Path())
	for _, tc := range []struct{ req, err string }{
		{`{"op":"anatomy"}`, "needs the field anatomy"},
		{`{"op":"anatomy","anatomy":{"action":"dance"}}`, "unknown action"},
		{`{"op":"anatomy","anatomy":{"action":"get","app":[[1,1,2,0,0,5]]}}`, "only with action"},
		{`{"op":"anatomy","anatomy":{"action":"app","app":[[99,1,2,0,0,5]]}}`, "bad hop"},
		{`{"op":"anatomy","anatomy":{"action":"app","app":[[1,70000,2,0,0,5]]}}`, "bad port"},
		{`{"op":"anatomy","anatomy":{"action":"app","app":[[1,1,2,-1,0,5]]}}`, "bad sequence"},
		{`{"op":"stats","anatomy":{"action":"get"}}`, "only valid with op"},
	} {
		r.send(tc.req + "\n")
		r.wantError(tc.err)
	}
	r.wantLink()
}
