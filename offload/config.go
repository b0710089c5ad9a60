package offload

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/siwtun/siwtun/iwarp/mpa"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// Config holds a device's iWARP defaults and limits.
type Config struct {
	// Name is the device name (siwtun0).
	Name string
	// MAC is the hardware address of the interface the device stands on,
	// from which its node GUID and iWARP GID are built (as Linux siw,
	// cxgb4 and irdma build them from their interface's); zero:
	// verbs.NodeMAC of Name, for a TUN device, which has none.
	MAC [6]byte
	// MPARev is the MPA revision requested: 1 (RFC 5044) or 2 (RFC 6581).
	MPARev uint8
	// CRC requests MPA CRC32c (it is used when either side asks).
	CRC bool
	// Markers asks the peer to insert MPA markers towards us.
	Markers bool
	// MarkersPrefer (with Markers) makes markers a preference rather than a
	// demand, for peers without markers such as Linux siw: an initiator
	// whose Request the peer rejects for its M flag (a Reply with R set and
	// M clear) connects again without asking for markers, and a responder
	// asks for them only when the initiator asked for markers too.
	MarkersPrefer bool
	// P2P is the set of RTR types offered as initiator (RFC 6581
	// peer-to-peer mode; 0: none, the connection starts as RFC 5044 has
	// it). DefaultConfig offers the Write and the Read RTR, as Linux siw
	// with peer_to_peer=1 and Intel's irdma do: siw accepts the offer
	// whatever its own setting, another siwtun ends its startup hold
	// (StartupHold) as soon as the RTR comes, and a responder of MPA
	// revision 1 just runs the connection without it. Only at MPA
	// revision 2.
	P2P mpa.RTR
	// P2PAccept is the set of RTR types accepted as responder; 0: every
	// type a peer offers (Write preferred, then Read, then Send).
	P2PAccept mpa.RTR
	// IRD and ORD are the default inbound and outbound RDMA Read depths
	// when a connection does not set them.
	IRD, ORD uint16
	// MaxFPDU caps the FPDU size below the effective MSS: large FPDUs on
	// jumbo links risk window-edge splits (netstack-probe.md §1e).
	MaxFPDU int
	// FPDUsPerWrite caps how many whole FPDUs one TCP write carries (see
	// QP.sendMessage); 0 means as many as fit in 64 KiB, 1 is one FPDU per
	// write. Either way each segment starts with an FPDU.
	FPDUsPerWrite int
	// RDMAPExt offers and accepts siwtun's RFC 7306 extensions (Immediate
	// Data: RDMA Write and Send with Immediate Data) on every connection,
	// announced in the MPA private data's extension block (mpa.Ext); a
	// connection uses them only if the peer announced them too. Off, the
	// MPA frames carry exactly the application's private data.
	RDMAPExt bool
	// MaxQP and MaxMR bound the device's objects.
	MaxQP, MaxMR int
	// FirstFPDUDelay is how long an initiator waits after the MPA Reply
	// before it lets its first FPDU (or RTR) go, unless the Reply says
	// that the responder reads at once (mpa.ExtReady in its extension
	// block, which siwtun's Replies to siwtun Requests carry and Linux
	// siw's never do). Linux siw sends its Reply
	// before it hands the socket to its receive path (or, in peer-to-peer
	// mode, to its RTR handler); an FPDU arriving in that gap sits unread
	// in siw's socket until more data comes, which a request/response
	// protocol (rping) never sends: the connection stalls. 0 sends at
	// once to every peer.
	FirstFPDUDelay time.Duration
	// StartupHold bounds how long a responder holds its sends after its
	// MPA Reply when the connection has no peer-to-peer mode and the
	// initiator's first FPDU has not arrived: RFC 5044 §7.1.2 has a
	// responder send no FPDU before it has received one (see startup.go),
	// which would leave a server that speaks first waiting for ever
	// towards an initiator that does not offer peer-to-peer mode (Linux
	// siw's default). The hold ends once the Reply has been acknowledged
	// by TCP and StartupHold has passed since. Negative: no bound, the
	// rule kept strictly. In peer-to-peer mode the RTR ends the wait.
	StartupHold time.Duration
	// FINDelay is how long the connection of a QP whose peer is not known
	// to be siwtun holds its FIN back when the application disconnects or
	// destroys the QP (the QP is gone at once; only TCP's close waits).
	// Linux siw fails a message it has already transmitted when the
	// peer's FIN arrives before its send call returned (siw_qp_sq_proc_tx
	// checks tx_suspend before the message's last flag: LOC_QP_OP_ERR,
	// perftest's "Bad wc status 2"), which a peer that answers and closes
	// at once triggers. A peer is known to be siwtun by its Reply's
	// mpa.ExtReady or its Request's extension block. 0 closes at once.
	FINDelay time.Duration
	// ConnectTimeout bounds the wait for the MPA Reply (siw: 10 s).
	ConnectTimeout time.Duration
	// AcceptTimeout is the MPA accept timeout: how long a listener waits,
	// after the TCP handshake, for a connection's whole MPA Request
	// (DefaultAcceptTimeout; `siwtun up --mpa-accept-timeout`). A
	// connection that sends nothing, or a Request cut off mid-frame, is
	// reset when it passes, unanswered, and counted in mpaAcceptTimeouts:
	// half-open attempts hold a goroutine and a TCP endpoint this long at
	// most. RFC 5044 leaves the value to the implementation; Linux siw
	// waits MPA_REQ_TIMEOUT, 10 s.
	AcceptTimeout time.Duration
	// FPDUTimeout bounds how long a connection waits, with an FPDU half
	// received, for the next octet of it (0: DefaultFPDUTimeout; negative:
	// for ever). A peer writes each FPDU whole, so a gap that long in the
	// middle of one is no peer's pause: the peer stopped in the middle of
	// an FPDU (or its ULPDU_Length was damaged upwards on the wire, TCP's
	// checksum missing it, and announces octets the peer will never send).
	// Without the bound such a connection waits silently for ever, both
	// applications included. When it passes the connection ends with the
	// Terminate LLP / MPA 0x01 "TCP connection closed, terminated or lost"
	// (RFC 5044 §8: the stream is given up in the middle of an FPDU; no
	// CRC was checked, so never the CRC error) and counts in
	// mpaFpduTimeouts. TCP retransmitting a lost segment (its timeout
	// doubling from 200 ms) waits longer than this only after six losses
	// of that segment in a row.
	FPDUTimeout time.Duration
	// Logger receives the engine's log lines (nil: discarded).
	Logger *slog.Logger
}

