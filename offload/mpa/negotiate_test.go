package mpa

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
)

// exchange runs a full Request/Reply exchange through the wire encoding.
// It returns the responder's and the initiator's results.
func exchange(t *testing.T, ini, resp *Config) (rp Params, rerr error, ip Params, ierr error) {
	t.Helper()
	req, err := ini.Request()
	if err != nil {
		t.Fatalf("Request: %v", err)
	}
	reqWire, err := req.Append(nil)
	if err != nil {
		t.Fatalf("Append(request): %v", err)
	}
	if len(reqWire)-FrameHeaderLen > MaxPrivateDataSend {
		t.Fatalf("Request PD_Length %d > %d", len(reqWire)-FrameHeaderLen, MaxPrivateDataSend)
	}
	req2, err := ParseFrame(reqWire)
	if err != nil {
		t.Fatalf("ParseFrame(request): %v", err)
	}
	reply, rp, rerr := Respond(resp, req2)
	if rerr != nil && !reply.Reject {
		t.Fatalf("Respond failed (%v) without a reject reply", rerr)
	}
	if rerr == nil && reply.Reject {
		t.Fatalf("Respond: reject reply without an error")
	}
	repWire, err := reply.Append(nil)
	if err != nil {
		t.Fatalf("Append(reply): %v", err)
	}
	rep2, err := ParseFrame(repWire)
	if err != nil {
		t.Fatalf("ParseFrame(reply): %v", err)
	}
	ip, ierr = Complete(ini, req, rep2)
	return rp, rerr, ip, ierr
}

func code(err error) int {
	var me *Error
	if errors.As(err, &me) {
		return int(me.Code)
	}
	var re *RejectedError
	if errors.As(err, &re) {
		return -1
	}
	if err != nil {
		return -2
	}
	return 0
}

