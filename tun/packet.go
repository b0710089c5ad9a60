package tun

import (
	"errors"
	"fmt"
	"io"
	"sync"
)

// PacketDevice adapts a Device to one-packet-at-a-time I/O: ReadPacket,
// WritePacket, MTU and Close, the method set of netstack.PacketDevice, so
// netstack.NewDeviceLink(tun.NewPacketDevice(dev)) runs a stack on dev.
//
// For a device with BatchSize 1 (Create's, tuntest.ChannelTUN) each
// ReadPacket is one Device.Read straight into the caller's buffer and each
// WritePacket one Device.Write of the caller's buffer: no copy and no
// allocation per packet. For a batching device, ReadPacket reads a batch
// into buffers allocated once by NewPacketDevice and copies one packet out
// per call.
//
// One goroutine may read while another writes. Packets are read and written
// at offset 0, so devices that need write headroom (wireguard-go's
// virtio-net-header device needs 10 bytes) are not supported.
type PacketDevice struct {
	dev   Device
	batch int

	readMu sync.Mutex // readMu guards rbufs, rsizes, next, pending
	// rbufs is the slice handed to Device.Read: one slot that points at
	// the caller's buffer during the call when batch is 1, batch owned
	// buffers otherwise.
	rbufs  [][]byte
	rsizes []int
	// rbufs[next:pending] are packets read but not yet returned (batch > 1).
	next, pending int

	writeMu sync.Mutex // writeMu guards wbufs
	wbufs   [][]byte
}

// NewPacketDevice returns a PacketDevice over d. It takes ownership of d:
// PacketDevice.Close closes it.
func NewPacketDevice(d Device) *PacketDevice {
	batch := max(d.BatchSize(), 1)
	p := &PacketDevice{
		dev:    d,
		batch:  batch,
		rbufs:  make([][]byte, batch),
		rsizes: make([]int, batch),
		wbufs:  make([][]byte, 1),
	}
	if batch > 1 {
		for i := range p.rbufs {
			p.rbufs[i] = make([]byte, maxPacketSize)
		}
	}
	return p
}

// ReadPacket reads one IP packet into p and returns its length. It blocks
// until a packet arrives; once the device is closed it returns the
// device's error (errors.Is(err, os.ErrClosed)). With a batching device a
// packet longer than p is dropped and reported with io.ErrShortBuffer.
func (p *PacketDevice) ReadPacket(b []byte) (int, error) {
	p.readMu.Lock()
	defer p.readMu.Unlock()
	if p.batch == 1 {
		p.rbufs[0] = b
		defer func() { p.rbufs[0] = nil }() // do not keep the caller's buffer
		for {
			n, err := p.dev.Read(p.rbufs, p.rsizes, 0)
			if n > 0 {
				// A packet was read; an error alongside it (such as
				// wireguard-go's ErrTooManySegments) does not stop reads
				// and will come back on the next call if it persists.
				return p.rsizes[0], nil
			}
			if err != nil {
				return 0, err
			}
		}
	}
	for p.next >= p.pending {
		n, err := p.dev.Read(p.rbufs, p.rsizes, 0)
		p.next, p.pending = 0, max(n, 0)
		if n <= 0 && err != nil {
			return 0, err
		}
	}
	i := p.next
	p.next++
	size := p.rsizes[i]
	if size > len(b) {
		return 0, fmt.Errorf("tun: packet of %d bytes does not fit a %d-byte buffer: %w", size, len(b), io.ErrShortBuffer)
	}
	return copy(b, p.rbufs[i][:size]), nil
}

// ReadSuper reads one frame whole (see SuperReader) when the device is a
// SuperReader; the netstack's device link uses it in place of ReadPacket.
// For any other device it fails with errors.ErrUnsupported.
func (p *PacketDevice) ReadSuper(b []byte) (n, gso int, err error) {
	sr, ok := p.dev.(SuperReader)
	if !ok {
		return 0, 0, fmt.Errorf("tun: whole super-segments: %w", errors.ErrUnsupported)
	}
	return sr.ReadSuper(b)
}

// SupportsSuper reports whether ReadSuper works on this device.
func (p *PacketDevice) SupportsSuper() bool {
	_, ok := p.dev.(SuperReader)
	return ok
}

// WriteFrame writes one frame (see FrameWriter) when the device is a
// FrameWriter; for any other device it fails with errors.ErrUnsupported.
func (p *PacketDevice) WriteFrame(pieces [][]byte, gso, hdrLen, csumStart, csumOffset int) error {
	fw, ok := p.dev.(FrameWriter)
	if !ok {
		return fmt.Errorf("tun: offloaded frames: %w", errors.ErrUnsupported)
	}
	return fw.WriteFrame(pieces, gso, hdrLen, csumStart, csumOffset)
}

// SupportsFrames reports whether WriteFrame works on this device.
func (p *PacketDevice) SupportsFrames() bool {
	_, ok := p.dev.(FrameWriter)
	return ok
}

// WritePacket writes one IP packet; b is only used during the call.
func (p *PacketDevice) WritePacket(b []byte) error {
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	p.wbufs[0] = b
	n, err := p.dev.Write(p.wbufs, 0)
	p.wbufs[0] = nil
	if n == 1 {
		return nil
	}
	if err != nil {
		return err
	}
	return io.ErrShortWrite
}

// WritePackets writes several packets with one Device.Write (a device with
// segmentation offload coalesces them); it is netstack.BatchWriter's.
func (p *PacketDevice) WritePackets(pkts [][]byte) (int, error) {
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	return p.dev.Write(pkts, 0)
}

// MaxBatch is the device's BatchSize: WritePackets takes at most that many
// packets.
func (p *PacketDevice) MaxBatch() int { return p.batch }

// MTU returns the device's MTU, or 0 when the device cannot report it
// (netstack.NewDeviceLink then uses its default).
func (p *PacketDevice) MTU() int {
	mtu, err := p.dev.MTU()
	if err != nil || mtu <= 0 {
		return 0
	}
	return mtu
}

// Close closes the device, which unblocks ReadPacket.
func (p *PacketDevice) Close() error { return p.dev.Close() }

// Device returns the underlying Device.
func (p *PacketDevice) Device() Device { return p.dev }
