package anatomy

import (
	"strings"
	"testing"
	"time"

	"github.com/siwtun/siwtun/internal/testkit"
)

const (
	clientPort, serverPort = 40000, 18515
	pingPongs              = 200
	fpdu                   = 24 // a 4 B RDMA Write's FPDU
)

// pingPong makes the stamps of n round trips of a synthetic ping-pong
// (the client writes first), as the client's and the server's daemons
// would hold them: every leg lasts 1 µs more than the one before, but the
// kernel's (10 µs), TCP's two on the receiving side (3 µs each) and the
// receiving application's, which grows with the message's number modulo
// 100 (so its median and 99th percentile differ).
func pingPong(n int) (client, server []Record) {
	one := func(snd, rcv *[]Record, sport, dport uint16, seq uint32, t0 int64, i int) {
		at := func(k int64) int64 { return t0 + k*int64(time.Microsecond) }
		app := func(h Hop, sp, dp uint16, t int64) Record { return Record{Hop: h, SrcPort: sp, DstPort: dp, T: t} }
		seg := func(h Hop, t int64) Record {
			return Record{Hop: h, SrcPort: sport, DstPort: dport, Seq: seq, Len: fpdu, T: t}
		}
		*snd = append(*snd, app(Post, sport, dport, at(0)),
			seg(Pickup, at(1)), seg(TXStart, at(3)), seg(Built, at(6)), seg(TCPOut, at(10)), seg(TUNWrite, at(15)))
		queued := Record{Hop: Queued, SrcPort: sport, DstPort: dport, T: at(28)}
		*rcv = append(*rcv, seg(TUNRead, at(25)), queued, seg(Handover, at(31)), seg(Placed, at(38)),
			app(Seen, sport, dport, at(38)+int64(500+(i%100)*100)))
	}
	for i := range n {
		t0 := int64(1e9) + int64(i)*int64(time.Millisecond)
		one(&client, &server, clientPort, serverPort, uint32(0xffffff00)+uint32(i*fpdu), t0, i)
		one(&server, &client, serverPort, clientPort, 5000+uint32(i*fpdu), t0+int64(500*time.Microsecond), i)
	}
	// A retransmission of the first message, later: not the first pass.
	client = append(client, Record{Hop: TCPOut, SrcPort: clientPort, DstPort: serverPort, Seq: 0xffffff00, Len: fpdu, T: 2e9})
	// Another connection's segment with the same sequence numbers.
	server = append(server, Record{Hop: TUNRead, SrcPort: 1, DstPort: serverPort, Seq: 0xffffff00, Len: fpdu, T: 1e9})
	return client, server
}

func TestAssemblePingPong(t *testing.T) {
	c, s := pingPong(pingPongs)
	an := Assemble(Side{Name: "client", Records: c}, Side{Name: "server", Records: s}, Flow{Src: clientPort, Dst: serverPort})
	us := time.Microsecond
	want := []time.Duration{1 * us, 2 * us, 3 * us, 4 * us, 5 * us, 10 * us, 3 * us, 3 * us, 7 * us}
	for d, dir := range an.Dirs {
		if dir.Messages != pingPongs {
			t.Errorf("direction %d: %d messages, want %d", d, dir.Messages, pingPongs)
		}
		for i, w := range want {
			if st := dir.Legs[i]; st.Median != w || st.P99 != w || st.N != pingPongs {
				t.Errorf("direction %d, %s: %+v, want %v over %d", d, st.Leg.Name(), st, w, pingPongs)
			}
		}
		// Sorted, the application's legs are 500 + 100*j ns for j =
		// 0..99, each twice: nearest rank 100 of 200 is j = 49, rank
		// 198 is j = 98.
		if st := dir.Legs[len(Legs)-1]; st.Median != 5400*time.Nanosecond || st.P99 != 10300*time.Nanosecond {
			t.Errorf("direction %d, placed -> seen: %+v", d, st)
		}
		if st := dir.Legs[len(Legs)]; st.Median != 38*us+5400 || st.N != pingPongs {
			t.Errorf("direction %d, one way: %+v", d, st)
		}
	}
	// The client's round trip: its post to its sight of the answer,
	// 500 µs later plus the answer's one way.
	if rt := an.RoundTrip; rt.N != pingPongs || rt.Median != 538*us+5400 {
		t.Errorf("round trip %+v", rt)
	}
	testkit.Golden(t, "testdata/pingpong.txt", []byte(an.String()))
}

// TestAssembleMissing: messages whose stamps are missing count only in
// the legs they have, and a side without application stamps shows none.
func TestAssembleMissing(t *testing.T) {
	c, s := pingPong(10)
	var sDaemon []Record
	for _, r := range s {
		if r.Hop != Post && r.Hop != Seen && !(r.Hop == Handover && r.Seq == 0xffffff00) {
			sDaemon = append(sDaemon, r)
		}
	}
	an := Assemble(Side{Name: "client", Records: c}, Side{Name: "server", Records: sDaemon}, Flow{Src: clientPort, Dst: serverPort})
	d := an.Dirs[0]
	if n := d.Legs[6].N; n != 9 {
		t.Errorf("tun-read -> handover over %d messages, want 9 (one lacks its hand-over)", n)
	}
	if n := d.Legs[len(Legs)-1].N; n != 0 {
		t.Errorf("placed -> seen over %d messages without the server's stamps", n)
	}
	if n := an.Dirs[1].Legs[0].N; n != 0 {
		t.Errorf("the server's post -> pickup over %d messages without its stamps", n)
	}
}

func TestRank(t *testing.T) {
	for _, tc := range []struct{ n, p, want int }{{1, 50, 0}, {1, 99, 0}, {2, 50, 0}, {100, 99, 98}, {101, 99, 99}, {200, 50, 99}, {1000, 99, 989}} {
		if got := rank(tc.n, tc.p); got != tc.want {
			t.Errorf("rank(%d, %d) = %d, want %d", tc.n, tc.p, got, tc.want)
		}
	}
}

// TestAssembleDaemonsOnly: without the applications' stamps the daemons'
// legs are still there, and the table says the applications' are empty.
func TestAssembleDaemonsOnly(t *testing.T) {
	c, s := pingPong(20)
	daemon := func(recs []Record) []Record {
		var out []Record
		for _, r := range recs {
			if r.Hop != Post && r.Hop != Seen {
				out = append(out, r)
			}
		}
		return out
	}
	an := Assemble(Side{Name: "siwtun0", Records: daemon(c)}, Side{Name: "siwtun1", Records: daemon(s)}, Flow{Src: clientPort, Dst: serverPort})
	for d, dir := range an.Dirs {
		for i, st := range dir.Legs {
			app := i == 0 || i >= len(Legs)-1
			if (st.N == 0) != app {
				t.Errorf("direction %d, %s: over %d messages", d, st.Leg.Name(), st.N)
			}
		}
	}
	if out := an.String(); an.RoundTrip.N != 0 || !strings.Contains(out, "no stamps of the applications") || !strings.Contains(out, "siwtun0 -> siwtun1") {
		t.Errorf("table without the applications' stamps:\n%s", out)
	}
}
