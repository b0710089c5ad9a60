package mpa

import (
	"encoding/binary"
	"fmt"
	"os"
	"testing"
)

// tcpStreams holds the two directions of the one TCP connection in a
// capture, reassembled: init is what the active side (the sender of the
// SYN) sent, resp what the passive side sent.
type tcpStreams struct {
	init, resp []byte
}

// readPcap reads a classic pcap (Ethernet link type) holding one TCP
// connection over IPv4 and reassembles both byte streams. Retransmitted
// octets are skipped; the captures have no loss.
func readPcap(t *testing.T, path string) tcpStreams {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := parsePcap(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return s
}

func parsePcap(b []byte) (tcpStreams, error) {
	var s tcpStreams
	if len(b) < 24 {
		return s, fmt.Errorf("short pcap header")
	}
	var bo binary.ByteOrder
	switch binary.LittleEndian.Uint32(b) {
	case 0xa1b2c3d4, 0xa1b23c4d:
		bo = binary.LittleEndian
	default:
		bo = binary.BigEndian
	}
	if lt := bo.Uint32(b[20:24]); lt != 1 {
		return s, fmt.Errorf("link type %d, want 1 (Ethernet)", lt)
	}
	type dir struct {
		port    uint16
		nextSeq uint32
		started bool
		data    *[]byte
	}
	var initDir, respDir dir
	initDir.data, respDir.data = &s.init, &s.resp
	for off := 24; off+16 <= len(b); {
		incl := int(bo.Uint32(b[off+8:]))
		pkt := b[off+16 : off+16+incl]
		off += 16 + incl
		if len(pkt) < 14 || binary.BigEndian.Uint16(pkt[12:]) != 0x0800 {
			continue
		}
		ip := pkt[14:]
		ihl := int(ip[0]&0x0f) * 4
		if ip[9] != 6 {
			continue
		}
		ipLen := int(binary.BigEndian.Uint16(ip[2:]))
		tcp := ip[ihl:ipLen]
		src := binary.BigEndian.Uint16(tcp[0:])
		seq := binary.BigEndian.Uint32(tcp[4:])
		flags := tcp[13]
		doff := int(tcp[12]>>4) * 4
		payload := tcp[doff:]
		const syn, ack = 0x02, 0x10
		if flags&syn != 0 {
			d := &respDir
			if flags&ack == 0 {
				d = &initDir
			}
			d.port, d.nextSeq, d.started = src, seq+1, true
			continue
		}
		var d *dir
		switch src {
		case initDir.port:
			d = &initDir
		case respDir.port:
			d = &respDir
		default:
			return s, fmt.Errorf("segment from unknown port %d", src)
		}
		if !d.started || len(payload) == 0 {
			continue
		}
		skip := int32(d.nextSeq - seq)
		if skip < 0 {
			return s, fmt.Errorf("gap in the stream from port %d", src)
		}
		if int(skip) >= len(payload) {
			continue
		}
		*d.data = append(*d.data, payload[skip:]...)
		d.nextSeq = seq + uint32(len(payload))
	}
	return s, nil
}

// splitFrame splits a direction's stream into its MPA frame and the FPDU
// stream after it.
func splitFrame(t *testing.T, stream []byte) (frame, fpdus []byte) {
	t.Helper()
	if len(stream) < FrameHeaderLen {
		t.Fatalf("stream of %d octets has no MPA frame", len(stream))
	}
	n := FrameHeaderLen + int(binary.BigEndian.Uint16(stream[18:20]))
	return stream[:n], stream[n:]
}

// splitFPDUs splits a Marker-free FPDU stream into FPDUs.
func splitFPDUs(t *testing.T, stream []byte) [][]byte {
	t.Helper()
	var out [][]byte
	for len(stream) > 0 {
		if len(stream) < 2 {
			t.Fatalf("truncated FPDU stream")
		}
		l := int(binary.BigEndian.Uint16(stream))
		n := ulpduLenLen + l + padLen(l) + crcLen
		if n > len(stream) {
			t.Fatalf("truncated FPDU: %d of %d octets", len(stream), n)
		}
		out = append(out, stream[:n])
		stream = stream[n:]
	}
	return out
}
