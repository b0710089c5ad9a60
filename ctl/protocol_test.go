package ctl

import (
	"errors"
	"testing"
)

func TestDialNoDaemon(t *testing.T) {
	_, err := Dial(SocketPath(t.TempDir(), "siwtun7"))
	if !errors.Is(err, ErrNoDaemon) {
		t.Fatalf("Dial: %v, want ErrNoDaemon", err)
	}
	if want := "no siwtun daemon for siwtun7 (is `siwtun up --dev siwtun7` running?)"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
}

func TestSocketPath(t *testing.T) {
	if got := SocketPath("", "siwtun0"); got != "/run/siwtun/siwtun0.ctl" {
		t.Errorf("SocketPath = %q", got)
	}
	if got := DevFromPath("/run/siwtun/siwtun3.ctl"); got != "siwtun3" {
		t.Errorf("DevFromPath = %q", got)
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{`{"op":"devinfo"}`, `{"op":"qp","qp":3}`, `{"op":"qp","qp":-1}`, `{`, `[]`, `{"op":"link"} x`, `{"op":"anatomy","anatomy":{"action":"app","app":[[1,2,3,4,5,6]]}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := ParseRequest(b)
		if err != nil {
			return
		}
		switch req.Op {
		case OpDevInfo, OpLink, OpStats:
			if req.QP != nil {
				t.Errorf("accepted qp with op %q", req.Op)
			}
		case OpQP:
		case OpAnatomy:
			if req.Anatomy == nil || req.Anatomy.Check() != nil {
				t.Errorf("accepted anatomy request %+v", req.Anatomy)
			}
		default:
			t.Errorf("accepted op %q", req.Op)
		}
	})
}
