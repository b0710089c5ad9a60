package capture

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
)

// Packet is one TCP segment to write: the header fields a capture shows.
type Packet struct {
	// Time is when the segment crossed the link.
	Time time.Time
	// Src and Dst are its endpoints (both IPv4 or both IPv6).
	Src, Dst netip.AddrPort
	// Seq, Ack, Flags and Window are its TCP header fields (Flags uses
	// the inspect.Flag* bits; Window is the raw, unscaled field).
	Seq, Ack uint32
	Flags    uint8
	Window   uint16
	// MSS is the MSS option of a SYN (0: none).
	MSS uint16
	// Payload is the TCP payload.
	Payload []byte
}

// Segment returns p as the inspect package takes it (Payload aliased).
func (p *Packet) Segment() inspect.Segment {
	return inspect.Segment{Time: p.Time, Src: p.Src, Dst: p.Dst, Seq: p.Seq, Flags: p.Flags, Payload: p.Payload}
}

// Writer writes Packets to a pcapng stream as raw IP packets (link type
// 101), rebuilding their IP and TCP headers with valid checksums. It is
// not safe for concurrent use.
type Writer struct {
	ng   *pcapgo.NgWriter
	buf  gopacket.SerializeBuffer
	ipID uint16
}

// NewWriter starts a pcapng stream on w: a section header and one
// interface named iface (the device the packets crossed).
func NewWriter(w io.Writer, iface string) (*Writer, error) {
	intf := pcapgo.DefaultNgInterface
	intf.LinkType = layers.LinkTypeRaw
	intf.Name = iface
	intf.SnapLength = 0
	intf.Description = "siwtun RNIC segments (IP and TCP headers rebuilt from the segment hook)"
	opts := pcapgo.DefaultNgWriterOptions
	opts.SectionInfo.Application = "siwtun"
	ng, err := pcapgo.NewNgWriterInterface(w, intf, opts)
	if err != nil {
		return nil, fmt.Errorf("pcapng: %w", err)
	}
	return &Writer{ng: ng, buf: gopacket.NewSerializeBuffer()}, nil
}

// Write writes p with the comments given (none, one or several; each
// becomes a pcapng packet comment, shown by Wireshark as pkt_comment).
func (w *Writer) Write(p *Packet, comments ...string) error {
	if p.Src.Addr().Is4() != p.Dst.Addr().Is4() {
		return fmt.Errorf("pcapng: packet %v > %v mixes IPv4 and IPv6", p.Src, p.Dst)
	}
	tcp := &layers.TCP{
		SrcPort: layers.TCPPort(p.Src.Port()),
		DstPort: layers.TCPPort(p.Dst.Port()),
		Seq:     p.Seq,
		Ack:     p.Ack,
		FIN:     p.Flags&inspect.FlagFIN != 0,
		SYN:     p.Flags&inspect.FlagSYN != 0,
		RST:     p.Flags&inspect.FlagRST != 0,
		PSH:     p.Flags&inspect.FlagPSH != 0,
		ACK:     p.Flags&inspect.FlagACK != 0,
		Window:  p.Window,
	}
	if p.MSS != 0 {
		tcp.Options = []layers.TCPOption{{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{byte(p.MSS >> 8), byte(p.MSS)}}}
	}
	var ip gopacket.SerializableLayer
	if p.Src.Addr().Is4() {
		w.ipID++
		v4 := &layers.IPv4{Version: 4, TTL: 64, Id: w.ipID, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolTCP,
			SrcIP: net.IP(p.Src.Addr().AsSlice()), DstIP: net.IP(p.Dst.Addr().AsSlice())}
		tcp.SetNetworkLayerForChecksum(v4)
		ip = v4
	} else {
		v6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP,
			SrcIP: net.IP(p.Src.Addr().AsSlice()), DstIP: net.IP(p.Dst.Addr().AsSlice())}
		tcp.SetNetworkLayerForChecksum(v6)
		ip = v6
	}
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if err := gopacket.SerializeLayers(w.buf, opts, ip, tcp, gopacket.Payload(p.Payload)); err != nil {
		return fmt.Errorf("pcapng: build packet: %w", err)
	}
	data := w.buf.Bytes()
	ci := gopacket.CaptureInfo{Timestamp: p.Time, CaptureLength: len(data), Length: len(data)}
	if err := w.ng.WritePacketWithOptions(ci, data, pcapgo.NgPacketOptions{Comments: comments}); err != nil {
		return fmt.Errorf("pcapng: %w", err)
	}
	return nil
}

// Flush writes out what is buffered.
func (w *Writer) Flush() error {
	if err := w.ng.Flush(); err != nil {
		return fmt.Errorf("pcapng: %w", err)
	}
	return nil
}
