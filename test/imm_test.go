package test

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/verbs"
)

// TestDaemonsWriteWithImm: two daemons, an application on each verbs
// socket: 2000 RDMA Writes with Immediate Data (and every eighth a Send
// with Immediate Data) complete at the responder in order, each with its
// immediate value and length, every byte of its data in place when its
// completion comes; at MTU 1500 and 9000 with markers and without CRC, and
// on a lossy, reordering link (the Writes placed out of order).
func TestDaemonsWriteWithImm(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mtu   int
		extra []string
	}{
		{"mtu1500", 1500, nil},
		{"mtu9000-markers-nocrc", 9000, []string{"--markers", "on", "--crc", "off"}},
		{"mtu1500-impaired", 1500, []string{"--impair", "loss=1%,reorder=2%,seed=5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTwoRNICs(t, tc.mtu, tc.extra...)
			cli, srv := r.connect(t, 7174, 64)
			if ext := cli.qp.Info().Params.Ext; ext != mpa.ExtAll {
				t.Fatalf("negotiated extensions %v, want imm|atomic", ext)
			}
			const n, slot, window = 2000, 16 << 10, 32
			smr, sbuf := cli.mr(t, n*slot/8, verbs.AccessLocalWrite)
			for i := range sbuf {
				sbuf[i] = byte(i*131 + i>>9)
			}
			dmr, dbuf := srv.mr(t, n*slot/8, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			rmr, rbuf := srv.mr(t, window*slot, verbs.AccessLocalWrite)
			// Messages reuse the buffers in turn: slot i%(n/8) of the
			// source and target (the data of message i is checked before
			// message i+n/8 is posted), receive buffer i%window.
			size := func(i int) int { return (i*7919 + i/3) % (slot + 1) }
			off := func(i int) int { return (i % (n / 8)) * slot / 8 * 8 % (len(sbuf) - slot) }
			imm := func(i int) uint32 { return 0xa5000000 ^ uint32(i)*2654435761 }
			posted, done := 0, 0
			wcs := make([]verbs.WorkCompletion, 16)
			for done < n {
				for posted < n && posted-done < window {
					i := posted
					if _, err := srv.qp.PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{rmr.SGE(i%window*slot, slot)}}}); err != nil {
						t.Fatal(err)
					}
					wr := verbs.SendWR{ID: uint64(i), Opcode: verbs.WRWriteWithImm, ImmData: imm(i),
						SGL: []verbs.SGE{smr.SGE(off(i), size(i))}, RemoteAddr: dmr.Addr() + uint64(off(i)), RKey: dmr.RKey()}
					if i%8 == 7 {
						wr.Opcode = verbs.WRSendWithImm
					}
					if i%16 == 0 {
						wr.Flags = verbs.FlagSignaled
					}
					if _, err := cli.qp.PostSend([]verbs.SendWR{wr}); err != nil {
						t.Fatalf("message %d: %v", i, err)
					}
					posted++
				}
				for k, _ := cli.scq.Poll(wcs); k > 0; k, _ = cli.scq.Poll(wcs) {
					for _, wc := range wcs[:k] {
						if wc.Status != verbs.WCSuccess {
							t.Fatalf("sender: %+v", wc)
						}
					}
				}
				wc := srv.wait(t, srv.rcq)
				i := done
				want := verbs.WorkCompletion{ID: uint64(i), Opcode: verbs.WCRecvRDMAWithImm, ByteLen: uint32(size(i)),
					QPNum: srv.qp.Num(), Flags: verbs.WCWithImm, ImmData: imm(i)}
				got := dbuf[off(i) : off(i)+size(i)]
				if i%8 == 7 {
					want.Opcode, got = verbs.WCRecv, rbuf[i%window*slot:i%window*slot+size(i)]
				}
				if wc != want {
					t.Fatalf("message %d: completion %+v, want %+v", i, wc, want)
				}
				if !bytes.Equal(got, sbuf[off(i):off(i)+size(i)]) {
					t.Fatalf("message %d: %d bytes differ", i, size(i))
				}
				done++
			}
			c := ctlCounters(t, r.d1)
			t.Logf("%d messages with immediate data verified; responder counters: InRdmaImmediates %d mpaOooPlacedFpdus %d",
				n, c["InRdmaImmediates"], c["mpaOooPlacedFpdus"])
			if c["InRdmaImmediates"] < n {
				t.Fatalf("InRdmaImmediates %d, want at least %d", c["InRdmaImmediates"], n)
			}
			if tc.name == "mtu1500-impaired" && c["mpaOooPlacedFpdus"] == 0 {
				t.Fatal("nothing placed out of order on the lossy link")
			}
		})
	}
}

// TestDaemonsImmPeerWithout: toward a daemon started with --rdmap-ext off
// (as toward Linux siw) a request with immediate data fails at post time
// with ErrNotSupportedByPeer, and the connection goes on.
func TestDaemonsImmPeerWithout(t *testing.T) {
	requireRoot(t)
	r := &twoRNICs{ns: newNetns(t), bin: siwtunBin(t), mtu: 1500,
		a0: netip.MustParseAddr("198.18.1.2"), a1: netip.MustParseAddr("198.18.2.2")}
	r.d0 = startDaemon(t, r.ns, r.bin, "siwtun0", "198.18.1.2/24", "198.18.1.1/24", 1500)
	r.d1 = startDaemon(t, r.ns, r.bin, "siwtun1", "198.18.2.2/24", "198.18.2.1/24", 1500, "--rdmap-ext", "off")
	r.dial(t)
	cli, srv := r.connect(t, 7174, 16)
	dmr, dbuf := srv.mr(t, 64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	for _, op := range []verbs.WROpcode{verbs.WRWriteWithImm, verbs.WRSendWithImm} {
		n, err := cli.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: op, Flags: verbs.FlagInline | verbs.FlagSignaled,
			Inline: []byte("x"), ImmData: 1, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()}})
		if n != 0 || !errors.Is(err, verbs.ErrNotSupportedByPeer) {
			t.Fatalf("PostSend(%v) = %d, %v; want ErrNotSupportedByPeer", op, n, err)
		}
		t.Log(err)
	}
	if _, err := cli.qp.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRWrite, Flags: verbs.FlagInline | verbs.FlagSignaled,
		Inline: []byte("plain write"), RemoteAddr: dmr.Addr(), RKey: dmr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := cli.wait(t, cli.scq); wc.ID != 2 || wc.Status != verbs.WCSuccess {
		t.Fatalf("plain write after the refusals: %+v", wc)
	}
	eventually(t, 10*time.Second, "the plain write placed", func() (bool, string) {
		return string(dbuf[:11]) == "plain write", fmt.Sprintf("%q", dbuf[:11])
	})
	if c := ctlCounters(t, r.d1); c["InRdmaImmediates"] != 0 {
		t.Fatalf("%d Immediate Data messages reached the daemon without RFC 7306", c["InRdmaImmediates"])
	}
}
