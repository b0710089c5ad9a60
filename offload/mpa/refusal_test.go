package mpa

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestRespondRefusals(t *testing.T) {
	c := Config{Rev: 2, IRD: 4, ORD: 4}
	tests := []struct {
		name string
		req  Frame
		want uint8
		msg  string
	}{
		{name: "reply instead of request", req: Frame{Reply: true, Rev: 2}, want: CodeInvalidFrame, msg: "expected an MPA Request"},
		{name: "rev 0", req: Frame{Rev: 0}, want: CodeInvalidFrame, msg: "revision 0"},
		{name: "ord too big", req: Frame{Rev: 2, Enhanced: true, IRD: 1, ORD: 5}, want: CodeInsufficientIRD, msg: "ORD 5 exceeds our IRD 4"},
		{name: "p2p without types", req: Frame{Rev: 2, Enhanced: true, P2P: true}, want: CodeNoMatchingRTR, msg: "no matching RTR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep, _, err := Respond(&c, tt.req)
			var me *Error
			if !errors.As(err, &me) || me.Code != tt.want {
				t.Fatalf("Respond error = %v, want code %#x", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not say %q", err, tt.msg)
			}
			if !rep.Reply || !rep.Reject || rep.Markers || rep.CRC {
				t.Errorf("reject reply = %v", rep)
			}
			if _, err := rep.Append(nil); err != nil {
				t.Errorf("reject reply does not encode: %v", err)
			}
		})
	}
}

func TestRespondHigherRevision(t *testing.T) {
	c := Config{Rev: 2, IRD: 1, ORD: 1}
	rep, p, err := Respond(&c, Frame{Rev: 3, CRC: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Rev != 2 || p.Rev != 2 || p.Enhanced || !p.CRC {
		t.Errorf("reply %v, params %+v; want rev 2 non-enhanced with CRC", rep, p)
	}
}

func TestRejectReply(t *testing.T) {
	c := Config{Rev: 2, CRC: true, Markers: true, IRD: 3, ORD: 2}
	tests := []struct {
		name string
		req  Frame
		pd   []byte
		want Frame
	}{
		{
			name: "enhanced",
			req:  Frame{Rev: 2, Enhanced: true, IRD: 1, ORD: 1},
			pd:   []byte("busy"),
			want: Frame{Reply: true, Reject: true, Rev: 2, Enhanced: true, IRD: 3, ORD: 2, PrivateData: []byte("busy")},
		},
		{
			name: "rev1",
			req:  Frame{Rev: 1, Markers: true},
			want: Frame{Reply: true, Reject: true, Rev: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := c.RejectReply(tt.req, tt.pd)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("RejectReply = %+v, want = %+v", got, tt.want)
			}
			wire, err := got.Append(nil)
			if err != nil {
				t.Fatal(err)
			}
			back, err := ParseFrame(wire)
			if err != nil {
				t.Fatal(err)
			}
			req, err := (&Config{Rev: tt.req.Rev}).Request()
			if err != nil {
				t.Fatal(err)
			}
			_, err = Complete(&Config{Rev: tt.req.Rev}, req, back)
			var re *RejectedError
			if !errors.As(err, &re) || string(re.PrivateData) != string(tt.pd) {
				t.Fatalf("Complete = %v, want *RejectedError with %q", err, tt.pd)
			}
			if !strings.Contains(err.Error(), "peer rejected the connection") {
				t.Errorf("error %q", err)
			}
		})
	}
}

func TestCompleteRefusals(t *testing.T) {
	c := Config{Rev: 2, P2P: RTRRead | RTRWrite, IRD: 4, ORD: 4}
	req, err := c.Request()
	if err != nil {
		t.Fatal(err)
	}
	base := Frame{Reply: true, Rev: 2, Enhanced: true, IRD: 4, ORD: 4, P2P: true, RTR: RTRWrite}
	tests := []struct {
		name string
		mod  func(f *Frame)
		want uint8
	}{
		{name: "request key", mod: func(f *Frame) { f.Reply = false }, want: CodeInvalidFrame},
		{name: "rev 0", mod: func(f *Frame) { f.Rev = 0 }, want: CodeInvalidFrame},
		{name: "rev above ours", mod: func(f *Frame) { f.Rev = 3 }, want: CodeInvalidFrame},
		{name: "peer ord above our ird", mod: func(f *Frame) { f.ORD = 5 }, want: CodeInsufficientIRD},
		{name: "no p2p in reply", mod: func(f *Frame) { f.P2P, f.RTR = false, 0 }, want: CodeNoMatchingRTR},
		{name: "two rtr types", mod: func(f *Frame) { f.RTR = RTRWrite | RTRRead }, want: CodeNoMatchingRTR},
		{name: "rtr not offered", mod: func(f *Frame) { f.RTR = RTRSend }, want: CodeNoMatchingRTR},
		{name: "read rtr with peer ird 0", mod: func(f *Frame) { f.RTR, f.IRD = RTRRead, 0 }, want: CodeInsufficientIRD},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := base
			tt.mod(&rep)
			_, err := Complete(&c, req, rep)
			var me *Error
			if !errors.As(err, &me) || me.Code != tt.want {
				t.Fatalf("Complete error = %v, want code %#x", err, tt.want)
			}
		})
	}
	// A Reply that is not enhanced (revision 1, or 2 without the flag)
	// cannot take the P2P offer: the connection runs without it.
	for _, rev := range []uint8{1, 2} {
		rep := Frame{Reply: true, Rev: rev}
		p, err := Complete(&c, req, rep)
		if err != nil || p.P2P || p.RTR != 0 || p.Rev != rev {
			t.Errorf("P2P offered, plain rev %d Reply: %+v, %v; want no P2P", rev, p, err)
		}
	}
	// P2P in a reply we did not ask for.
	plain := Config{Rev: 2, IRD: 4, ORD: 4}
	preq, _ := plain.Request()
	if _, err := Complete(&plain, preq, base); code(err) != int(CodeNoMatchingRTR) {
		t.Errorf("unsolicited P2P: %v", err)
	}
}

