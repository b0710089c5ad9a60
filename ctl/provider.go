package ctl

import (
	"fmt"
	"math"
	"net/netip"
	"time"

	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/rnic"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// Provider answers the control plane's queries about one device. The
// daemon gives its Server a Provider over the device's engine (NewProvider);
// tests may give a fake one.
type Provider interface {
	// DevInfo returns the device's attributes (ibv_devinfo).
	DevInfo() DevInfo
	// Link returns the device's link (rdma link show).
	Link() Link
	// QPs returns every queue pair, by number (rdma resource show qp).
	QPs() []QP
	// Stats returns the device's counters (rdma statistic show).
	Stats() Stats
}

// Constant attributes of a siwtun device as ibv_devinfo prints them.
const (
	transportIWARP    = "iWARP"
	transportIWARPNum = 1 // IBV_TRANSPORT_IWARP
	portActive        = "PORT_ACTIVE"
	portActiveNum     = 4 // IBV_PORT_ACTIVE
	linkLayerEthernet = "Ethernet"
	linkActive        = "ACTIVE"
	physLinkUp        = "LINK_UP"
	qpTypeRC          = "RC"
	// portNum is the number of the device's only port.
	portNum = 1
	// maxMRSize is the largest region: a Go slice's length limit.
	maxMRSize = uint64(math.MaxInt)
	// tcpHeaderLen and tcpOptionsReserved are the TCP header and the
	// option bytes gVisor reserves in every segment when timestamps and
	// SACK are on (netstack/mss.go: maxOptionSize(true, true) = 40).
	tcpHeaderLen       = 20
	tcpOptionsReserved = 40
	ipv4HeaderLen      = 20
	ipv6HeaderLen      = 40
)

// engineProvider is the Provider over an in-process engine.
type engineProvider struct {
	netdev string
	eng    *offload.Device
	host   []netip.Prefix
	extra  []func() []offload.Counter
}

// NewProvider returns a Provider over the engine eng. netdev is the name of
// the network interface the RNIC sits on (the TUN device; empty: the
// device's own name) and hostAddrs are the host's addresses on it.
//
// The device attributes come from rnic.Query, what applications get from
// verbs.Device.Query (in process or over the verbs socket), so
// `siwtun ctl devinfo` and ibv_query_device cannot disagree.
//
// extra are more sources of counters for Stats, such as the verbs socket's
// (uverbs.Server.Counters); they are placed by name like the engine's.
func NewProvider(netdev string, eng *offload.Device, hostAddrs []netip.Prefix, extra ...func() []offload.Counter) Provider {
	if netdev == "" {
		netdev = eng.Config().Name
	}
	return &engineProvider{netdev: netdev, eng: eng, host: append([]netip.Prefix(nil), hostAddrs...), extra: extra}
}

func (p *engineProvider) link() string { return LinkName(p.eng.Config().Name) }

// LinkName is the rdma tool's name of a device's port: "<dev>/1".
func LinkName(dev string) string { return fmt.Sprintf("%s/%d", dev, portNum) }

// DevInfo implements Provider.DevInfo.
func (p *engineProvider) DevInfo() DevInfo {
	cfg := p.eng.Config()
	attr := rnic.Query(p.eng)
	mtu := p.eng.Stack().MTU()
	guid := FormatGUID(attr.NodeGUID)
	return DevInfo{
		HCAID: cfg.Name, Transport: transportIWARP, TransportNum: transportIWARPNum,
		FWVer: attr.FWVersion, NodeGUID: guid, SysImageGUID: guid,
		VendorID: attr.VendorID, VendorPartID: attr.VendorPartID, HWVer: 0,
		PhysPortCnt: 1, MaxMRSize: maxMRSize,
		MaxQP: attr.MaxQP, MaxQPWR: attr.MaxQPWR, MaxSGE: attr.MaxSGE, MaxSGERd: attr.MaxSGERead,
		MaxCQ: attr.MaxCQ, MaxCQE: attr.MaxCQE, MaxMR: attr.MaxMR, MaxPD: attr.MaxPD,
		MaxQPRdAtom: attr.MaxQPRdAtom, MaxQPInitRdAtom: attr.MaxQPInitRdAtom, MaxInline: attr.MaxInline,
		MaxSRQ: attr.MaxSRQ, MaxSRQWR: attr.MaxSRQWR, MaxSRQSGE: attr.MaxSRQSGE,
		AtomicCap: atomicCapString(attr.AtomicCap),
		Port: Port{
			Port: portNum, State: portActive, StateNum: portActiveNum,
			MaxMTU: ibv.MTUEnum(mtu), ActiveMTU: ibv.MTUEnum(mtu), LinkLayer: linkLayerEthernet,
			NetdevMTU: mtu, EMSS: DefaultEMSS(mtu, hasIPv4(p.eng.Stack().Addrs()), cfg.MaxFPDU),
			MPARev: int(cfg.MPARev), CRC: cfg.CRC, Markers: cfg.Markers, P2P: cfg.P2P.String(),
			IRD: int(cfg.IRD), ORD: int(cfg.ORD),
		},
	}
}

// WithShared returns p with the shared-address view shared() added to its
// Link.
func WithShared(p Provider, shared func() *SharedLink) Provider {
	return sharedProvider{p, shared}
}

// sharedProvider adds a SharedLink to a Provider's Link.
type sharedProvider struct {
	Provider
	shared func() *SharedLink
}

func (p sharedProvider) Link() Link {
	l := p.Provider.Link()
	l.Shared = p.shared()
	return l
}

// MRs implements MRLister when the wrapped Provider does.
func (p sharedProvider) MRs() []MR {
	if l, ok := p.Provider.(MRLister); ok {
		return l.MRs()
	}
	return nil
}

// Link implements Provider.Link.
func (p *engineProvider) Link() Link {
	return Link{
		Link: p.link(), State: linkActive, PhysicalState: physLinkUp, Netdev: p.netdev,
		Addrs: prefixStrings(p.eng.Stack().Addrs()), HostAddrs: prefixStrings(p.host),
	}
}

// QPs implements Provider.QPs.
func (p *engineProvider) QPs() []QP {
	infos := p.eng.QPs()
	out := make([]QP, 0, len(infos))
	for _, in := range infos {
		q := QP{
			Link: p.link(), LQPN: in.Num, Type: qpTypeRC, State: in.State.String(),
			MPARev: int(in.Params.Rev), CRC: in.Params.CRC,
			MarkersTx: in.Params.MarkersTx, MarkersRx: in.Params.MarkersRx, P2P: "none",
			IRD: in.IRD, ORD: in.ORD,
			SQDepth: in.SQDepth, SQUsed: in.SQUse, RQDepth: in.RQDepth, RQUsed: in.RQUse,
			EMSS: in.EMSS,
		}
		if in.Params.P2P {
			q.P2P = in.Params.RTR.String()
		}
		if in.Local.IsValid() {
			q.Src = in.Local.String()
		}
		if in.Remote.IsValid() {
			q.Dst = in.Remote.String()
		}
		// The QP may be destroyed between the snapshot and here: it is then
		// listed without its PD and counters.
		if qp, ok := p.eng.QP(in.Num); ok {
			q.PDN = qp.PD()
			q.TCPSend = qp.SendState()
			aw, last := qp.RxProgress()
			q.RxAwaiting = aw
			if !last.IsZero() {
				q.RxQuietMs = time.Since(last).Milliseconds()
			}
			for _, c := range qp.Stats().Counters() {
				q.Counters = append(q.Counters, Counter{Name: c.Name, Value: c.Value})
				switch c.Name {
				case "mpaOctetsTx":
					q.BytesTx = c.Value
				case "mpaOctetsRx":
					q.BytesRx = c.Value
				case "mpaFpduTx":
					q.FPDUsTx = c.Value
				case "mpaFpduRx":
					q.FPDUsRx = c.Value
				}
			}
		}
		out = append(out, q)
	}
	return out
}

// Stats implements Provider.Stats.
func (p *engineProvider) Stats() Stats {
	counters := p.eng.Stats().Counters()
	for _, f := range p.extra {
		counters = append(counters, f()...)
	}
	return buildStats(p.link(), p.eng.Stack().Stats(), counters,
		len(p.eng.QPs()), p.eng.Regions().Len())
}

// DefaultEMSS is the effective MSS a connection on a link of MTU mtu starts
// from: the MTU minus the IP header (20 bytes IPv4, 40 IPv6), the TCP
// header (20) and the 40 option bytes gVisor reserves in every segment of a
// connection with timestamps and SACK (netstack's effectiveMSS), capped at
// maxFPDU (when positive). The peer's SYN MSS can only lower it; a QP's
// actual value is QP.EMSS.
func DefaultEMSS(mtu int, ipv4 bool, maxFPDU int) int {
	ip := ipv6HeaderLen
	if ipv4 {
		ip = ipv4HeaderLen
	}
	e := max(mtu-ip-tcpHeaderLen-tcpOptionsReserved, 1)
	if maxFPDU > 0 {
		e = min(e, maxFPDU)
	}
	return e
}

// FormatGUID formats a GUID as ibv_devinfo does: four groups of four hex
// digits, most significant first ("0123:4567:89ab:cdef").
func FormatGUID(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff)
}

func hasIPv4(ps []netip.Prefix) bool {
	for _, p := range ps {
		if p.Addr().Is4() {
			return true
		}
	}
	return len(ps) == 0
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

// Watch implements Watcher.
func (p *engineProvider) Watch() *offload.Watch { return p.eng.Watch(0) }

// atomicCapString is how ibv_devinfo prints an atomic capability.
func atomicCapString(c ibv.AtomicCap) string {
	switch c {
	case ibv.AtomicNone:
		return "ATOMIC_NONE (0)"
	case ibv.AtomicHCA:
		return "ATOMIC_HCA (1)"
	}
	return fmt.Sprintf("ATOMIC_CAP(%d)", uint32(c))
}
