package ibv

import (
	"errors"
	"strings"
	"testing"

	"github.com/siwtun/siwtun/iwarp/mpa"
)

func TestCheckSendWR(t *testing.T) {
	sgl := func(n int) []SGE { return make([]SGE, n) }
	tests := []struct {
		name string
		wr   SendWR
		want string // "" for a good request
	}{
		{"send", SendWR{Opcode: WRSend, SGL: sgl(MaxSGE), Flags: FlagSignaled | FlagSolicited | FlagFence}, ""},
		{"zero-length send", SendWR{Opcode: WRSend}, ""},
		{"send with invalidate", SendWR{Opcode: WRSendWithInv, SGL: sgl(1), InvalidateRKey: 7}, ""},
		{"write", SendWR{Opcode: WRWrite, SGL: sgl(MaxSGE)}, ""},
		{"inline write", SendWR{Opcode: WRWrite, Flags: FlagInline, Inline: make([]byte, MaxInline)}, ""},
		{"inline send ignores the SGL", SendWR{Opcode: WRSend, Flags: FlagInline, SGL: sgl(MaxSGE + 1)}, ""},
		{"read", SendWR{Opcode: WRRead, SGL: sgl(MaxSGERead)}, ""},
		{"write with immediate", SendWR{Opcode: WRWriteWithImm, SGL: sgl(MaxSGE), ImmData: 1}, ""},
		{"zero-length write with immediate", SendWR{Opcode: WRWriteWithImm}, ""},
		{"inline send with immediate", SendWR{Opcode: WRSendWithImm, Flags: FlagInline | FlagSolicited, Inline: make([]byte, MaxInline)}, ""},
		{"send with immediate, too many SGEs", SendWR{Opcode: WRSendWithImm, SGL: sgl(MaxSGE + 1)}, "verbs: invalid work request: 7 SGEs, at most 6"},
		{"unknown opcode", SendWR{Opcode: 99}, "verbs: invalid work request: opcode WR_OPCODE(99) not supported"},
		{"bind", SendWR{Opcode: WRBindMW, Flags: FlagSignaled | FlagFence, Bind: MWBind{MW: 0x1200, RKey: 0x12ff, MRKey: 3, Length: 8, Access: AccessRemoteWrite}}, ""},
		{"bind naming no window", SendWR{Opcode: WRBindMW}, "verbs: invalid work request: BIND_MW of window 0x00000000 names no window"},
		{"bind to another index", SendWR{Opcode: WRBindMW, Bind: MWBind{MW: 0x1200, RKey: 0x1300}}, "verbs: invalid work request: bind gives window 0x00001200 the rkey 0x00001300 of another index"},
		{"bind with local rights", SendWR{Opcode: WRBindMW, Bind: MWBind{MW: 0x1200, RKey: 0x1201, Access: AccessLocalWrite}}, "verbs: invalid work request: window access LOCAL_WRITE: only REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC"},
		{"inline bind", SendWR{Opcode: WRBindMW, Flags: FlagInline, Bind: MWBind{MW: 0x1200, RKey: 0x1201}}, "verbs: invalid work request: BIND_MW cannot be inline or solicited"},
		{"local invalidate", SendWR{Opcode: WRLocalInv, InvalidateRKey: 0x4501}, ""},
		{"local invalidate of nothing", SendWR{Opcode: WRLocalInv, InvalidateRKey: 0x45}, "verbs: invalid work request: LOCAL_INV of STag 0x00000045 names nothing"},
		{"local invalidate with SGEs", SendWR{Opcode: WRLocalInv, InvalidateRKey: 0x4501, SGL: sgl(1)}, "verbs: invalid work request: LOCAL_INV takes no SGEs"},
		{"unknown flags", SendWR{Opcode: WRSend, Flags: 1 << 10}, "verbs: invalid work request: send flags 0x400"},
		{"too many SGEs", SendWR{Opcode: WRSend, SGL: sgl(MaxSGE + 1)}, "verbs: invalid work request: 7 SGEs, at most 6"},
		{"write with too many SGEs", SendWR{Opcode: WRWrite, SGL: sgl(MaxSGE + 1)}, "verbs: invalid work request: 7 SGEs, at most 6"},
		{"inline too long", SendWR{Opcode: WRSend, Flags: FlagInline, Inline: make([]byte, MaxInline+1)},
			"verbs: invalid work request: 257 inline bytes, at most 256"},
		{"inline read", SendWR{Opcode: WRRead, Flags: FlagInline}, "verbs: invalid work request: RDMA Read cannot be inline"},
		{"read with 2 SGEs", SendWR{Opcode: WRRead, SGL: sgl(2)}, "verbs: invalid work request: RDMA Read sink has 2 SGEs, iWARP allows 1"},
	}
	for _, tt := range tests {
		err := CheckSendWR(&tt.wr)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.want != "" && (!errors.Is(err, ErrInvalidWR) || err.Error() != tt.want):
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
}

func TestCheckRecvWR(t *testing.T) {
	for n := range MaxSGE + 3 {
		err := CheckRecvWR(&RecvWR{SGL: make([]SGE, n)})
		if (err == nil) != (n <= MaxSGE) || (err != nil && !errors.Is(err, ErrInvalidWR)) {
			t.Errorf("%d SGEs: %v", n, err)
		}
	}
}

func TestCheckPostNamesTheRequest(t *testing.T) {
	err := CheckPostSend(3, 1, &SendWR{ID: 42, Opcode: WRRead, SGL: make([]SGE, 2)})
	want := "QP 3 send WR 1 (id 42): verbs: invalid work request: RDMA Read sink has 2 SGEs, iWARP allows 1"
	if !errors.Is(err, ErrInvalidWR) || err.Error() != want {
		t.Errorf("CheckPostSend: %v, want %q", err, want)
	}
	err = CheckPostRecv(3, 0, &RecvWR{ID: 7, SGL: make([]SGE, MaxSGE+1)})
	want = "QP 3 recv WR 0 (id 7): verbs: invalid work request: 7 SGEs, at most 6"
	if !errors.Is(err, ErrInvalidWR) || err.Error() != want {
		t.Errorf("CheckPostRecv: %v, want %q", err, want)
	}
	if CheckPostSend(3, 0, &SendWR{Opcode: WRSend}) != nil || CheckPostRecv(3, 0, &RecvWR{}) != nil {
		t.Error("a good request refused")
	}
}

func TestCheckPostPeer(t *testing.T) {
	for _, op := range []WROpcode{WRWrite, WRWriteWithImm, WRSend, WRSendWithImm, WRRead, WRSendWithInv} {
		for _, ext := range []mpa.Ext{0, mpa.ExtImmediate} {
			err := CheckPostPeer(5, 2, &SendWR{ID: 9, Opcode: op}, ext)
			refused := op.WithImm() && ext == 0
			if (err != nil) != refused || (err != nil && !errors.Is(err, ErrNotSupportedByPeer)) {
				t.Errorf("%v with ext %v: %v", op, ext, err)
			}
			if err != nil && !strings.HasPrefix(err.Error(), "QP 5 send WR 2 (id 9): "+op.String()+": ") {
				t.Errorf("error %q does not name the request", err)
			}
		}
	}
}

func TestOpcodes(t *testing.T) {
	tests := []struct {
		op   WROpcode
		name string
		wc   WCOpcode
		imm  bool
	}{
		{WRWrite, "RDMA_WRITE", WCWrite, false},
		{WRWriteWithImm, "RDMA_WRITE_WITH_IMM", WCWrite, true},
		{WRSend, "SEND", WCSend, false},
		{WRSendWithImm, "SEND_WITH_IMM", WCSend, true},
		{WRRead, "RDMA_READ", WCRead, false},
		{WRSendWithInv, "SEND_WITH_INV", WCSend, false},
	}
	for _, tt := range tests {
		if tt.op.String() != tt.name || tt.op.WC() != tt.wc || tt.op.WithImm() != tt.imm {
			t.Errorf("%d: %v %v %v", uint32(tt.op), tt.op, tt.op.WC(), tt.op.WithImm())
		}
	}
	for _, c := range []struct {
		op   WCOpcode
		name string
		recv bool
	}{{WCSend, "SEND", false}, {WCWrite, "RDMA_WRITE", false}, {WCRead, "RDMA_READ", false},
		{WCRecv, "RECV", true}, {WCRecvRDMAWithImm, "RECV_RDMA_WITH_IMM", true}} {
		if c.op.String() != c.name || c.op.Recv() != c.recv {
			t.Errorf("%d: %v recv %v", uint32(c.op), c.op, c.op.Recv())
		}
	}
}
