package verbs_test

import (
	"context"
	"testing"

	"github.com/siwtun/siwtun/offload/ddp"
	"github.com/siwtun/siwtun/offload/rdmap"
	"github.com/siwtun/siwtun/verbs"
)

// TestTerminateBeforeClose: whatever the application does on the error
// completion of a peer's bad message, the Terminate goes out before the
// connection closes (RFC 5040 §7). Here the application destroys its QP
// the moment the receive completes in error, racing the TX goroutine that
// sends the Terminate: losing that race (about one connection of ten
// without the ordering) closes the stream first. Each case runs many
// connections.
func TestTerminateBeforeClose(t *testing.T) {
	reps := 300
	if testing.Short() {
		reps = 30
	}
	cases := []struct {
		name    string
		ulpdu   func() []byte
		corrupt bool
		code    rdmap.Code
	}{
		{"bad-crc", func() []byte { return untagged(rdmap.OpSend, 0, 1, 0, true, []byte("hello")) }, true, rdmap.TermLLPCRC},
		{"send-inv-unknown-stag", func() []byte {
			h := ddp.Header{Last: true, Version: ddp.Version, ULPCtrl: rdmap.Ctrl(rdmap.OpSendInv), ULPData: 0x00abcd01, QN: 0, MSN: 1}
			b := make([]byte, h.Len()+5)
			h.Marshal(b)
			copy(b[h.Len():], "hello")
			return b
		}, false, rdmap.TermRDMAPCannotInvalidate},
		{"send-too-long", func() []byte { return untagged(rdmap.OpSend, 0, 1, 0, true, make([]byte, 300)) }, false, rdmap.TermDDPTooLong},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for i := range reps {
				srv, p := rawSide(t, 8, 1)
				rbuf := srv.region(256, verbs.AccessLocalWrite)
				srv.recv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{rbuf.mr.SGE(0, 256)}})
				destroyed := make(chan struct{})
				go func() {
					defer close(destroyed)
					ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
					defer cancel()
					wcs := make([]verbs.WorkCompletion, 1)
					if n, err := srv.rcq.Wait(ctx, wcs); err != nil || n != 1 || wcs[0].Status == verbs.WCSuccess {
						t.Errorf("rep %d: receive completion %+v, %v", i, wcs[0], err)
					}
					srv.qp.Destroy() // at once, as a careless application would
				}()
				p.send(tc.ulpdu(), tc.corrupt)
				if _, term := p.terminate(); term.Code != tc.code {
					t.Fatalf("rep %d: Terminate %v, want %v", i, term.Code, tc.code)
				}
				<-destroyed
			}
		})
	}
}