func TestRequestErrors(t *testing.T) {
	tests := []struct {
		name string
		c    Config
	}{
		{name: "rev 0", c: Config{Rev: 0}},
		{name: "rev 3", c: Config{Rev: 3}},
		{name: "p2p rev1", c: Config{Rev: 1, P2P: RTRWrite}},
		{name: "pd 253 + block", c: Config{Rev: 2, PrivateData: make([]byte, 253)}},
		{name: "pd 257 rev1", c: Config{Rev: 1, PrivateData: make([]byte, 257)}},
		{name: "ird too big", c: Config{Rev: 2, IRD: 0x4000}},
		{name: "bad rtr bits", c: Config{Rev: 2, P2P: 0x10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if f, err := tt.c.Request(); err == nil {
				t.Errorf("Request = %v, want an error", f)
			}
		})
	}
}

// TestRelaxedIRD: a peer ORD above our IRD but within MaxIRD raises our
// IRD to it, on both sides (as Linux siw's relaxed IRD negotiation); above
// MaxIRD it is refused; our ORD never exceeds the peer's IRD.
func TestRelaxedIRD(t *testing.T) {
	tests := []struct {
		name             string
		ird, ord, maxIRD uint16
		peerIRD, peerORD uint16
		wantIRD, wantORD uint16
		refused          bool
	}{
		{name: "peer ord within ird", ird: 16, ord: 16, maxIRD: 128, peerIRD: 128, peerORD: 8, wantIRD: 16, wantORD: 16},
		{name: "peer ord raises ird", ird: 16, ord: 16, maxIRD: 128, peerIRD: 128, peerORD: 128, wantIRD: 128, wantORD: 16},
		{name: "peer ird lowers ord", ird: 16, ord: 16, maxIRD: 128, peerIRD: 0, peerORD: 0, wantIRD: 16, wantORD: 0},
		{name: "peer ord above max", ird: 16, ord: 16, maxIRD: 128, peerIRD: 4, peerORD: 129, refused: true},
		{name: "firm ird", ird: 16, ord: 16, peerIRD: 4, peerORD: 17, refused: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{Rev: 2, IRD: tt.ird, ORD: tt.ord, MaxIRD: tt.maxIRD}
			rep, p, err := Respond(&c, Frame{Rev: 2, Enhanced: true, IRD: tt.peerIRD, ORD: tt.peerORD})
			if tt.refused {
				if code(err) != int(CodeInsufficientIRD) {
					t.Fatalf("Respond = %v, want CodeInsufficientIRD", err)
				}
			} else if err != nil || p.IRD != tt.wantIRD || p.ORD != tt.wantORD || rep.IRD != p.IRD || rep.ORD != p.ORD {
				t.Fatalf("Respond: IRD/ORD %d/%d (reply %d/%d), %v; want %d/%d", p.IRD, p.ORD, rep.IRD, rep.ORD, err, tt.wantIRD, tt.wantORD)
			}
			// The same values seen by an initiator in the Reply.
			req, err := c.Request()
			if err != nil {
				t.Fatal(err)
			}
			ip, err := Complete(&c, req, Frame{Reply: true, Rev: 2, Enhanced: true, IRD: tt.peerIRD, ORD: tt.peerORD})
			if tt.refused {
				if code(err) != int(CodeInsufficientIRD) {
					t.Fatalf("Complete = %v, want CodeInsufficientIRD", err)
				}
				return
			}
			if err != nil || ip.IRD != tt.wantIRD || ip.ORD != tt.wantORD {
				t.Fatalf("Complete: IRD/ORD %d/%d, %v; want %d/%d", ip.IRD, ip.ORD, err, tt.wantIRD, tt.wantORD)
			}
		})
	}
}
