package uverbs

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/verbs"
)

// TestOneValidator posts the same malformed work requests to a QP over the
// verbs socket and to the in-process QP it is connected to: both refuse
// each with ErrInvalidWR and the same message (but for the QP number), and
// both take good requests.
func TestOneValidator(t *testing.T) {
	r := newRig(t)
	remote, local := newEnd(t, r.dial(), 8), newEnd(t, r.peer, 8)
	connect(t, remote, local)
	sgl := func(n int) []verbs.SGE { return make([]verbs.SGE, n) }
	badSends := []struct {
		name string
		wr   verbs.SendWR
	}{
		{"unknown opcode", verbs.SendWR{ID: 1, Opcode: 99}},
		{"unknown flags", verbs.SendWR{ID: 2, Opcode: verbs.WRSend, Flags: 1 << 10}},
		{"too many SGEs", verbs.SendWR{ID: 3, Opcode: verbs.WRWrite, SGL: sgl(verbs.MaxSGE + 1)}},
		{"inline too long", verbs.SendWR{ID: 4, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: make([]byte, verbs.MaxInline+1)}},
		{"inline Read", verbs.SendWR{ID: 5, Opcode: verbs.WRRead, Flags: verbs.FlagInline}},
		{"Read with 2 SGEs", verbs.SendWR{ID: 6, Opcode: verbs.WRRead, SGL: sgl(2)}},
	}
	// refusal posts one request and returns its error with the QP number
	// taken out.
	refusal := func(qp *verbs.QP, post func() (int, error)) string {
		n, err := post()
		if n != 0 || !errors.Is(err, verbs.ErrInvalidWR) {
			t.Fatalf("posted %d, %v; want 0, ErrInvalidWR", n, err)
		}
		return strings.Replace(err.Error(), fmt.Sprintf("QP %d ", qp.Num()), "QP n ", 1)
	}
	for _, tt := range badSends {
		var msgs []string
		for _, e := range []*side{remote, local} {
			msgs = append(msgs, refusal(e.qp, func() (int, error) { return e.qp.PostSend([]verbs.SendWR{tt.wr}) }))
		}
		if msgs[0] != msgs[1] {
			t.Errorf("%s: over the socket %q, in-process %q", tt.name, msgs[0], msgs[1])
		}
	}
	var msgs []string
	for _, e := range []*side{remote, local} {
		wr := verbs.RecvWR{ID: 7, SGL: sgl(verbs.MaxSGE + 1)}
		msgs = append(msgs, refusal(e.qp, func() (int, error) { return e.qp.PostRecv([]verbs.RecvWR{wr}) }))
	}
	if msgs[0] != msgs[1] {
		t.Errorf("recv with too many SGEs: over the socket %q, in-process %q", msgs[0], msgs[1])
	}

	// Good requests pass on both: a receive each, then an inline Send
	// each way.
	for _, e := range []*side{remote, local} {
		if n, err := e.qp.PostRecv([]verbs.RecvWR{{ID: 8}}); n != 1 || err != nil {
			t.Fatalf("PostRecv = %d, %v", n, err)
		}
	}
	for _, e := range []*side{remote, local} {
		wr := verbs.SendWR{ID: 9, Opcode: verbs.WRSend, Flags: verbs.FlagInline | verbs.FlagSignaled}
		if n, err := e.qp.PostSend([]verbs.SendWR{wr}); n != 1 || err != nil {
			t.Fatalf("PostSend = %d, %v", n, err)
		}
	}
	for _, e := range []*side{remote, local} {
		for _, wc := range append(poll(t, e.scq, 1), poll(t, e.rcq, 1)...) {
			if wc.Status != verbs.WCSuccess {
				t.Errorf("completion %+v", wc)
			}
		}
	}
}
