package ctl

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/siwtun/siwtun/verbs/ibv"
)

// Tab stops of ibv_devinfo's layout: device keys sit after one tab and
// their values at column 40, port keys after three tabs and their values
// at column 48 (tabs every 8 columns).
const (
	devKeyCol, devValueCol   = 8, 40
	portKeyCol, portValueCol = 24, 48
)

// kv writes one ibv_devinfo line: indent tabs, "key:", tabs to valueCol
// (at least one), value.
func kv(w *bufio.Writer, keyCol, valueCol int, key, value string) {
	w.WriteString(strings.Repeat("\t", keyCol/8))
	w.WriteString(key)
	w.WriteByte(':')
	col := keyCol + len(key) + 1
	tabs := max(valueCol/8-col/8, 1)
	w.WriteString(strings.Repeat("\t", tabs))
	w.WriteString(value)
	w.WriteByte('\n')
}

// mtuString is ibv_devinfo's "1024 (3)".
func mtuString(e int) string { return fmt.Sprintf("%d (%d)", ibv.MTUEnumBytes(e), e) }

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// WriteDevInfo prints d as ibv_devinfo does (rdma-core
// libibverbs/examples/devinfo.c), with verbose as its -v. The verbose
// output lists the ibv_device_attr fields siwtun fills, then siwtun's
// extras: max_inline, and per port netdev_mtu, emss, mpa_rev, crc, markers,
// p2p, ird and ord. Without verbose the output has exactly ibv_devinfo's
// lines.
func WriteDevInfo(w io.Writer, d DevInfo, verbose bool) error {
	bw := bufio.NewWriter(w)
	dev := func(k, v string) { kv(bw, devKeyCol, devValueCol, k, v) }
	port := func(k, v string) { kv(bw, portKeyCol, portValueCol, k, v) }
	itoa := strconv.Itoa

	fmt.Fprintf(bw, "hca_id:\t%s\n", d.HCAID)
	dev("transport", fmt.Sprintf("%s (%d)", d.Transport, d.TransportNum))
	if d.FWVer != "" {
		dev("fw_ver", d.FWVer)
	}
	dev("node_guid", d.NodeGUID)
	dev("sys_image_guid", d.SysImageGUID)
	dev("vendor_id", fmt.Sprintf("0x%04x", d.VendorID))
	dev("vendor_part_id", strconv.FormatUint(uint64(d.VendorPartID), 10))
	dev("hw_ver", fmt.Sprintf("0x%X", d.HWVer))
	dev("phys_port_cnt", itoa(d.PhysPortCnt))
	if verbose {
		dev("max_mr_size", fmt.Sprintf("0x%x", d.MaxMRSize))
		dev("max_qp", itoa(d.MaxQP))
		dev("max_qp_wr", itoa(d.MaxQPWR))
		dev("max_sge", itoa(d.MaxSGE))
		dev("max_sge_rd", itoa(d.MaxSGERd))
		dev("max_cq", itoa(d.MaxCQ))
		dev("max_cqe", itoa(d.MaxCQE))
		dev("max_mr", itoa(d.MaxMR))
		dev("max_pd", itoa(d.MaxPD))
		dev("max_qp_rd_atom", itoa(d.MaxQPRdAtom))
		dev("max_qp_init_rd_atom", itoa(d.MaxQPInitRdAtom))
		dev("max_srq", itoa(d.MaxSRQ))
		dev("max_srq_wr", itoa(d.MaxSRQWR))
		dev("max_srq_sge", itoa(d.MaxSRQSGE))
		dev("atomic_cap", d.AtomicCap)
		dev("max_inline", itoa(d.MaxInline))
	}
	p := d.Port
	fmt.Fprintf(bw, "\t\tport:\t%d\n", p.Port)
	port("state", fmt.Sprintf("%s (%d)", p.State, p.StateNum))
	port("max_mtu", mtuString(p.MaxMTU))
	port("active_mtu", mtuString(p.ActiveMTU))
	port("sm_lid", itoa(p.SMLID))
	port("port_lid", itoa(p.PortLID))
	port("port_lmc", fmt.Sprintf("0x%02x", p.PortLMC))
	port("link_layer", p.LinkLayer)
	if verbose {
		port("netdev_mtu", itoa(p.NetdevMTU))
		port("emss", itoa(p.EMSS))
		port("mpa_rev", itoa(p.MPARev))
		port("crc", onOff(p.CRC))
		port("markers", onOff(p.Markers))
		port("p2p", p.P2P)
		port("ird", itoa(p.IRD))
		port("ord", itoa(p.ORD))
	}
	bw.WriteByte('\n')
	return bw.Flush()
}

