package mpa

// Config holds one side's MPA preferences for a connection.
type Config struct {
	Rev     uint8 // MPA revision to speak: 1 (RFC 5044) or 2 (RFC 6581, enhanced)
	CRC     bool  // request CRCs
	Markers bool  // ask the peer to send us Markers
	// P2P is, for an initiator, the RTR types offered (0 = no
	// peer-to-peer mode); for a responder, the RTR types it accepts.
	P2P      RTR
	IRD, ORD uint16 // local inbound / outbound RDMA Read depth
	// MaxIRD is the most inbound RDMA Reads this side can serve: a peer
	// whose ORD exceeds IRD but not MaxIRD raises this side's IRD to its
	// ORD instead of being refused (relaxed IRD negotiation, as Linux siw
	// and cxgb4 do by default: RFC 6581 §3 has each side size its IRD
	// for the peer's ORD). Below IRD (0) the IRD is firm.
	MaxIRD      uint16
	PrivateData []byte // ULP private data to send
	// Ext is the RDMAP extensions (RFC 7306) this side supports: an
	// initiator offers them, a responder accepts those of them the
	// initiator offered (see Ext).
	Ext Ext
	// Ready makes a responder announce ExtReady in the extension block of
	// its accepting Replies to Requests that carried a block (another
	// siwtun): it reads FPDUs arriving right after the Reply. Only an
	// engine whose receive path owns the stream before the Reply leaves
	// may set it. Requests never carry it.
	Ready bool
}

// Params is the outcome of the MPA exchange for one connection.
type Params struct {
	Rev      uint8 // revision in use: the Reply's revision
	Enhanced bool  // the RFC 6581 IRD/ORD block was exchanged
	CRC      bool  // CRCs in both directions (either side asked)

	MarkersTx bool // we insert Markers (the peer asked)
	MarkersRx bool // the peer inserts Markers (we asked)

	P2P bool // peer-to-peer mode: the initiator sends one RTR FPDU first
	RTR RTR  // the RTR type, exactly one when P2P

	// IRD and ORD are our values after negotiation. Without Enhanced they
	// are the configured values and PeerIRD/PeerORD are 0 (unknown).
	IRD, ORD         uint16
	PeerIRD, PeerORD uint16

	// PeerPrivateData is the ULP private data of the peer's frame (after
	// its IRD/ORD block); it aliases that frame's buffer.
	PeerPrivateData []byte

	// Ext is the RDMAP extensions both sides support, which the stream
	// may carry: what the Reply's extension block announced (never
	// ExtReady).
	Ext Ext
	// PeerReady (initiator only) is the Reply block's ExtReady: the
	// responder reads FPDUs that follow its Reply at once.
	PeerReady bool
}

// check validates c for use in a frame with enhanced set or not.
func (c *Config) check(enhanced bool) error {
	if c.Rev != 1 && c.Rev != 2 {
		return newError(CodeLocalCatastrophic, "MPA config: revision %d, want 1 or 2", c.Rev)
	}
	if c.IRD > IRDORDMax || c.ORD > IRDORDMax {
		return newError(CodeLocalCatastrophic, "MPA config: IRD %d / ORD %d exceed %d", c.IRD, c.ORD, IRDORDMax)
	}
	if c.P2P&^(RTRWrite|RTRRead|RTRSend) != 0 {
		return newError(CodeLocalCatastrophic, "MPA config: unknown RTR bits %#x", uint8(c.P2P))
	}
	n := len(c.PrivateData)
	if enhanced {
		n += irdOrdBlockLen
	}
	if n > MaxPrivateDataSend {
		return newError(CodeLocalCatastrophic, "MPA config: %d octets of private data (incl. IRD/ORD block), at most %d may be sent", n, MaxPrivateDataSend)
	}
	return nil
}

