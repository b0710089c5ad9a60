package test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/verbs"
)

// ctlStats returns a daemon's counters of every layer by name.
func ctlStats(t testing.TB, d *daemon) map[string]uint64 {
	t.Helper()
	c, err := ctl.Dial(ctl.SocketPath(d.socketDir, d.dev))
	if err != nil {
		t.Fatalf("ctl %s: %v", d.dev, err)
	}
	defer c.Close()
	s, err := c.Stats()
	if err != nil {
		t.Fatalf("ctl stats %s: %v", d.dev, err)
	}
	m := make(map[string]uint64)
	for _, l := range s.Layers() {
		for _, c := range l.Counters {
			m[c.Name] += c.Value
		}
	}
	return m
}

// TestImpairedDaemons moves 1 GiB between two daemons whose links both
// drop, reorder and duplicate packets (siwtun up --impair, both directions
// of each link): a third as RDMA WRITEs, a third as RDMA READs and a third
// as SENDs, every byte of every message verified.
func TestImpairedDaemons(t *testing.T) {
	const imp = "loss=0.5%,reorder=2%,dup=0.5%,seed=7"
	r := newTwoRNICs(t, 9000, "--impair", imp)
	cli, srv := r.connect(t, 7174, 16)
	const msg = 4 << 20
	const perOp = ((1 << 30) + 3*msg - 1) / 3 / msg // messages per operation: 86 × 4 MiB, 1032 MiB in all
	smr, sbuf := cli.mr(t, msg, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	kmr, kbuf := cli.mr(t, msg, verbs.AccessLocalWrite)
	dmr, dbuf := srv.mr(t, msg, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	rmr, rbuf := srv.mr(t, msg, verbs.AccessLocalWrite)
	post := func(_ int, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	var moved int64
	for i := range perOp {
		seed := byte(i)
		// RDMA WRITE, then a Send behind it tells the target it is there.
		copy(sbuf, pattern(msg, seed))
		post(srv.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{rmr.SGE(0, 16)}}}))
		post(cli.qp.PostSend([]verbs.SendWR{
			{ID: 2, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{smr.SGE(0, msg)}, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()},
			{ID: 3, Opcode: verbs.WRSend, Flags: verbs.FlagInline, Inline: []byte("written")},
		}))
		expectOK(t, "write", cli.wait(t, cli.scq))
		expectOK(t, "write notice", srv.wait(t, srv.rcq))
		if !bytes.Equal(dbuf, sbuf) {
			t.Fatalf("RDMA WRITE %d: target bytes differ", i)
		}
		// RDMA READ of a fresh pattern.
		copy(dbuf, pattern(msg, seed+101))
		post(cli.qp.PostSend([]verbs.SendWR{{ID: 4, Opcode: verbs.WRRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{kmr.SGE(0, msg)}, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()}}))
		expectOK(t, "read", cli.wait(t, cli.scq))
		if !bytes.Equal(kbuf, dbuf) {
			t.Fatalf("RDMA READ %d: bytes differ", i)
		}
		// SEND of a third pattern.
		copy(sbuf, pattern(msg, seed+53))
		post(srv.qp.PostRecv([]verbs.RecvWR{{ID: 5, SGL: []verbs.SGE{rmr.SGE(0, msg)}}}))
		post(cli.qp.PostSend([]verbs.SendWR{{ID: 6, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{smr.SGE(0, msg)}}}))
		expectOK(t, "send", cli.wait(t, cli.scq))
		if wc := srv.wait(t, srv.rcq); wc.Status != verbs.WCSuccess || wc.ByteLen != msg {
			t.Fatalf("receive %d: %v, %d bytes", i, wc.Status, wc.ByteLen)
		}
		if !bytes.Equal(rbuf, sbuf) {
			t.Fatalf("SEND %d: received bytes differ", i)
		}
		moved += 3 * msg
	}
	el := time.Since(start)
	s0, s1 := ctlStats(t, r.d0), ctlStats(t, r.d1)
	t.Logf("%d MiB verified in %v (%.0f MB/s) under %s; retransmitted segments %d / %d, CRC errors %d / %d, placed out of order %d / %d FPDUs (%d / %d octets)",
		moved>>20, el.Round(time.Millisecond), float64(moved)/el.Seconds()/1e6, imp,
		s0["tcpRetransSegs"], s1["tcpRetransSegs"], s0["mpaCrcErrors"], s1["mpaCrcErrors"],
		s0["mpaOooPlacedFpdus"], s1["mpaOooPlacedFpdus"], s0["mpaOooPlacedOctets"], s1["mpaOooPlacedOctets"])
	if s0["tcpRetransSegs"]+s1["tcpRetransSegs"] == 0 {
		t.Error("no TCP retransmissions: the impairments were not applied")
	}
	// WRITEs go to siwtun1, READ responses to siwtun0: both place tagged
	// FPDUs out of order behind the lost and reordered segments.
	if s0["mpaOooPlacedFpdus"] == 0 || s1["mpaOooPlacedFpdus"] == 0 {
		t.Errorf("no FPDU placed out of order (siwtun0 %d, siwtun1 %d) under loss and reorder", s0["mpaOooPlacedFpdus"], s1["mpaOooPlacedFpdus"])
	}
}