// WriteLinks prints one line per link as `rdma link show` does
// ("link siwtun0/1 state ACTIVE physical_state LINK_UP netdev siwtun0"),
// followed on the same line by the RNIC's addresses and the host's
// ("addrs 198.18.0.2/24 host_addrs 198.18.0.1/24", comma-separated, each
// pair left out when empty), and for an RNIC on a shared address its TUN
// device, private address and nftables table ("shared tun siwtun0 private
// 169.254.1.5 table \"ip siwtun-siwtun0\"").
func WriteLinks(w io.Writer, links []Link) error {
	bw := bufio.NewWriter(w)
	for _, l := range links {
		fmt.Fprintf(bw, "link %s state %s physical_state %s netdev %s", l.Link, l.State, l.PhysicalState, l.Netdev)
		if len(l.Addrs) > 0 {
			fmt.Fprintf(bw, " addrs %s", strings.Join(l.Addrs, ","))
		}
		if len(l.HostAddrs) > 0 {
			fmt.Fprintf(bw, " host_addrs %s", strings.Join(l.HostAddrs, ","))
		}
		if sh := l.Shared; sh != nil {
			fmt.Fprintf(bw, " shared tun %s private %s table %q", sh.TUN, sh.Private, sh.Table)
		}
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// WriteQPs prints one line per queue pair as `rdma resource show qp` does
// ("link siwtun0/1 lqpn 1 rqpn - type RC state RTS pdn 1 ..."), with the
// connection's addresses and iWARP parameters in place of InfiniBand's
// PSNs: src, dst, mpa_rev, crc, markers_tx, markers_rx, p2p, ird, ord,
// sq_depth, sq_used, rq_depth, rq_used, emss, bytes_tx, bytes_rx,
// fpdus_tx, fpdus_rx. iWARP has no remote QP number: rqpn is "-".
func WriteQPs(w io.Writer, qps []QP) error {
	bw := bufio.NewWriter(w)
	for _, q := range qps {
		fmt.Fprintf(bw, "link %s lqpn %d rqpn - type %s state %s pdn %d src %s dst %s", q.Link, q.LQPN, q.Type, q.State, q.PDN, orDash(q.Src), orDash(q.Dst))
		fmt.Fprintf(bw, " mpa_rev %d crc %s markers_tx %s markers_rx %s p2p %s ird %d ord %d", q.MPARev, onOff(q.CRC), onOff(q.MarkersTx), onOff(q.MarkersRx), q.P2P, q.IRD, q.ORD)
		fmt.Fprintf(bw, " sq_depth %d sq_used %d rq_depth %d rq_used %d emss %d", q.SQDepth, q.SQUsed, q.RQDepth, q.RQUsed, q.EMSS)
		fmt.Fprintf(bw, " bytes_tx %d bytes_rx %d fpdus_tx %d fpdus_rx %d\n", q.BytesTx, q.BytesRx, q.FPDUsTx, q.FPDUsRx)
	}
	return bw.Flush()
}

// WriteQPCounters prints a queue pair's counters as
// `rdma statistic qp show` does, one line per layer
// ("link siwtun0/1 lqpn 1 mpaFpduTx 3 mpaFpduRx 3 ...").
func WriteQPCounters(w io.Writer, q QP) error {
	table := qpCounters()
	layers := []string{layerTCP, layerMPA, layerDDP, layerRDMAP, layerVerbs, layerOther}
	byLayer := make(map[string][]Counter, len(layers))
	for _, c := range q.Counters {
		l := layerOther
		if info, ok := table[c.Name]; ok {
			l = info.layer
		}
		byLayer[l] = append(byLayer[l], c)
	}
	bw := bufio.NewWriter(w)
	for _, l := range layers {
		if len(byLayer[l]) == 0 {
			continue
		}
		fmt.Fprintf(bw, "link %s lqpn %d", q.Link, q.LQPN)
		writePairs(bw, byLayer[l])
	}
	return bw.Flush()
}

func writePairs(bw *bufio.Writer, cs []Counter) {
	for _, c := range cs {
		fmt.Fprintf(bw, " %s %d", c.Name, c.Value)
	}
	bw.WriteByte('\n')
}

// WriteStats prints a device's counters as `rdma statistic show` does
// ("link siwtun0/1 name value name value ..."), one line per layer: tcp,
// mpa, ddp, rdmap, verbs.
func WriteStats(w io.Writer, s Stats) error {
	bw := bufio.NewWriter(w)
	for _, l := range s.Layers() {
		fmt.Fprintf(bw, "link %s", s.Link)
		writePairs(bw, l.Counters)
	}
	return bw.Flush()
}

// WriteJSON prints v as one line of JSON, or indented by two spaces when
// pretty (the rdma tool's -j and -j -p).
func WriteJSON(w io.Writer, v any, pretty bool) error {
	var b []byte
	var err error
	if pretty {
		b, err = json.MarshalIndent(v, "", "  ")
	} else {
		b, err = json.Marshal(v)
	}
	if err != nil {
		return fmt.Errorf("encode JSON: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