// Request builds the initiator's MPA Request. Rev 2 always carries the
// RFC 6581 IRD/ORD block (enhanced); P2P needs Rev 2. Private data is
// limited to MaxPrivateDataSend octets including the 4-octet block.
func (c *Config) Request() (Frame, error) {
	enhanced := c.Rev == 2
	if err := c.check(enhanced); err != nil {
		return Frame{}, err
	}
	if c.P2P != 0 && !enhanced {
		return Frame{}, newError(CodeLocalCatastrophic, "MPA config: peer-to-peer mode needs revision 2")
	}
	f := Frame{
		Rev:         c.Rev,
		CRC:         c.CRC,
		Markers:     c.Markers,
		Enhanced:    enhanced,
		PrivateData: c.PrivateData,
	}
	if enhanced {
		f.IRD, f.ORD = c.IRD, c.ORD
		f.P2P = c.P2P != 0
		f.RTR = c.P2P
	}
	f.Ext = c.extFitting(&f) &^ ExtReady
	return f, nil
}

// extFitting is the extensions c offers in frame f: c.Ext, or none when
// the extension block would push f's private data past
// MaxPrivateDataSend.
func (c *Config) extFitting(f *Frame) Ext {
	if c.Ext == 0 || f.pdLen()+ExtBlockLen > MaxPrivateDataSend {
		return 0
	}
	return c.Ext
}

// replyRev is the revision a responder with revision own answers a request
// of revision peer with (the lower of the two).
func replyRev(own, peer uint8) uint8 {
	return min(own, peer)
}

// pickRTR chooses one RTR type from offered∩accepted, preferring Write,
// then Read, then Send. Read is only eligible when canRead.
func pickRTR(offered, accepted RTR, canRead bool) RTR {
	common := offered & accepted
	switch {
	case common&RTRWrite != 0:
		return RTRWrite
	case common&RTRRead != 0 && canRead:
		return RTRRead
	case common&RTRSend != 0:
		return RTRSend
	}
	return 0
}

// MaxRev is the highest MPA revision this implementation speaks (RFC 6581).
const MaxRev = 2