// DefaultFirstFPDUDelay is the default Config.FirstFPDUDelay.
const DefaultFirstFPDUDelay = 20 * time.Millisecond

// DefaultStartupHold is the default Config.StartupHold. Linux siw's
// initiator, woken by the Reply's arrival, reads it from a work queue
// and only then hands its socket to its receive path. Against siw in the
// peer VM (qemu without KVM, on a loaded 2-core machine), a server that
// sent first failed 32 of 50 connections when the hold ended with the
// Reply's acknowledgement, 8 of 150 at 20 ms after it, 1 of 100 at 50 ms
// and none of 100 at 100 ms; the default keeps twice that (see
// doc/connection-setup.md).
const DefaultStartupHold = 200 * time.Millisecond

// DefaultFINDelay is the default Config.FINDelay.
const DefaultFINDelay = 20 * time.Millisecond

// DefaultFPDUTimeout is the default Config.FPDUTimeout: the longest gap
// in the middle of an FPDU.
const DefaultFPDUTimeout = 10 * time.Second

// DefaultAcceptTimeout is the default Config.AcceptTimeout, the MPA accept
// timeout.
const DefaultAcceptTimeout = 5 * time.Second

// DefaultConfig returns the defaults of a siwtun device: MPA rev 2, CRC on,
// markers off, P2P with the Write and Read RTR offered (every RTR type
// accepted), IRD = ORD = 16, FPDUs ≤ 16 KiB, whole MSS-sized
// FPDUs batched into TCP writes of up to 64 KiB where TCP's cuts fall
// between them (FPDUsPerWrite 0; 100 % aligned on the wire, see
// doc/segmentation-offload.md), RFC 7306 extensions offered, the first
// FPDU of an initiator DefaultFirstFPDUDelay after the MPA Reply of a peer
// that does not say it reads at once, the FIN to a peer not known to be
// siwtun DefaultFINDelay after the QP's end, a responder's startup hold
// bounded by DefaultStartupHold.
func DefaultConfig(name string) Config {
	return Config{
		Name: name, MPARev: 2, CRC: true, IRD: 16, ORD: 16, RDMAPExt: true,
		MaxFPDU: 16384, FPDUsPerWrite: 0, MaxQP: 4096, MaxMR: 65536,
		P2P:            mpa.RTRWrite | mpa.RTRRead,
		FirstFPDUDelay: DefaultFirstFPDUDelay, FINDelay: DefaultFINDelay,
		StartupHold:    DefaultStartupHold,
		ConnectTimeout: 10 * time.Second, AcceptTimeout: DefaultAcceptTimeout,
	}
}

func (c *Config) validate() error {
	if c.MPARev != 1 && c.MPARev != 2 {
		return fmt.Errorf("MPA revision %d: want 1 or 2", c.MPARev)
	}
	if c.IRD > ibv.MaxIRDORD || c.ORD > ibv.MaxIRDORD {
		return fmt.Errorf("IRD %d / ORD %d: at most %d", c.IRD, c.ORD, ibv.MaxIRDORD)
	}
	if c.MaxFPDU < 128 {
		return fmt.Errorf("MaxFPDU %d: at least 128", c.MaxFPDU)
	}
	if c.FirstFPDUDelay < 0 || c.FINDelay < 0 {
		return fmt.Errorf("FirstFPDUDelay %v / FINDelay %v: must not be negative", c.FirstFPDUDelay, c.FINDelay)
	}
	if c.AcceptTimeout < 0 || c.ConnectTimeout < 0 {
		return fmt.Errorf("AcceptTimeout %v / ConnectTimeout %v: must not be negative", c.AcceptTimeout, c.ConnectTimeout)
	}
	if c.MaxQP <= 0 || c.MaxMR <= 0 {
		return fmt.Errorf("MaxQP %d / MaxMR %d must be positive", c.MaxQP, c.MaxMR)
	}
	return nil
}
