package ctl

// DevInfo describes a device as ibv_devinfo does (ibv_query_device and
// ibv_query_port), plus siwtun's iWARP parameters. JSON field names are the
// text keys.
type DevInfo struct {
	// HCAID is the device name (siwtun0).
	HCAID string `json:"hca_id"`
	// Transport is "iWARP"; TransportNum its enum ibv_transport_type value (1).
	Transport    string `json:"transport"`
	TransportNum int    `json:"transport_num"`
	// FWVer is the firmware version: siwtun's engine version.
	FWVer string `json:"fw_ver"`
	// NodeGUID and SysImageGUID are printed as four groups of four hex
	// digits ("1234:5678:9abc:def0").
	NodeGUID     string `json:"node_guid"`
	SysImageGUID string `json:"sys_image_guid"`
	// VendorID, VendorPartID and HWVer identify the device.
	VendorID     uint32 `json:"vendor_id"`
	VendorPartID uint32 `json:"vendor_part_id"`
	HWVer        uint32 `json:"hw_ver"`
	// PhysPortCnt is the number of ports: 1.
	PhysPortCnt int `json:"phys_port_cnt"`
	// MaxMRSize is the largest memory region in bytes.
	MaxMRSize uint64 `json:"max_mr_size"`
	// The limits of ibv_device_attr.
	MaxQP           int `json:"max_qp"`
	MaxQPWR         int `json:"max_qp_wr"`
	MaxSGE          int `json:"max_sge"`
	MaxSGERd        int `json:"max_sge_rd"`
	MaxCQ           int `json:"max_cq"`
	MaxCQE          int `json:"max_cqe"`
	MaxMR           int `json:"max_mr"`
	MaxPD           int `json:"max_pd"`
	MaxQPRdAtom     int `json:"max_qp_rd_atom"`
	MaxQPInitRdAtom int `json:"max_qp_init_rd_atom"`
	MaxSRQ          int `json:"max_srq"`
	MaxSRQWR        int `json:"max_srq_wr"`
	MaxSRQSGE       int `json:"max_srq_sge"`
	// AtomicCap is ibv_device_attr's atomic_cap as ibv_devinfo prints
	// it: "ATOMIC_HCA (1)" with RFC 7306 atomics, "ATOMIC_NONE (0)"
	// with the RDMAP extensions off.
	AtomicCap string `json:"atomic_cap"`
	// MaxInline is the most payload bytes of an inline work request (from
	// ibv_qp_cap, not ibv_device_attr: ibv_devinfo does not print it).
	MaxInline int `json:"max_inline"`
	// Port is the device's only port.
	Port Port `json:"port"`
}

// Port describes the device's port (ibv_port_attr) and the iWARP defaults
// of its connections.
type Port struct {
	// Port is the port number: 1.
	Port int `json:"port"`
	// State is "PORT_ACTIVE"; StateNum its enum ibv_port_state value (4).
	State    string `json:"state"`
	StateNum int    `json:"state_num"`
	// MaxMTU and ActiveMTU are enum ibv_mtu values (1..5 for 256..4096
	// bytes), derived from the link MTU as the kernel's ib_mtu_int_to_enum
	// does: 1500 → 3 (1024), 9000 → 5 (4096). The enum cannot express the
	// real MTU; NetdevMTU does.
	MaxMTU    int `json:"max_mtu"`
	ActiveMTU int `json:"active_mtu"`
	// SMLID, PortLID and PortLMC are InfiniBand subnet fields, always 0 on
	// iWARP; they are here because ibv_devinfo prints them.
	SMLID   int `json:"sm_lid"`
	PortLID int `json:"port_lid"`
	PortLMC int `json:"port_lmc"`
	// LinkLayer is "Ethernet", as for every iWARP RNIC.
	LinkLayer string `json:"link_layer"`
	// NetdevMTU is the link's real MTU in bytes.
	NetdevMTU int `json:"netdev_mtu"`
	// EMSS is the effective MSS a connection starts from and the largest
	// FPDU it sends, before the peer's SYN MSS lowers it: the MTU minus the
	// IP header (20 bytes IPv4, 40 IPv6), the 20-byte TCP header and the
	// 40 bytes of TCP options gVisor reserves when timestamps and SACK are
	// negotiated (1500 → 1420), capped at the device's largest FPDU.
	EMSS int `json:"emss"`
	// MPARev, CRC, Markers and P2P are the MPA defaults requested on each
	// connection (P2P: the RTR types offered, "none" without peer-to-peer
	// mode).
	MPARev  int    `json:"mpa_rev"`
	CRC     bool   `json:"crc"`
	Markers bool   `json:"markers"`
	P2P     string `json:"p2p"`
	// IRD and ORD are the default inbound and outbound RDMA Read depths.
	IRD int `json:"ird"`
	ORD int `json:"ord"`
}

// Link is one RDMA link (device/port) as `rdma link show` prints it.
type Link struct {
	// Link is "<dev>/<port>" (siwtun0/1).
	Link string `json:"link"`
	// State is "ACTIVE"; PhysicalState is "LINK_UP".
	State         string `json:"state"`
	PhysicalState string `json:"physical_state"`
	// Netdev is the network interface the RNIC sits on (the TUN device).
	Netdev string `json:"netdev"`
	// Addrs are the RNIC's own addresses (its TCP/IP stack's), the ones
	// peers connect to.
	Addrs []string `json:"addrs"`
	// HostAddrs are the host's addresses on Netdev (the kernel side of the
	// TUN device).
	HostAddrs []string `json:"host_addrs"`
	// Shared is set when the RNIC shares an address of the host's
	// (siwtun up --shared): Addrs is then that address and Netdev the
	// interface that has it.
	Shared *SharedLink `json:"shared,omitempty"`
}