func TestNegotiation(t *testing.T) {
	tests := []struct {
		name      string
		ini, resp Config
		wantResp  Params // ignored when wantRCode != 0
		wantIni   Params
		wantRCode int // responder error code (0 = accepted)
		wantICode int // initiator error code (-1 = rejected)
	}{
		{
			name:     "siw default both ends",
			ini:      Config{Rev: 2, IRD: 1, ORD: 1},
			resp:     Config{Rev: 2, IRD: 1, ORD: 1},
			wantResp: Params{Rev: 2, Enhanced: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1},
			wantIni:  Params{Rev: 2, Enhanced: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1},
		},
		{
			name:     "rev1 both, crc from initiator",
			ini:      Config{Rev: 1, CRC: true, IRD: 4, ORD: 4},
			resp:     Config{Rev: 1, IRD: 8, ORD: 2},
			wantResp: Params{Rev: 1, CRC: true, IRD: 8, ORD: 2},
			wantIni:  Params{Rev: 1, CRC: true, IRD: 4, ORD: 4},
		},
		{
			name:     "rev2 initiator, rev1 responder: falls back to rev1",
			ini:      Config{Rev: 2, IRD: 4, ORD: 4},
			resp:     Config{Rev: 1, CRC: true, IRD: 2, ORD: 2},
			wantResp: Params{Rev: 1, CRC: true, IRD: 2, ORD: 2},
			wantIni:  Params{Rev: 1, CRC: true, IRD: 4, ORD: 4},
		},
		{
			name:     "rev1 initiator, rev2 responder",
			ini:      Config{Rev: 1, IRD: 1, ORD: 1},
			resp:     Config{Rev: 2, IRD: 1, ORD: 1},
			wantResp: Params{Rev: 1, IRD: 1, ORD: 1},
			wantIni:  Params{Rev: 1, IRD: 1, ORD: 1},
		},
		{
			name:     "markers initiator wants to receive",
			ini:      Config{Rev: 2, Markers: true, IRD: 1, ORD: 1},
			resp:     Config{Rev: 2, IRD: 1, ORD: 1},
			wantResp: Params{Rev: 2, Enhanced: true, MarkersTx: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1},
			wantIni:  Params{Rev: 2, Enhanced: true, MarkersRx: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1},
		},
		{
			name:     "markers responder wants to receive, crc from responder",
			ini:      Config{Rev: 2, IRD: 1, ORD: 1},
			resp:     Config{Rev: 2, Markers: true, CRC: true, IRD: 1, ORD: 1},
			wantResp: Params{Rev: 2, Enhanced: true, CRC: true, MarkersRx: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1},
			wantIni:  Params{Rev: 2, Enhanced: true, CRC: true, MarkersTx: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1},
		},
		{
			name:     "markers both ways",
			ini:      Config{Rev: 1, Markers: true},
			resp:     Config{Rev: 1, Markers: true},
			wantResp: Params{Rev: 1, MarkersTx: true, MarkersRx: true},
			wantIni:  Params{Rev: 1, MarkersTx: true, MarkersRx: true},
		},
		{
			name:     "ird/ord: responder lowers its ORD to the peer's IRD",
			ini:      Config{Rev: 2, IRD: 2, ORD: 8},
			resp:     Config{Rev: 2, IRD: 16, ORD: 16},
			wantResp: Params{Rev: 2, Enhanced: true, IRD: 16, ORD: 2, PeerIRD: 2, PeerORD: 8},
			wantIni:  Params{Rev: 2, Enhanced: true, IRD: 2, ORD: 8, PeerIRD: 16, PeerORD: 2},
		},
		{
			name:      "ird/ord: peer ORD above our IRD is refused",
			ini:       Config{Rev: 2, IRD: 128, ORD: 128},
			resp:      Config{Rev: 2, IRD: 32, ORD: 32},
			wantRCode: 0x06,
			wantICode: -1,
		},
		{
			name:     "ird/ord: initiator lowers its ORD to the peer's IRD",
			ini:      Config{Rev: 2, IRD: 4, ORD: 4},
			resp:     Config{Rev: 2, IRD: 4, ORD: 0},
			wantResp: Params{Rev: 2, Enhanced: true, IRD: 4, ORD: 0, PeerIRD: 4, PeerORD: 4},
			wantIni:  Params{Rev: 2, Enhanced: true, IRD: 4, ORD: 4, PeerIRD: 4, PeerORD: 0},
		},
		{
			name:     "ird/ord: 0x3fff means not negotiated",
			ini:      Config{Rev: 2, IRD: IRDORDMax, ORD: IRDORDMax},
			resp:     Config{Rev: 2, IRD: 32, ORD: 32},
			wantResp: Params{Rev: 2, Enhanced: true, IRD: 32, ORD: 32, PeerIRD: IRDORDMax, PeerORD: IRDORDMax},
			wantIni:  Params{Rev: 2, Enhanced: true, IRD: IRDORDMax, ORD: 32, PeerIRD: 32, PeerORD: 32},
		},
		{
			name:     "p2p write+read offered, write picked (siw responder)",
			ini:      Config{Rev: 2, P2P: RTRWrite | RTRRead, IRD: 1, ORD: 1},
			resp:     Config{Rev: 2, P2P: RTRWrite | RTRRead, IRD: 1, ORD: 1},
			wantResp: Params{Rev: 2, Enhanced: true, P2P: true, RTR: RTRWrite, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1},
			wantIni:  Params{Rev: 2, Enhanced: true, P2P: true, RTR: RTRWrite, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1},
		},
		{
			name:     "p2p read only (chelsio initiator)",
			ini:      Config{Rev: 2, CRC: true, P2P: RTRRead, IRD: 32, ORD: 32},
			resp:     Config{Rev: 2, P2P: RTRWrite | RTRRead | RTRSend, IRD: 128, ORD: 128},
			wantResp: Params{Rev: 2, Enhanced: true, CRC: true, P2P: true, RTR: RTRRead, IRD: 128, ORD: 32, PeerIRD: 32, PeerORD: 32},
			wantIni:  Params{Rev: 2, Enhanced: true, CRC: true, P2P: true, RTR: RTRRead, IRD: 32, ORD: 32, PeerIRD: 128, PeerORD: 32},
		},
		{
			name:     "p2p read offered but responder IRD 0: send picked",
			ini:      Config{Rev: 2, P2P: RTRRead | RTRSend, IRD: 1, ORD: 0},
			resp:     Config{Rev: 2, P2P: RTRWrite | RTRRead | RTRSend, IRD: 0, ORD: 1},
			wantResp: Params{Rev: 2, Enhanced: true, P2P: true, RTR: RTRSend, IRD: 0, ORD: 1, PeerIRD: 1, PeerORD: 0},
			wantIni:  Params{Rev: 2, Enhanced: true, P2P: true, RTR: RTRSend, IRD: 1, ORD: 0, PeerIRD: 0, PeerORD: 1},
		},
		{
			name:     "p2p send only",
			ini:      Config{Rev: 2, P2P: RTRSend},
			resp:     Config{Rev: 2, P2P: RTRSend | RTRRead},
			wantResp: Params{Rev: 2, Enhanced: true, P2P: true, RTR: RTRSend},
			wantIni:  Params{Rev: 2, Enhanced: true, P2P: true, RTR: RTRSend},
		},
		{
			name:      "p2p no common type",
			ini:       Config{Rev: 2, P2P: RTRSend},
			resp:      Config{Rev: 2, P2P: RTRWrite | RTRRead, IRD: 1, ORD: 1},
			wantRCode: 0x07,
			wantICode: -1,
		},
		{
			name:      "p2p requested, responder accepts none",
			ini:       Config{Rev: 2, P2P: RTRWrite},
			resp:      Config{Rev: 2},
			wantRCode: 0x07,
			wantICode: -1,
		},
		{
			// A responder that does not speak RFC 6581 cannot take the
			// offer: the connection starts as RFC 5044 has it.
			name:     "p2p requested, responder speaks rev1",
			ini:      Config{Rev: 2, P2P: RTRWrite},
			resp:     Config{Rev: 1, P2P: RTRWrite},
			wantResp: Params{Rev: 1},
			wantIni:  Params{Rev: 1},
		},
		{
			name:     "responder accepts p2p, initiator does not ask",
			ini:      Config{Rev: 2, IRD: 1, ORD: 1},
			resp:     Config{Rev: 2, P2P: RTRWrite, IRD: 1, ORD: 1},
			wantResp: Params{Rev: 2, Enhanced: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1},
			wantIni:  Params{Rev: 2, Enhanced: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1},
		},
		{
			name:     "private data both ways",
			ini:      Config{Rev: 2, PrivateData: []byte("hello"), IRD: 1, ORD: 1},
			resp:     Config{Rev: 2, PrivateData: []byte("world!"), IRD: 1, ORD: 1},
			wantResp: Params{Rev: 2, Enhanced: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1, PeerPrivateData: []byte("hello")},
			wantIni:  Params{Rev: 2, Enhanced: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1, PeerPrivateData: []byte("world!")},
		},
		{
			name:     "extensions offered and accepted",
			ini:      Config{Rev: 2, CRC: true, IRD: 1, ORD: 1, Ext: ExtImmediate, PrivateData: []byte("hi")},
			resp:     Config{Rev: 2, IRD: 1, ORD: 1, Ext: ExtAll, PrivateData: []byte("yo")},
			wantResp: Params{Rev: 2, Enhanced: true, CRC: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1, PeerPrivateData: []byte("hi"), Ext: ExtImmediate},
			wantIni:  Params{Rev: 2, Enhanced: true, CRC: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1, PeerPrivateData: []byte("yo"), Ext: ExtImmediate},
		},
		{
			name:     "immediate data and atomics both ways",
			ini:      Config{Rev: 2, IRD: 1, ORD: 1, Ext: ExtAll},
			resp:     Config{Rev: 2, IRD: 1, ORD: 1, Ext: ExtImmediate | ExtAtomic},
			wantResp: Params{Rev: 2, Enhanced: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1, Ext: ExtImmediate | ExtAtomic},
			wantIni:  Params{Rev: 2, Enhanced: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1, Ext: ExtImmediate | ExtAtomic},
		},
		{
			name:     "a responder with immediate data only gets no atomics",
			ini:      Config{Rev: 2, IRD: 1, ORD: 1, Ext: ExtAll},
			resp:     Config{Rev: 2, IRD: 1, ORD: 1, Ext: ExtImmediate},
			wantResp: Params{Rev: 2, Enhanced: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1, Ext: ExtImmediate},
			wantIni:  Params{Rev: 2, Enhanced: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1, Ext: ExtImmediate},
		},
		{
			name:     "extensions with rev1",
			ini:      Config{Rev: 1, Ext: ExtImmediate},
			resp:     Config{Rev: 1, Ext: ExtImmediate},
			wantResp: Params{Rev: 1, Ext: ExtImmediate},
			wantIni:  Params{Rev: 1, Ext: ExtImmediate},
		},
		{
			name:     "extensions offered, responder without them (siw)",
			ini:      Config{Rev: 2, IRD: 1, ORD: 1, Ext: ExtImmediate},
			resp:     Config{Rev: 2, IRD: 1, ORD: 1},
			wantResp: Params{Rev: 2, Enhanced: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1},
			wantIni:  Params{Rev: 2, Enhanced: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1},
		},
		{
			name:     "extensions not offered (siw initiator): none",
			ini:      Config{Rev: 2, IRD: 1, ORD: 1},
			resp:     Config{Rev: 2, IRD: 1, ORD: 1, Ext: ExtImmediate},
			wantResp: Params{Rev: 2, Enhanced: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1},
			wantIni:  Params{Rev: 2, Enhanced: true, IRD: 1, ORD: 1, PeerIRD: 1, PeerORD: 1},
		},
		{
			name:     "private data too long for the extension block: none offered",
			ini:      Config{Rev: 2, PrivateData: seq(245), Ext: ExtImmediate},
			resp:     Config{Rev: 2, Ext: ExtImmediate},
			wantResp: Params{Rev: 2, Enhanced: true, PeerPrivateData: seq(245)},
			wantIni:  Params{Rev: 2, Enhanced: true},
		},
		{
			name:     "reply private data too long for the extension block: none",
			ini:      Config{Rev: 2, Ext: ExtImmediate},
			resp:     Config{Rev: 2, PrivateData: seq(252), Ext: ExtImmediate},
			wantResp: Params{Rev: 2, Enhanced: true},
			wantIni:  Params{Rev: 2, Enhanced: true, PeerPrivateData: seq(252)},
		},
		{
			name:     "private data 244 + blocks = 256",
			ini:      Config{Rev: 2, PrivateData: seq(244), Ext: ExtImmediate},
			resp:     Config{Rev: 2, PrivateData: seq(244), Ext: ExtImmediate},
			wantResp: Params{Rev: 2, Enhanced: true, PeerPrivateData: seq(244), Ext: ExtImmediate},
			wantIni:  Params{Rev: 2, Enhanced: true, PeerPrivateData: seq(244), Ext: ExtImmediate},
		},
		{
			name:     "private data 252 + block = 256",
			ini:      Config{Rev: 2, PrivateData: seq(252)},
			resp:     Config{Rev: 1, PrivateData: seq(256)},
			wantResp: Params{Rev: 1, PeerPrivateData: seq(252)},
			wantIni:  Params{Rev: 1, PeerPrivateData: seq(256)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rp, rerr, ip, ierr := exchange(t, &tt.ini, &tt.resp)
			if got := code(rerr); got != tt.wantRCode {
				t.Fatalf("responder error = %v (code %d), want code %d", rerr, got, tt.wantRCode)
			}
			if got := code(ierr); got != tt.wantICode {
				t.Fatalf("initiator error = %v (code %d), want code %d", ierr, got, tt.wantICode)
			}
			if rerr == nil && !reflect.DeepEqual(rp, tt.wantResp) {
				t.Errorf("responder params = %+v, want = %+v", rp, tt.wantResp)
			}
			if ierr == nil && !reflect.DeepEqual(ip, tt.wantIni) {
				t.Errorf("initiator params = %+v, want = %+v", ip, tt.wantIni)
			}
		})
	}
}