// TestCorruptedLinkDaemons runs RDMA WRITEs over links that flip payload
// bytes with the TCP checksum fixed (siwtun up --impair corrupt=…), with CRC
// on: a corrupted FPDU ends the connection with the MPA CRC Terminate, the
// application sees an error, and every message that completed successfully
// holds exactly the bytes written.
func TestCorruptedLinkDaemons(t *testing.T) {
	r := newTwoRNICs(t, 9000, "--impair", "corrupt=0.05%,seed=3")
	cli, srv := r.connect(t, 7174, 16)
	const msg = 1 << 20
	smr, sbuf := cli.mr(t, msg, verbs.AccessLocalWrite)
	dmr, dbuf := srv.mr(t, msg, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	rmr, _ := srv.mr(t, msg, verbs.AccessLocalWrite)
	good := 0
	var failed verbs.WorkCompletion
	for i := 0; i < 200; i++ {
		copy(sbuf, pattern(msg, byte(i)))
		if _, err := srv.qp.PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{rmr.SGE(0, 16)}}}); err != nil {
			break // the QP is already in ERR
		}
		if _, err := cli.qp.PostSend([]verbs.SendWR{
			{ID: 2, Opcode: verbs.WRWrite, SGL: []verbs.SGE{smr.SGE(0, msg)}, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()},
			{ID: 3, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("written")},
		}); err != nil {
			break
		}
		swc := cli.wait(t, cli.scq)
		rwc := srv.wait(t, srv.rcq)
		if swc.Status != verbs.WCSuccess || rwc.Status != verbs.WCSuccess {
			failed = rwc
			if rwc.Status == verbs.WCSuccess {
				failed = swc
			}
			break
		}
		if !bytes.Equal(dbuf, sbuf) {
			t.Fatalf("message %d completed successfully with corrupted bytes", i)
		}
		good++
	}
	if failed.Status == verbs.WCSuccess {
		t.Fatalf("%d messages of 1 MiB over a corrupting link and no error", good)
	}
	s0, s1 := ctlStats(t, r.d0), ctlStats(t, r.d1)
	crc := s0["mpaCrcErrors"] + s1["mpaCrcErrors"]
	// A corruption that raised an FPDU's length past a buffer is answered
	// as its header shows it, before the FPDU's CRC (mpaErrorsBeforeCrc).
	early := s0["mpaErrorsBeforeCrc"] + s1["mpaErrorsBeforeCrc"]
	term := s0["rdmapTerminateTx"] + s1["rdmapTerminateTx"]
	t.Logf("%d good messages, then %v; CRC errors %d, errors before a CRC %d, Terminates sent %d", good, failed.Status, crc, early, term)
	if crc+early == 0 || term == 0 {
		t.Errorf("the corruption was not caught by MPA's CRC with a Terminate: crc errors %d, errors before a CRC %d, terminates %d", crc, early, term)
	}
	waitState(t, cli.qp, verbs.QPErr)
	waitState(t, srv.qp, verbs.QPErr)
}

func expectOK(t testing.TB, what string, wc verbs.WorkCompletion) {
	t.Helper()
	if wc.Status != verbs.WCSuccess {
		t.Fatalf("%s: %v", what, fmt.Sprint(wc.Status))
	}
}

// writeInBatches RDMA Writes msg bytes from smr to dmr n times, posted
// eight at a time with only the eighth signaled, and waits for each
// batch's completion.
func writeInBatches(t testing.TB, cli *end, smr, dmr *verbs.MR, msg, n int) {
	t.Helper()
	for i := 0; i < n; i += 8 {
		wrs := make([]verbs.SendWR, 8)
		for j := range wrs {
			wrs[j] = verbs.SendWR{ID: uint64(i + j), Opcode: verbs.WRWrite, SGL: []verbs.SGE{smr.SGE(0, msg)}, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()}
		}
		wrs[7].Flags = verbs.FlagSignaled
		if _, err := cli.qp.PostSend(wrs); err != nil {
			t.Fatal(err)
		}
		expectOK(t, "write", cli.wait(t, cli.scq))
	}
}

// TestAlignmentDaemons moves 1 GiB of RDMA WRITE between two daemons with
// default settings and no impairment, at MTU 1500 and 9000, markers off and
// on (both directions), and checks from the daemons' own counters that at
// least 99.9 % of the data segments were FPDU-aligned on both ends.
func TestAlignmentDaemons(t *testing.T) {
	for _, mtu := range []int{1500, 9000} {
		for _, markers := range []bool{false, true} {
			t.Run(fmt.Sprintf("mtu%d/markers=%v", mtu, markers), func(t *testing.T) {
				r := newTwoRNICs(t, mtu, fmt.Sprintf("--markers=%v", markers))
				cli, srv := r.connect(t, 7174, 16)
				const msg = 4 << 20
				smr, _ := cli.mr(t, msg, verbs.AccessLocalWrite)
				dmr, _ := srv.mr(t, msg, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
				writeInBatches(t, cli, smr, dmr, msg, (1<<30)/msg)
				s0, s1 := ctlStats(t, r.d0), ctlStats(t, r.d1)
				for _, c := range []struct {
					what           string
					aligned, split uint64
				}{
					{"sent by siwtun0", s0["mpaAlignedSegsTx"], s0["mpaSplitSegsTx"]},
					{"received by siwtun1", s1["mpaAlignedSegsRx"], s1["mpaSplitSegsRx"]},
				} {
					total := c.aligned + c.split
					pct := 100 * float64(c.aligned) / float64(max(total, 1))
					t.Logf("MTU %d, markers %v: data segments %s: %d, aligned %d (%.3f %%), split %d", mtu, markers, c.what, total, c.aligned, pct, c.split)
					if total < (1<<30)/uint64(mtu) || pct < 99.9 {
						t.Errorf("%s: %d of %d segments aligned", c.what, c.aligned, total)
					}
				}
			})
		}
	}
}
