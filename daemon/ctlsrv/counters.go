package ctlsrv

import (
	"github.com/siwtun/siwtun/ctl"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
)

// Object counts of the verbs layer, which are not engine counters.
const (
	nameQPActive = "qpActive"
	nameMRActive = "mrActive"
)

// Documentation of the verbs layer's object counts.
const (
	docQPActive = "Queue pairs that exist now."
	docMRActive = "Memory regions registered now."
)

// tcpCounter names and documents one netstack.TCPStats field.
type tcpCounter struct {
	field string // the TCPStats field, for the coverage test
	name  string // the TCP-MIB name (RFC 4022) or Linux's TcpExt name
	doc   string
	get   func(*netstack.TCPStats) uint64
}

// tcpCounters lists every netstack.TCPStats field in struct order. A test
// checks that it covers the struct and that each get reads its field.
func tcpCounters() []tcpCounter {
	return []tcpCounter{
		{"ActiveOpens", "tcpActiveOpens", "Connections opened actively (Dial) that completed the handshake.", func(s *netstack.TCPStats) uint64 { return s.ActiveOpens }},
		{"PassiveOpens", "tcpPassiveOpens", "Connections opened passively (accepted from a listener).", func(s *netstack.TCPStats) uint64 { return s.PassiveOpens }},
		{"AttemptFails", "tcpAttemptFails", "Dial or Listen calls that failed.", func(s *netstack.TCPStats) uint64 { return s.AttemptFails }},
		{"EstabResets", "tcpEstabResets", "Direct transitions to CLOSED from ESTABLISHED or CLOSE-WAIT.", func(s *netstack.TCPStats) uint64 { return s.EstabResets }},
		{"CurrEstab", "tcpCurrEstab", "Connections currently in ESTABLISHED (a gauge, not cumulative).", func(s *netstack.TCPStats) uint64 { return s.CurrEstab }},
		{"InSegs", "tcpInSegs", "Segments received by the stack, including those received in error.", func(s *netstack.TCPStats) uint64 { return s.InSegs }},
		{"OutSegs", "tcpOutSegs", "Segments sent by the stack, excluding retransmissions.", func(s *netstack.TCPStats) uint64 { return s.OutSegs }},
		{"RetransSegs", "tcpRetransSegs", "Segments retransmitted.", func(s *netstack.TCPStats) uint64 { return s.RetransSegs }},
		{"InErrs", "tcpInErrs", "Segments received in error (malformed or with a bad checksum).", func(s *netstack.TCPStats) uint64 { return s.InErrs }},
		{"OutRsts", "tcpOutRsts", "Segments sent with RST.", func(s *netstack.TCPStats) uint64 { return s.OutRsts }},
		{"InCsumErrors", "tcpInCsumErrors", "Segments dropped for a bad checksum (included in tcpInErrs).", func(s *netstack.TCPStats) uint64 { return s.InCsumErrors }},
		{"InRsts", "tcpInRsts", "Segments received with RST (not a TCP-MIB object).", func(s *netstack.TCPStats) uint64 { return s.InRsts }},
		{"Timeouts", "tcpTimeouts", "Retransmission timer expiries (Linux TcpExtTCPTimeouts).", func(s *netstack.TCPStats) uint64 { return s.Timeouts }},
		{"FastRetrans", "tcpFastRetrans", "Segments retransmitted by fast retransmit (Linux TcpExtTCPFastRetrans).", func(s *netstack.TCPStats) uint64 { return s.FastRetrans }},
		{"SACKRecovery", "tcpSackRecovery", "Times SACK-based loss recovery was entered (Linux TcpExtTCPSackRecovery).", func(s *netstack.TCPStats) uint64 { return s.SACKRecovery }},
		{"TailRescues", "tcpTailRescues", "Data packets written again for connections whose TCP sender had stopped with data unacknowledged (siwtun's tail rescue; not a TCP-MIB object).", func(s *netstack.TCPStats) uint64 { return s.TailRescues }},
		{"HeldTails", "tcpHeldTails", "FPDU starts that segmentation offload held back because TCP had cut their FPDU at the peer's window edge, until the rest came (siwtun's; not a TCP-MIB object).", func(s *netstack.TCPStats) uint64 { return s.HeldTails }},
		{"HeldTailsAlone", "tcpHeldTailsAlone", "Held FPDU starts that left without their rest: it did not come after 4 window probes (300 ms), or a FIN overtook it (siwtun's; not a TCP-MIB object).", func(s *netstack.TCPStats) uint64 { return s.HeldTailsAlone }},
		{"HeldTailProbes", "tcpHeldTailProbes", "Window probes sent for held FPDU starts whose rest was slow to come: 20 ms, then twice as long each time (siwtun's; not a TCP-MIB object).", func(s *netstack.TCPStats) uint64 { return s.HeldTailProbes }},
		{"ResentOnGrid", "tcpResentOnGrid", "Retransmissions sent again along the FPDU grid of the aligned writes, each FPDU whole, rather than where TCP cut them (siwtun's; not a TCP-MIB object).", func(s *netstack.TCPStats) uint64 { return s.ResentOnGrid }},
	}
}

// buildStats arranges a device's counters by layer. The tcp layer starts
// with the stack-wide TCP-MIB counters; the queue pairs' own tcp* counters
// follow, except where a stack-wide counter has the same name (tcpInSegs,
// tcpOutSegs: the stack's count is the MIB object; the per-QP ones stay
// visible per queue pair).
func buildStats(link string, tcp netstack.TCPStats, qp []offload.Counter, qps, mrs int) ctl.Stats {
	s := ctl.Stats{Link: link}
	tcpTable, qpTable := tcpCounters(), ctl.QPCounters()
	for name, info := range ctl.SocketCounters() {
		qpTable[name] = info
	}
	seen := make(map[string]bool, len(tcpTable)+len(qp))
	for _, c := range tcpTable {
		s.TCP = append(s.TCP, ctl.Counter{Name: c.name, Value: c.get(&tcp), Doc: c.doc})
		seen[c.name] = true
	}
	for _, c := range qp {
		if seen[c.Name] {
			continue
		}
		seen[c.Name] = true
		info, ok := qpTable[c.Name]
		if !ok {
			info = ctl.CounterInfo{Layer: ctl.LayerOther}
		}
		out := ctl.Counter{Name: c.Name, Value: c.Value, Doc: info.Doc}
		switch info.Layer {
		case ctl.LayerTCP:
			s.TCP = append(s.TCP, out)
		case ctl.LayerMPA:
			s.MPA = append(s.MPA, out)
		case ctl.LayerDDP:
			s.DDP = append(s.DDP, out)
		case ctl.LayerRDMAP:
			s.RDMAP = append(s.RDMAP, out)
		case ctl.LayerVerbs:
			s.Verbs = append(s.Verbs, out)
		default:
			s.Other = append(s.Other, out)
		}
	}
	s.Verbs = append(s.Verbs,
		ctl.Counter{Name: nameQPActive, Value: uint64(qps), Doc: docQPActive},
		ctl.Counter{Name: nameMRActive, Value: uint64(mrs), Doc: docMRActive},
	)
	return s
}
