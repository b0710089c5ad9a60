package netstack

import (
	"bytes"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
)

// tcpPacket returns an IPv4 (or IPv6) TCP packet with a TCP header of
// tcpLen octets and n octets of payload; proto replaces TCP's number.
func tcpPacket(v6 bool, tcpLen, n int, proto byte) []byte {
	ipLen := 20
	if v6 {
		ipLen = 40
	}
	b := make([]byte, ipLen+tcpLen+n)
	if v6 {
		b[0], b[6] = 0x60, proto
	} else {
		b[0], b[9] = 0x45, proto
	}
	b[ipLen+12] = byte(tcpLen/4) << 4
	for i := range n {
		b[ipLen+tcpLen+i] = byte(i)
	}
	return b
}

func TestTCPHeadersLen(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		want int
	}{
		{"v4 no options", tcpPacket(false, 20, 100, protoTCP), 40},
		{"v4 timestamps", tcpPacket(false, 32, 1448, protoTCP), 52},
		{"v6 timestamps", tcpPacket(true, 32, 1428, protoTCP), 72},
		{"v4 pure ACK", tcpPacket(false, 32, 0, protoTCP), 0},
		{"v4 UDP", tcpPacket(false, 20, 100, 17), 0},
		{"v4 data offset 4", tcpPacket(false, 16, 100, protoTCP), 0},
		{"v4 data offset past the end", tcpPacket(false, 60, 0, protoTCP)[:70], 0},
		{"short", tcpPacket(false, 20, 100, protoTCP)[:39], 0},
	} {
		if got := tcpHeadersLen(tc.b); got != tc.want {
			t.Errorf("%s: tcpHeadersLen = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestWithHeaderView: a TCP packet read from a device becomes a buffer of
// two views, the headers exactly (gVisor's IPv4 input then clones only
// their chunk) and the payload; anything else stays one view.
func TestWithHeaderView(t *testing.T) {
	p := tcpPacket(false, 32, 1448, protoTCP)
	buf := withHeaderView(buffer.NewViewWithData(p))
	var views [][]byte
	vl := buf.AsViewList()
	for v := vl.Front(); v != nil; v = v.Next() {
		views = append(views, v.AsSlice())
	}
	if len(views) != 2 || !bytes.Equal(views[0], p[:52]) || !bytes.Equal(views[1], p[52:]) {
		t.Fatalf("%d views; want the 52 header octets, then the 1448 of payload", len(views))
	}
	if got := buf.Flatten(); !bytes.Equal(got, p) {
		t.Error("the buffer's octets differ from the packet's")
	}
	ack := tcpPacket(false, 32, 0, protoTCP)
	one := withHeaderView(buffer.NewViewWithData(ack))
	if vl := one.AsViewList(); vl.Front() == nil || vl.Front().Next() != nil || one.Size() != int64(len(ack)) {
		t.Error("a packet without payload is not one view")
	}
}