// TestNegotiationMatrix runs every combination of revision, CRC and Markers
// per side, P2P offers/acceptances and a few IRD/ORD pairs, and checks that
// both sides agree whenever the connection is accepted.
func TestNegotiationMatrix(t *testing.T) {
	rtrs := []RTR{0, RTRWrite, RTRRead, RTRSend, RTRWrite | RTRRead, RTRRead | RTRSend, RTRWrite | RTRRead | RTRSend}
	irdOrd := [][2]uint16{{0, 0}, {1, 1}, {4, 16}, {16, 4}, {128, 128}}
	var n, accepted int
	for _, iRev := range []uint8{1, 2} {
		for _, rRev := range []uint8{1, 2} {
			for fl := range 16 {
				for _, offer := range rtrs {
					for _, accept := range rtrs {
						for _, io := range irdOrd {
							for _, ro := range irdOrd {
								if offer != 0 && iRev != 2 {
									continue
								}
								ini := Config{Rev: iRev, CRC: fl&1 != 0, Markers: fl&2 != 0, P2P: offer, IRD: io[0], ORD: io[1]}
								resp := Config{Rev: rRev, CRC: fl&4 != 0, Markers: fl&8 != 0, P2P: accept, IRD: ro[0], ORD: ro[1]}
								name := fmt.Sprintf("%+v/%+v", ini, resp)
								rp, rerr, ip, ierr := exchange(t, &ini, &resp)
								n++
								checkPair(t, name, ini, resp, rp, rerr, ip, ierr)
								if rerr == nil && ierr == nil {
									accepted++
								}
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d combinations, %d accepted", n, accepted)
}

func checkPair(t *testing.T, name string, ini, resp Config, rp Params, rerr error, ip Params, ierr error) {
	t.Helper()
	if rerr != nil {
		if code(ierr) != -1 {
			t.Errorf("%s: responder refused (%v) but the initiator got %v", name, rerr, ierr)
		}
		return
	}
	if ierr != nil {
		var me *Error
		if !errors.As(ierr, &me) {
			t.Errorf("%s: initiator error %v is not *Error", name, ierr)
		}
		return
	}
	wantRev := min(ini.Rev, resp.Rev)
	if rp.Rev != wantRev || ip.Rev != wantRev {
		t.Errorf("%s: revs %d/%d, want %d", name, rp.Rev, ip.Rev, wantRev)
	}
	if rp.Enhanced != (wantRev == 2) || ip.Enhanced != rp.Enhanced {
		t.Errorf("%s: enhanced %v/%v", name, rp.Enhanced, ip.Enhanced)
	}
	if want := ini.CRC || resp.CRC; rp.CRC != want || ip.CRC != want {
		t.Errorf("%s: CRC %v/%v, want %v", name, rp.CRC, ip.CRC, want)
	}
	if ip.MarkersRx != ini.Markers || rp.MarkersTx != ini.Markers || rp.MarkersRx != resp.Markers || ip.MarkersTx != resp.Markers {
		t.Errorf("%s: markers ini tx/rx %v/%v resp tx/rx %v/%v", name, ip.MarkersTx, ip.MarkersRx, rp.MarkersTx, rp.MarkersRx)
	}
	if rp.P2P != ip.P2P || rp.RTR != ip.RTR {
		t.Errorf("%s: P2P %v/%v RTR %v/%v", name, rp.P2P, ip.P2P, rp.RTR, ip.RTR)
	}
	if rp.P2P {
		if rp.RTR&ini.P2P == 0 || rp.RTR&resp.P2P == 0 || (rp.RTR != RTRWrite && rp.RTR != RTRRead && rp.RTR != RTRSend) {
			t.Errorf("%s: RTR %v not exactly one common type", name, rp.RTR)
		}
		if common := ini.P2P & resp.P2P; common&RTRWrite != 0 && rp.RTR != RTRWrite {
			t.Errorf("%s: RTR %v picked though Write was common", name, rp.RTR)
		}
		if rp.RTR == RTRRead && (rp.IRD == 0 || ip.ORD == 0) {
			t.Errorf("%s: Read RTR with responder IRD %d, initiator ORD %d", name, rp.IRD, ip.ORD)
		}
	} else if ini.P2P != 0 && rp.Enhanced {
		t.Errorf("%s: P2P requested but connection accepted without it", name)
	}
	if rp.Enhanced {
		if ip.ORD > rp.IRD || rp.ORD > ip.IRD {
			t.Errorf("%s: ORD exceeds the peer's IRD: ini IRD/ORD %d/%d, resp %d/%d", name, ip.IRD, ip.ORD, rp.IRD, rp.ORD)
		}
		if ip.PeerIRD != rp.IRD || ip.PeerORD != rp.ORD || rp.PeerIRD != ini.IRD || rp.PeerORD != ini.ORD {
			t.Errorf("%s: peer IRD/ORD mismatch: %+v / %+v", name, ip, rp)
		}
	}
}
