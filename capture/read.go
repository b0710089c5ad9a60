package capture

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
)

// packetSource is what pcapgo's Reader and NgReader have in common.
type packetSource interface {
	ReadPacketData() ([]byte, gopacket.CaptureInfo, error)
	LinkType() layers.LinkType
}

// pcapngMagic starts a pcapng file (its Section Header Block type).
var pcapngMagic = []byte{0x0a, 0x0d, 0x0d, 0x0a}

// ReadFile reads the TCP segments of the pcap or pcapng file at path, in
// capture order. Packets that are not TCP over IPv4 or IPv6 are skipped;
// truncated TCP payloads (a snap length below the packet size) are an
// error, since the checker needs every octet.
func ReadFile(path string) ([]inspect.Segment, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read capture: %w", err)
	}
	defer f.Close()
	segs, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("read capture %s: %w", path, err)
	}
	return segs, nil
}

// Read reads the TCP segments of a pcap or pcapng stream; see ReadFile.
func Read(r io.Reader) ([]inspect.Segment, error) {
	br := bufio.NewReader(r)
	head, err := br.Peek(4)
	if err != nil {
		return nil, fmt.Errorf("not a pcap or pcapng file: %w", err)
	}
	var src packetSource
	if bytes.Equal(head, pcapngMagic) {
		src, err = pcapgo.NewNgReader(br, pcapgo.DefaultNgReaderOptions)
	} else {
		src, err = pcapgo.NewReader(br)
	}
	if err != nil {
		return nil, fmt.Errorf("not a pcap or pcapng file: %w", err)
	}
	lt := src.LinkType()
	if _, ok := decoders[lt]; !ok {
		return nil, fmt.Errorf("link type %v is not supported (Ethernet, raw IP, Linux cooked or loopback captures are)", lt)
	}
	var out []inspect.Segment
	for n := 1; ; n++ {
		data, ci, err := src.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("packet %d: %w", n, err)
		}
		seg, ok, err := decodeSegment(lt, data, ci)
		if err != nil {
			return out, fmt.Errorf("packet %d: %w", n, err)
		}
		if ok {
			out = append(out, seg)
		}
	}
}

// decoders are the link types Read accepts, with their first layer.
var decoders = map[layers.LinkType]gopacket.Decoder{
	layers.LinkTypeEthernet:  layers.LayerTypeEthernet,
	layers.LinkTypeRaw:       layers.LinkTypeRaw,
	layers.LinkTypeIPv4:      layers.LayerTypeIPv4,
	layers.LinkTypeIPv6:      layers.LayerTypeIPv6,
	layers.LinkTypeLinuxSLL:  layers.LayerTypeLinuxSLL,
	layers.LinkTypeLinuxSLL2: layers.LayerTypeLinuxSLL2,
	layers.LinkTypeNull:      layers.LayerTypeLoopback,
	layers.LinkTypeLoop:      layers.LayerTypeLoopback,
}

// decodeSegment extracts the TCP segment of one captured packet; ok is
// false for packets that are not TCP.
func decodeSegment(lt layers.LinkType, data []byte, ci gopacket.CaptureInfo) (inspect.Segment, bool, error) {
	pkt := gopacket.NewPacket(data, decoders[lt], gopacket.DecodeOptions{NoCopy: true, Lazy: true})
	var src, dst netip.Addr
	var ipPayloadLen int
	switch ip := pkt.NetworkLayer().(type) {
	case *layers.IPv4:
		if ip.Flags&layers.IPv4MoreFragments != 0 || ip.FragOffset != 0 {
			return inspect.Segment{}, false, nil
		}
		src, _ = netip.AddrFromSlice(ip.SrcIP.To4())
		dst, _ = netip.AddrFromSlice(ip.DstIP.To4())
		ipPayloadLen = int(ip.Length) - int(ip.IHL)*4
	case *layers.IPv6:
		src, _ = netip.AddrFromSlice(ip.SrcIP)
		dst, _ = netip.AddrFromSlice(ip.DstIP)
		ipPayloadLen = int(ip.Length)
	default:
		return inspect.Segment{}, false, nil
	}
	tcp, ok := pkt.TransportLayer().(*layers.TCP)
	if !ok {
		return inspect.Segment{}, false, nil
	}
	if ci.CaptureLength < ci.Length {
		return inspect.Segment{}, false, fmt.Errorf("packet truncated to %d of %d octets (capture with a larger snap length)", ci.CaptureLength, ci.Length)
	}
	payload := tcp.Payload
	// Ethernet pads short frames: trust the IP length, not the frame.
	if want := ipPayloadLen - int(tcp.DataOffset)*4; want >= 0 && want < len(payload) {
		payload = payload[:want]
	}
	var flags uint8
	for _, f := range []struct {
		set bool
		bit uint8
	}{{tcp.FIN, inspect.FlagFIN}, {tcp.SYN, inspect.FlagSYN}, {tcp.RST, inspect.FlagRST}, {tcp.PSH, inspect.FlagPSH}, {tcp.ACK, inspect.FlagACK}} {
		if f.set {
			flags |= f.bit
		}
	}
	return inspect.Segment{
		Time:    ci.Timestamp,
		Src:     netip.AddrPortFrom(src.Unmap(), uint16(tcp.SrcPort)),
		Dst:     netip.AddrPortFrom(dst.Unmap(), uint16(tcp.DstPort)),
		Seq:     tcp.Seq,
		Flags:   flags,
		Payload: payload,
	}, true, nil
}
