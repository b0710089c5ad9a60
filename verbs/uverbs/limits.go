package uverbs

import (
	"fmt"

	"github.com/siwtun/siwtun/verbs/internal/uabi"
)

// Limits bound what one client session (one connection to the verbs
// socket) may hold at once, so that one client cannot take the daemon's
// memory, descriptors or mappings from the others. A request that would
// go past a limit fails with status StLimit (verbs.ErrLimit in Go, ENOMEM
// through libsiwtun) and changes nothing; the session goes on, and
// destroying objects makes room again. A limit of 0 is no limit.
type Limits struct {
	// QPs, CQs, MRs, PDs and Listeners bound the objects of each kind.
	QPs, CQs, MRs, PDs, Listeners int
	// MRBytes bounds the bytes of the client's registered regions, summed
	// (the daemon maps each region of the client's memory).
	MRBytes uint64
	// WRs bounds the work requests the client's QPs can hold outstanding:
	// the sum of their send and receive queue depths (as granted, rounded
	// up to a power of two). The queues' rings are the daemon's memory.
	WRs int
	// CQEs bounds the entries of the client's CQs, summed (as granted,
	// rounded up to a power of two); their rings are the daemon's memory.
	CQEs int
	// SRQs bounds the client's shared receive queues (their depths
	// count in WRs).
	SRQs int
}

// DefaultLimits are the limits of a server that was given none (and the
// defaults of siwtun up's --max-client-* flags): far above what an
// application of one process usually asks for, and low enough that a
// runaway client cannot take the daemon down.
func DefaultLimits() Limits {
	return Limits{
		QPs:       1024,
		CQs:       2048,
		MRs:       8192,
		PDs:       1024,
		Listeners: 256,
		MRBytes:   64 << 30,
		WRs:       1 << 18,
		CQEs:      1 << 21,
		SRQs:      1024,
	}
}

// SetLimits sets the per-client limits of sessions; a session that
// already holds more keeps its objects but gets no more.
func (s *Server) SetLimits(l Limits) {
	s.mu.Lock()
	s.limits = l
	s.mu.Unlock()
}

// Limits returns the per-client limits.
func (s *Server) Limits() Limits {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limits
}

// usage is what a session holds, or what one object costs.
type usage struct {
	qps, cqs, mrs, pds, listeners int
	mrBytes                       uint64
	wrs, cqes                     int
	srqs                          int
}

// costOf is what object o counts against the limits.
func costOf(o any) usage {
	switch o := o.(type) {
	case *sPD:
		return usage{pds: 1}
	case *sMR:
		return usage{mrs: 1, mrBytes: o.length}
	case *sMW:
		return usage{mrs: 1}
	case *sCQ:
		return usage{cqs: 1, cqes: int(o.ring.Count())}
	case *sQP:
		return usage{qps: 1, wrs: int(o.sq.Count() + o.rq.Count())}
	case *sListener, *sPort:
		return usage{listeners: 1}
	case *sSRQ:
		return usage{srqs: 1, wrs: int(o.ring.Count())}
	}
	return usage{}
}

// charge adds c to the session's usage, or fails with StLimit, changing
// nothing, if that would take it past a limit.
func (ss *session) charge(c usage) error {
	l := ss.srv.Limits()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	u := &ss.used
	over := func(have, add, limit int) bool { return limit > 0 && add > 0 && have+add > limit }
	switch {
	case over(u.qps, c.qps, l.QPs):
		return limitErr("QPs", u.qps, l.QPs, "qps")
	case over(u.cqs, c.cqs, l.CQs):
		return limitErr("CQs", u.cqs, l.CQs, "cqs")
	case over(u.mrs, c.mrs, l.MRs):
		return limitErr("memory regions", u.mrs, l.MRs, "mrs")
	case over(u.pds, c.pds, l.PDs):
		return limitErr("PDs", u.pds, l.PDs, "pds")
	case over(u.listeners, c.listeners, l.Listeners):
		return limitErr("listeners", u.listeners, l.Listeners, "listeners")
	case over(u.srqs, c.srqs, l.SRQs):
		return limitErr("SRQs", u.srqs, l.SRQs, "srqs")
	case l.MRBytes > 0 && c.mrBytes > 0 && (c.mrBytes > l.MRBytes || u.mrBytes > l.MRBytes-c.mrBytes):
		return fail(uabi.StLimit, "per-client limit: %d bytes registered, %d more would pass the limit of %d (siwtun up --max-client-mr-bytes)",
			u.mrBytes, c.mrBytes, l.MRBytes)
	case over(u.wrs, c.wrs, l.WRs):
		return fail(uabi.StLimit, "per-client limit: QPs with %d work queue entries, %d more would pass the limit of %d (siwtun up --max-client-wrs)",
			u.wrs, c.wrs, l.WRs)
	case over(u.cqes, c.cqes, l.CQEs):
		return fail(uabi.StLimit, "per-client limit: CQs with %d entries, %d more would pass the limit of %d (siwtun up --max-client-cqes)",
			u.cqes, c.cqes, l.CQEs)
	}
	u.add(c, 1)
	return nil
}

func limitErr(what string, have, limit int, flag string) error {
	return fail(uabi.StLimit, "per-client limit: %d %s of at most %d (siwtun up --max-client-%s)", have, what, limit, flag)
}

// uncharge gives back c (ss.mu held).
func (ss *session) unchargeLocked(c usage) { ss.used.add(c, -1) }

// uncharge gives back c.
func (ss *session) uncharge(c usage) {
	ss.mu.Lock()
	ss.unchargeLocked(c)
	ss.mu.Unlock()
}

func (u *usage) add(c usage, sign int) {
	u.qps += sign * c.qps
	u.cqs += sign * c.cqs
	u.mrs += sign * c.mrs
	u.pds += sign * c.pds
	u.listeners += sign * c.listeners
	u.wrs += sign * c.wrs
	u.cqes += sign * c.cqes
	u.srqs += sign * c.srqs
	if sign > 0 {
		u.mrBytes += c.mrBytes
	} else {
		u.mrBytes -= c.mrBytes
	}
}

// capAttr is a device attribute as one client sees it: at most limit (0:
// no limit).
func capAttr(v int, limit int) uint32 {
	if limit > 0 && limit < v {
		v = limit
	}
	return uint32(v)
}

// String describes the limits as siwtun up's flags set them.
func (l Limits) String() string {
	return fmt.Sprintf("qps=%d cqs=%d mrs=%d pds=%d listeners=%d mr-bytes=%d wrs=%d cqes=%d srqs=%d",
		l.QPs, l.CQs, l.MRs, l.PDs, l.Listeners, l.MRBytes, l.WRs, l.CQEs, l.SRQs)
}