// SharedLink is how an RNIC shares an address of the host's: the host's
// NAT (nftables table Table) carries the RNIC's ports of the shared
// address to its private address on its TUN device, and kernel sockets
// hold those ports in the host's port space.
type SharedLink struct {
	// TUN is the RNIC's TUN device.
	TUN string `json:"tun"`
	// Private is the RNIC stack's own address on TUN.
	Private string `json:"private"`
	// Table is the nftables table ("ip siwtun-<dev>").
	Table string `json:"table"`
	// Reserved are the ports held in the host's port space for the RNIC,
	// Published those of its listeners (new connections go to the RNIC).
	Reserved  []uint16 `json:"reserved"`
	Published []uint16 `json:"published"`
}

// QP describes one queue pair as `rdma resource show qp` does, plus its
// connection's iWARP parameters and counters.
type QP struct {
	// Link is "<dev>/<port>".
	Link string `json:"link"`
	// LQPN is the local queue pair number.
	LQPN uint32 `json:"lqpn"`
	// Type is "RC".
	Type string `json:"type"`
	// State is the verbs state (RESET, INIT, RTR, RTS, ERR).
	State string `json:"state"`
	// PDN is the protection domain number.
	PDN uint32 `json:"pdn"`
	// Src and Dst are the connection's local and peer address:port, empty
	// before it connects.
	Src string `json:"src,omitempty"`
	Dst string `json:"dst,omitempty"`
	// MPARev, CRC, MarkersTx and MarkersRx are the negotiated MPA mode
	// (MarkersTx: we insert markers; MarkersRx: the peer does).
	MPARev    int  `json:"mpa_rev"`
	CRC       bool `json:"crc"`
	MarkersTx bool `json:"markers_tx"`
	MarkersRx bool `json:"markers_rx"`
	// P2P is the RTR type of peer-to-peer mode ("write", "read", "send"),
	// or "none".
	P2P string `json:"p2p"`
	// IRD and ORD are the negotiated RDMA Read depths.
	IRD int `json:"ird"`
	ORD int `json:"ord"`
	// SQDepth, SQUsed, RQDepth and RQUsed are the queue sizes and the work
	// requests outstanding in them.
	SQDepth int `json:"sq_depth"`
	SQUsed  int `json:"sq_used"`
	RQDepth int `json:"rq_depth"`
	RQUsed  int `json:"rq_used"`
	// EMSS is the connection's effective MSS: the size of its full FPDUs.
	EMSS int `json:"emss"`
	// BytesTx, BytesRx, FPDUsTx and FPDUsRx summarise the counters
	// (mpaOctetsTx, mpaOctetsRx, mpaFpduTx, mpaFpduRx).
	BytesTx uint64 `json:"bytes_tx"`
	BytesRx uint64 `json:"bytes_rx"`
	FPDUsTx uint64 `json:"fpdus_tx"`
	FPDUsRx uint64 `json:"fpdus_rx"`
	// RxAwaiting is how many more octets the FPDU being received lacks
	// (0 between FPDUs), and RxQuietMs how long ago octets last came, as
	// the receive path saw them after its latest read: a connection whose
	// peer has sent everything (its mpaOctetsTx equal to our mpaOctetsRx)
	// and that still awaits octets is waiting on a damaged FPDU length.
	RxAwaiting int   `json:"rx_awaiting,omitempty"`
	RxQuietMs  int64 `json:"rx_quiet_ms,omitempty"`
	// TCPSend describes the TCP send side (written, sent and acknowledged
	// offsets, Nagle, TCP's state and timers), for diagnosing a connection
	// that went quiet.
	TCPSend string `json:"tcp_send,omitempty"`
	// Counters are all of the queue pair's counters (offload.QPStats), in
	// field order, without their documentation (see Stats for that).
	Counters []Counter `json:"counters,omitempty"`
}

// Counter is one named counter value.
type Counter struct {
	// Name is the counter's stable name (tcpInSegs, mpaFpduRx, ...).
	Name string `json:"name"`
	// Value is its value.
	Value uint64 `json:"value"`
	// Doc says what it counts (one sentence); empty in QP.Counters.
	Doc string `json:"doc,omitempty"`
}

// Stats are a device's counters by protocol layer, as
// `rdma statistic show` prints them (one layer per line).
type Stats struct {
	// Link is "<dev>/<port>".
	Link string `json:"link"`
	// TCP holds the stack's TCP-MIB counters and per-connection segment
	// counts.
	TCP []Counter `json:"tcp"`
	// MPA, DDP and RDMAP hold the iWARP layers' counters, summed over every
	// queue pair the device has had.
	MPA   []Counter `json:"mpa"`
	DDP   []Counter `json:"ddp"`
	RDMAP []Counter `json:"rdmap"`
	// Verbs holds work-request counters and object counts.
	Verbs []Counter `json:"verbs"`
	// Other holds counters of an engine newer than this package's layer
	// table (normally empty).
	Other []Counter `json:"other,omitempty"`
}

// Layer is one protocol layer's counters.
type Layer struct {
	// Name is the layer: tcp, mpa, ddp, rdmap, verbs or other.
	Name string
	// Counters are its counters.
	Counters []Counter
}

// Layers returns the non-empty layers in protocol order (tcp first).
func (s *Stats) Layers() []Layer {
	all := []Layer{
		{"tcp", s.TCP}, {"mpa", s.MPA}, {"ddp", s.DDP},
		{"rdmap", s.RDMAP}, {"verbs", s.Verbs}, {"other", s.Other},
	}
	out := all[:0]
	for _, l := range all {
		if len(l.Counters) > 0 {
			out = append(out, l)
		}
	}
	return out
}