// Respond runs the responder's side of the exchange: it checks the peer's
// Request req against c and builds the Reply.
//
// Rules:
//   - Revision: the Reply carries min(c.Rev, req.Rev); a Request of Rev 0
//     (pre-standard) is refused. A revision above MaxRev gets no Reply at
//     all: RFC 5044 §7.1 has the receiver close the connection, which the
//     engine's listener does before Respond is reached.
//   - Enhanced (IRD/ORD block) iff the reply revision is 2 and the Request
//     was enhanced. A Rev 2 Request without the flag is accepted as a
//     plain Rev 2 connection, like Linux siw.
//   - CRC in both directions if either side asked; the Reply's C echoes
//     the result. Markers per direction: we insert them if the Request had
//     M, the Reply's M says whether we want them.
//   - IRD/ORD ("relaxed", like siw): the Request's IRD/ORD are the peer's.
//     A peer ORD above c.IRD raises our IRD to it when it is within
//     c.MaxIRD; above both we refuse (CodeInsufficientIRD), since its Read
//     Requests could overrun us. Otherwise our IRD stays c.IRD. Our ORD
//     becomes min(c.ORD, peer IRD) so we never
//     overrun the peer. The Reply carries our resulting IRD and ORD. A peer
//     value of IRDORDMax means "not negotiated" (irdma) and is not checked.
//   - P2P: if the Request has P2P, we pick exactly one type from the
//     offered ∩ c.P2P, preferring Write > Read > Send (Read only if our
//     IRD ≥ 1, since the Read RTR uses one IRD slot); nothing common is
//     refused with CodeNoMatchingRTR. A Request without P2P gets no P2P.
//   - Extensions: the Reply carries an extension block only if the
//     Request had one, announcing the RDMAP extensions of c.Ext ∩ the
//     Request's, and ExtReady when c.Ready is set (if that is not empty
//     and the block fits); the RDMAP extensions are the connection's Ext.
//     A Request without a block (Linux siw) gets a Reply without one.
//
// On refusal err is an *Error and reply is a reject Reply (R=1, no ULP
// private data) the engine may send before closing. A Request with M=1
// is not refused here: whether we can insert Markers is the engine's call.
func Respond(c *Config, req Frame) (reply Frame, p Params, err error) {
	if req.Reply {
		return c.rejectFrame(req, nil), Params{}, newError(CodeInvalidFrame, "expected an MPA Request, got a Reply")
	}
	if req.Rev == 0 {
		return c.rejectFrame(req, nil), Params{}, newError(CodeInvalidFrame, "MPA Request of revision 0 (pre-standard) is not supported")
	}
	rev := replyRev(c.Rev, req.Rev)
	enhanced := rev == 2 && req.Enhanced
	if err := c.check(enhanced); err != nil {
		return c.rejectFrame(req, nil), Params{}, err
	}
	p = Params{
		Rev:             rev,
		Enhanced:        enhanced,
		CRC:             c.CRC || req.CRC,
		MarkersTx:       req.Markers,
		MarkersRx:       c.Markers,
		IRD:             c.IRD,
		ORD:             c.ORD,
		PeerPrivateData: req.PrivateData,
	}
	if enhanced {
		p.PeerIRD, p.PeerORD = req.IRD, req.ORD
		if req.ORD != IRDORDMax && req.ORD > c.IRD {
			if req.ORD > c.MaxIRD {
				return c.rejectFrame(req, nil), Params{}, newError(CodeInsufficientIRD, "peer's ORD %d exceeds our IRD %d", req.ORD, max(c.IRD, c.MaxIRD))
			}
			p.IRD = req.ORD
		}
		if req.IRD != IRDORDMax {
			p.ORD = min(c.ORD, req.IRD)
		}
		if req.P2P {
			p.RTR = pickRTR(req.RTR, c.P2P, c.IRD >= 1)
			if p.RTR == 0 {
				return c.rejectFrame(req, nil), Params{}, newError(CodeNoMatchingRTR, "no matching RTR: peer offers %v, we accept %v", req.RTR, c.P2P)
			}
			p.P2P = true
		}
	}
	reply = Frame{
		Reply:       true,
		Markers:     c.Markers,
		CRC:         p.CRC,
		Enhanced:    enhanced,
		Rev:         rev,
		PrivateData: c.PrivateData,
	}
	if enhanced {
		reply.IRD, reply.ORD = p.IRD, p.ORD
		reply.P2P, reply.RTR = p.P2P, p.RTR
	}
	if req.Ext != 0 {
		ann := c.Ext & req.Ext & ExtAll
		if c.Ready {
			ann |= ExtReady
		}
		reply.Ext = (&Config{Ext: ann}).extFitting(&reply)
	}
	p.Ext = reply.Ext & ExtAll
	return reply, p, nil
}

// rejectFrame builds a reject Reply to req carrying pd.
func (c *Config) rejectFrame(req Frame, pd []byte) Frame {
	rev := replyRev(c.Rev, req.Rev)
	if rev == 0 {
		rev = c.Rev
	}
	f := Frame{
		Reply:       true,
		Reject:      true,
		Rev:         rev,
		PrivateData: pd,
	}
	if rev == 2 && req.Enhanced {
		f.Enhanced = true
		f.IRD, f.ORD = min(c.IRD, IRDORDMax), min(c.ORD, IRDORDMax)
	}
	return f
}

// RejectReply builds the Reply for an application-level rejection of req:
// R=1, M and C clear, the reply revision of Respond, the IRD/ORD block when
// the Request was enhanced, and pd as ULP private data. The caller keeps pd
// within MaxPrivateDataSend-4 octets (Frame.Append fails above
// MaxPrivateDataRecv).
func (c *Config) RejectReply(req Frame, pd []byte) Frame {
	return c.rejectFrame(req, pd)
}

