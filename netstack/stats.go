package netstack

// TCPStats are the stack's TCP counters under their RFC 4022 (TCP-MIB) names,
// as exposed by iWARP NICs (iw_cxgb3, i40iw/irdma), taken from gVisor's
// tcpip.Stats. They are cumulative since New, except CurrEstab.
type TCPStats struct {
	// ActiveOpens (tcpActiveOpens) is the number of connections opened
	// actively (Dial) that completed the handshake.
	ActiveOpens uint64
	// PassiveOpens (tcpPassiveOpens) is the number of connections opened
	// passively (accepted from a listener).
	PassiveOpens uint64
	// AttemptFails (tcpAttemptFails) is the number of Dial or Listen calls
	// that failed.
	AttemptFails uint64
	// EstabResets (tcpEstabResets) is the number of direct transitions to
	// CLOSED from ESTABLISHED or CLOSE-WAIT.
	EstabResets uint64
	// CurrEstab (tcpCurrEstab) is the number of connections currently in
	// ESTABLISHED.
	CurrEstab uint64
	// InSegs (tcpInSegs) is the number of segments received, including
	// those received in error (gVisor's valid + invalid + bad checksum).
	InSegs uint64
	// OutSegs (tcpOutSegs) is the number of segments sent, excluding
	// retransmissions (gVisor's SegmentsSent minus Retransmits).
	OutSegs uint64
	// RetransSegs (tcpRetransSegs) is the number of segments retransmitted.
	RetransSegs uint64
	// InErrs (tcpInErrs) is the number of segments received in error
	// (malformed or with a bad checksum).
	InErrs uint64
	// OutRsts (tcpOutRsts) is the number of segments sent with RST.
	OutRsts uint64
	// InCsumErrors (tcpInCsumErrors) is the number of segments dropped for
	// a bad checksum (included in InErrs).
	InCsumErrors uint64
	// InRsts is the number of segments received with RST (gVisor's
	// ResetsReceived; not a TCP-MIB object).
	InRsts uint64
	// Timeouts is the number of retransmission timer expiries (Linux
	// TcpExtTCPTimeouts).
	Timeouts uint64
	// FastRetrans is the number of segments retransmitted by fast
	// retransmit (Linux TcpExtTCPFastRetrans).
	FastRetrans uint64
	// SACKRecovery is the number of times SACK-based loss recovery was
	// entered (Linux TcpExtTCPSackRecovery).
	SACKRecovery uint64
	// TailRescues (not a TCP-MIB object) is the number of data packets the
	// stack wrote again for connections whose TCP sender had stopped with
	// data unacknowledged (see Stack.TailRescues).
	TailRescues uint64
	// HeldTails (not a TCP-MIB object) is the number of times segmentation
	// offload held back the start of an FPDU that gVisor had cut at the
	// peer's window edge, until the rest came (see Options.NoGSO).
	HeldTails uint64
	// HeldTailsAlone is the number of held FPDU starts that left without
	// their rest, split from it: it did not come after 4 window probes
	// (300 ms), or a FIN overtook it.
	HeldTailsAlone uint64
	// HeldTailProbes (not a TCP-MIB object) is the number of window probes
	// sent for held FPDU starts whose rest was slow to come (20 ms, then
	// twice as long each time).
	HeldTailProbes uint64
	// ResentOnGrid (not a TCP-MIB object) is the number of
	// retransmissions the link sent again along the FPDU grid of the
	// aligned writes (see resend.go), rather than as TCP cut them.
	ResentOnGrid uint64
}

// Stats returns a copy of the stack's TCP counters.
func (s *Stack) Stats() TCPStats {
	t := s.s.Stats().TCP
	sent, retrans := t.SegmentsSent.Value(), t.Retransmits.Value()
	valid, invalid, csum := t.ValidSegmentsReceived.Value(), t.InvalidSegmentsReceived.Value(), t.ChecksumErrors.Value()
	return TCPStats{
		ActiveOpens:    t.ActiveConnectionOpenings.Value(),
		PassiveOpens:   t.PassiveConnectionOpenings.Value(),
		AttemptFails:   t.FailedConnectionAttempts.Value(),
		EstabResets:    t.EstablishedResets.Value(),
		CurrEstab:      t.CurrentEstablished.Value(),
		InSegs:         valid + invalid + csum,
		OutSegs:        sent - min(retrans, sent),
		RetransSegs:    retrans,
		InErrs:         invalid + csum,
		OutRsts:        t.ResetsSent.Value(),
		InCsumErrors:   csum,
		InRsts:         t.ResetsReceived.Value(),
		Timeouts:       t.Timeouts.Value(),
		FastRetrans:    t.FastRetransmit.Value(),
		SACKRecovery:   t.SACKRecovery.Value(),
		TailRescues:    s.tailRescues.Load(),
		HeldTails:      s.tailsHeld.Load(),
		HeldTailsAlone: s.tailsAlone.Load(),
		HeldTailProbes: s.holdProbes.Load(),
		ResentOnGrid:   s.resent.Load(),
	}
}