// Complete runs the initiator's side: it checks the peer's Reply rep to our
// Request req (built by c.Request) and returns the connection parameters.
//
// The connection's extensions are those our Request offered that the
// Reply's extension block announces; PeerReady is the block's ExtReady.
//
// A Reply with R=1 gives a *RejectedError carrying the peer's private data.
// Other failures are *Error: not a Reply, or a revision of 0 or above ours
// (CodeInvalidFrame); the peer's ORD above our IRD and c.MaxIRD
// (CodeInsufficientIRD; within c.MaxIRD it raises our IRD, as Respond —
// our ORD is lowered to the peer's IRD silently, RFC 6581 allows the
// initiator to reduce its ORD); P2P requested and an enhanced Reply that
// does not pick exactly one of the offered RTR types, or picks one we did
// not ask for (CodeNoMatchingRTR); a Read RTR with an ORD of 0
// (CodeInsufficientIRD). P2P requested and a Reply that is not enhanced
// (revision 1) is no failure: the connection runs without P2P.
func Complete(c *Config, req, rep Frame) (Params, error) {
	if !rep.Reply {
		return Params{}, newError(CodeInvalidFrame, "expected an MPA Reply, got a Request")
	}
	if rep.Reject {
		return Params{}, &RejectedError{PrivateData: rep.PrivateData}
	}
	if rep.Rev == 0 || rep.Rev > req.Rev {
		return Params{}, newError(CodeInvalidFrame, "MPA Reply revision %d, our Request had %d", rep.Rev, req.Rev)
	}
	enhanced := req.Enhanced && rep.Enhanced && rep.Rev == 2
	p := Params{
		Rev:             rep.Rev,
		Enhanced:        enhanced,
		CRC:             req.CRC || rep.CRC,
		MarkersTx:       rep.Markers,
		MarkersRx:       req.Markers,
		IRD:             c.IRD,
		ORD:             c.ORD,
		PeerPrivateData: rep.PrivateData,
		PeerReady:       req.Ext != 0 && rep.Ext&ExtReady != 0,
	}
	if enhanced {
		p.PeerIRD, p.PeerORD = rep.IRD, rep.ORD
		if rep.ORD != IRDORDMax && rep.ORD > c.IRD {
			if rep.ORD > c.MaxIRD {
				return Params{}, newError(CodeInsufficientIRD, "peer's ORD %d exceeds our IRD %d", rep.ORD, max(c.IRD, c.MaxIRD))
			}
			p.IRD = rep.ORD
		}
		if rep.IRD != IRDORDMax {
			p.ORD = min(c.ORD, rep.IRD)
		}
	}
	switch {
	case req.P2P && !enhanced:
		// A Reply of revision 1, or without the enhanced flag, cannot
		// carry RFC 6581's block: the responder does not speak the
		// enhanced connection set-up, so the connection starts as RFC
		// 5044 §7.1.2 has it (the initiator's first FPDU is its
		// application's), without an RTR. Offering peer-to-peer mode
		// to every peer costs nothing with such a responder.
	case req.P2P && !rep.P2P:
		return Params{}, newError(CodeNoMatchingRTR, "we asked for peer-to-peer mode (RTR %v), the peer's Reply does not accept it", req.RTR)
	case req.P2P:
		if rep.RTR != RTRWrite && rep.RTR != RTRRead && rep.RTR != RTRSend {
			return Params{}, newError(CodeNoMatchingRTR, "peer's Reply must pick exactly one RTR type, got %v", rep.RTR)
		}
		if rep.RTR&req.RTR == 0 {
			return Params{}, newError(CodeNoMatchingRTR, "peer picked RTR %v, we offered %v", rep.RTR, req.RTR)
		}
		if rep.RTR == RTRRead && p.ORD == 0 {
			return Params{}, newError(CodeInsufficientIRD, "peer picked the Read RTR but our ORD is 0 (peer IRD %d)", rep.IRD)
		}
		p.P2P, p.RTR = true, rep.RTR
	case rep.P2P:
		return Params{}, newError(CodeNoMatchingRTR, "peer's Reply sets peer-to-peer mode we did not ask for")
	}
	// Only what we offered counts, whatever else the Reply announces.
	p.Ext = req.Ext & rep.Ext & ExtAll
	return p, nil
}
