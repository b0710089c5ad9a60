package netstack

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/siwtun/siwtun/anatomy"
)

// PacketDevice is a raw-IP packet device such as a TUN opened with
// IFF_TUN|IFF_NO_PI: every ReadPacket returns one IP packet, every
// WritePacket sends one.
type PacketDevice interface {
	// ReadPacket reads one IP packet into p and returns its length. It
	// blocks until a packet arrives and returns an error once the device is
	// closed.
	ReadPacket(p []byte) (int, error)
	// WritePacket writes one IP packet. p is only valid during the call.
	WritePacket(p []byte) error
	// MTU is the device MTU.
	MTU() int
	// Close closes the device and unblocks ReadPacket.
	Close() error
}

// BatchWriter is a PacketDevice that takes several packets per call, such
// as a TUN device with segmentation offload, which coalesces runs of TCP
// segments into one write.
type BatchWriter interface {
	// WritePackets writes the packets in order and returns how many went
	// out; pkts and the packets are only valid during the call.
	WritePackets(pkts [][]byte) (int, error)
	// MaxBatch is the most packets one WritePackets call takes.
	MaxBatch() int
}

// SuperReader is a PacketDevice that can hand over the TCP super-segments
// the kernel did not cut, whole (tun.PacketDevice over a TUN device with
// segmentation offload). The device link then gives gVisor one packet per
// super-segment, so the stack's per-packet work is paid once per up to
// 64 KiB, while the segment hooks still see every wire segment; it
// advertises receive checksum offload, since the device checks (or the
// kernel vouched for) every checksum.
type SuperReader interface {
	// ReadSuper reads one frame into p: a packet (gso 0) or a TCP
	// super-segment whose wire segments carry gso octets of payload each
	// but the last.
	ReadSuper(p []byte) (n, gso int, err error)
	// SupportsSuper reports whether ReadSuper works.
	SupportsSuper() bool
}

// FrameWriter is a PacketDevice that takes frames whose segmentation and
// checksum the kernel completes (tun.PacketDevice over a TUN device with
// segmentation offload). With a FrameWriter that is also a SuperReader the
// device link offers segmentation offload: gVisor builds TCP
// super-segments with a partial checksum, and each packet is written as one
// frame, without a copy.
type FrameWriter interface {
	// WriteFrame writes one IP packet made of pieces, headers (hdrLen
	// octets) first. gso > 0: a TCP super-segment to cut into segments of
	// gso payload octets. csumOffset > 0: the checksum at
	// csumStart+csumOffset is partial (the pseudo-header sum).
	WriteFrame(pieces [][]byte, gso, hdrLen, csumStart, csumOffset int) error
	// SupportsFrames reports whether WriteFrame works.
	SupportsFrames() bool
}

// maxFrame is the largest frame a SuperReader returns: IPv4's total
// length.
const maxFrame = 65535

// NewDeviceLink returns a Link over dev. Each packet is read into its own
// buffer view, which becomes the packet without a copy, so Conn.ReadTo sees
// one slice per received packet: a wire segment, or, when dev is a
// SuperReader, a whole super-segment of several (a packet of at most half
// of 64 KiB is copied into a view of its size first). Each outbound packet
// is copied once into a scratch buffer and written with one WritePacket
// call (or handed to a BatchWriter with the packets around it). GSO is not
// advertised, so gVisor never builds segments larger than the MSS.
//
// The read goroutine starts when a Stack attaches and ends when the Link is
// closed (Stack.Close closes it, which closes dev).
func NewDeviceLink(dev PacketDevice) *Link {
	mtu := dev.MTU()
	if mtu <= 0 {
		mtu = DefaultMTU
	}
	e := &deviceEndpoint{dev: dev, mtu: uint32(mtu), scratch: make([]byte, mtu), hops: anatomy.NewRecorder()}
	if sr, ok := dev.(SuperReader); ok && sr.SupportsSuper() {
		e.super = sr
		e.whole.Store(true)
		if fw, ok := dev.(FrameWriter); ok && fw.SupportsFrames() {
			e.frames = fw
		}
	}
	if bw, ok := dev.(BatchWriter); ok && bw.MaxBatch() > 1 {
		e.batch = bw
		e.bufs = make([][]byte, bw.MaxBatch())
		for i := range e.bufs {
			e.bufs[i] = make([]byte, mtu)
		}
	}
	return &Link{
		ep:         e,
		mtu:        mtu,
		batch:      e.batch != nil,
		stats:      func() LinkStats { return LinkStats{Tx: e.tx.snapshot(), Rx: e.rx.snapshot()} },
		shutdown:   e.shutdown,
		splitSuper: func() { e.whole.Store(false) },
		gso:        func() bool { return e.frames != nil && e.whole.Load() },
		hops:       e.hops,
	}
}

// deviceEndpoint is the stack.LinkEndpoint over a PacketDevice.
type deviceEndpoint struct {
	dev PacketDevice
	mtu uint32
	// super is dev when it can hand over super-segments whole; whole says
	// the link reads them so (it was not asked to split them). It is set
	// before the stack attaches.
	super SuperReader
	whole atomic.Bool
	// frames is dev when it takes offloaded frames (and is a SuperReader):
	// with whole set, the stack above builds super-segments and every
	// packet goes out through WriteFrame.
	frames FrameWriter
	tx     dirCounters
	rx     dirCounters
	// hops stamps the device's writes and reads (hops.go).
	hops *anatomy.Recorder
	// spare is the read buffer a short frame left (only the reading
	// goroutine uses it).
	spare *buffer.View

	closed   atomic.Bool
	stopOnce sync.Once
	wg       sync.WaitGroup

	mu         sync.RWMutex
	dispatcher stack.NetworkDispatcher // guarded by mu
	started    bool                    // guarded by mu

	writeMu sync.Mutex
	scratch []byte      // guarded by writeMu
	batch   BatchWriter // dev, if it takes batches
	bufs    [][]byte    // a batch's packets; guarded by writeMu
	pending [][]byte    // the slots of bufs in use; guarded by writeMu
	pieces  [][]byte    // one frame's pieces; guarded by writeMu
}

var _ stack.LinkEndpoint = (*deviceEndpoint)(nil)

func (e *deviceEndpoint) shutdown() {
	e.stopOnce.Do(func() {
		e.closed.Store(true)
		e.mu.Lock()
		e.dispatcher = nil
		e.mu.Unlock()
		_ = e.dev.Close()
		e.wg.Wait()
	})
}

// readLoop reads packets until the device fails permanently.
func (e *deviceEndpoint) readLoop() {
	defer e.wg.Done()
	for {
		buf, gso, err := e.read()
		if e.hops.On() && err == nil {
			stampRead(e.hops, buf, anatomy.Now())
		}
		if err != nil {
			if e.closed.Load() || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed) {
				return
			}
			e.rx.errorsCount.Add(1)
			continue
		}
		e.rx.sent.Add(1)
		if buf.Size() == 0 {
			continue
		}
		var proto tcpip.NetworkProtocolNumber
		gsoType := stack.GSOTCPv4
		vl := buf.AsViewList()
		switch vl.Front().AsSlice()[0] >> 4 {
		case 4:
			proto = header.IPv4ProtocolNumber
		case 6:
			proto, gsoType = header.IPv6ProtocolNumber, stack.GSOTCPv6
		default:
			buf.Release()
			e.rx.dropped.Add(1)
			continue
		}
		e.mu.RLock()
		d := e.dispatcher
		if d == nil {
			e.mu.RUnlock()
			buf.Release()
			e.rx.queueFull.Add(1)
			continue
		}
		n := buf.Size()
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buf})
		if gso > 0 {
			// Read by the segment hooks (Stack.inbound), which see the
			// wire segments inside; gVisor's receive path ignores it.
			pkt.GSOOptions = stack.GSO{Type: gsoType, MSS: uint16(gso)}
		}
		e.rx.delivered.Add(1)
		e.rx.bytes.Add(uint64(n))
		d.DeliverNetworkPacket(proto, pkt)
		e.mu.RUnlock()
		pkt.DecRef()
	}
}

// read reads the next packet: an empty buffer for an empty read. gso is a
// super-segment's segment size (0 for a packet).
//
// A TCP packet with payload comes as two views, its IP and TCP headers in
// a small one and its payload in another: gVisor's IPv4 input clones the
// chunk under the headers (PacketHeader.View, then a pull-up while that
// clone lives copies it whole), which would otherwise copy the whole
// packet, up to 64 KiB, once more.
func (e *deviceEndpoint) read() (buffer.Buffer, int, error) {
	if !e.whole.Load() {
		v := buffer.NewViewSize(int(e.mtu))
		n, err := e.dev.ReadPacket(v.AsSlice())
		if err != nil || n <= 0 {
			v.Release()
			return buffer.Buffer{}, 0, err
		}
		v.CapLength(n)
		return withHeaderView(v), 0, nil
	}
	// gVisor clears every chunk it hands out: the 64 KiB read buffer is
	// kept from read to read until a frame big enough takes it along.
	v := e.spare
	if v == nil {
		v = buffer.NewViewSize(maxFrame)
	}
	e.spare = nil
	n, gso, err := e.super.ReadSuper(v.AsSlice())
	if err != nil || n <= 0 {
		e.spare = v
		return buffer.Buffer{}, 0, err
	}
	if n <= maxFrame/2 {
		// A packet or a short super-segment: views of its size, so an
		// ACK or a segment queued for the application does not hold a
		// 64 KiB chunk.
		w := buffer.NewViewWithData(v.AsSlice()[:n])
		e.spare = v
		return withHeaderView(w), gso, nil
	}
	v.CapLength(n)
	return withHeaderView(v), gso, nil
}

// withHeaderView returns v as a buffer, a TCP packet's headers copied to
// a view of their own and trimmed from v (see read).
func withHeaderView(v *buffer.View) buffer.Buffer {
	b := v.AsSlice()
	h := tcpHeadersLen(b)
	if h == 0 {
		return buffer.MakeWithView(v)
	}
	buf := buffer.MakeWithView(headerView(b[:h]))
	v.TrimFront(h)
	buf.Append(v)
	return buf
}

// headerView returns a view holding hdr that is full to the end of its
// chunk, so that Buffer.Append adds the payload as a view of its own
// rather than moving its first octets into the headers' chunk.
func headerView(hdr []byte) *buffer.View {
	v := buffer.NewView(len(hdr))
	c := v.AvailableSize()
	v.Grow(c)
	copy(v.AsSlice()[c-len(hdr):], hdr)
	v.TrimFront(c - len(hdr))
	return v
}

// tcpHeadersLen returns the length of the IP and TCP headers of a TCP
// packet in b that carries payload behind them, or 0 for anything else
// (IPv6 extension headers, other protocols, bad lengths, no payload).
func tcpHeadersLen(b []byte) int {
	if len(b) < 40 {
		return 0
	}
	n := ipAndFixedTCPLen(b)
	if n == 0 || n >= len(b) {
		return 0
	}
	n += int(b[n-20+12]>>4)*4 - 20
	if n < 40 || n >= len(b) {
		return 0
	}
	return n
}

// MTU implements stack.LinkEndpoint.MTU.
func (e *deviceEndpoint) MTU() uint32 { return e.mtu }

// SetMTU implements stack.LinkEndpoint.SetMTU. The device MTU is fixed.
func (e *deviceEndpoint) SetMTU(uint32) {}

// MaxHeaderLength implements stack.LinkEndpoint.MaxHeaderLength.
func (e *deviceEndpoint) MaxHeaderLength() uint16 { return 0 }

// LinkAddress implements stack.LinkEndpoint.LinkAddress.
func (e *deviceEndpoint) LinkAddress() tcpip.LinkAddress { return "" }

// SetLinkAddress implements stack.LinkEndpoint.SetLinkAddress.
func (e *deviceEndpoint) SetLinkAddress(tcpip.LinkAddress) {}

// Capabilities implements stack.LinkEndpoint.Capabilities: receive
// checksum offload when the device hands over super-segments (it checks
// what the kernel did not vouch for), nothing otherwise (no GSO; checksums
// computed and verified in software).
func (e *deviceEndpoint) Capabilities() stack.LinkEndpointCapabilities {
	if e.whole.Load() {
		return stack.CapabilityRXChecksumOffload
	}
	return 0
}

// Attach implements stack.LinkEndpoint.Attach; the first attach starts the
// read goroutine.
func (e *deviceEndpoint) Attach(d stack.NetworkDispatcher) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return
	}
	e.dispatcher = d
	if d != nil && !e.started {
		e.started = true
		e.wg.Add(1)
		go e.readLoop()
	}
}

// IsAttached implements stack.LinkEndpoint.IsAttached.
func (e *deviceEndpoint) IsAttached() bool {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.dispatcher != nil
}

// Wait implements stack.LinkEndpoint.Wait.
func (e *deviceEndpoint) Wait() {}

// ARPHardwareType implements stack.LinkEndpoint.ARPHardwareType.
func (e *deviceEndpoint) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }

// AddHeader implements stack.LinkEndpoint.AddHeader.
func (e *deviceEndpoint) AddHeader(*stack.PacketBuffer) {}

// ParseHeader implements stack.LinkEndpoint.ParseHeader.
func (e *deviceEndpoint) ParseHeader(*stack.PacketBuffer) bool { return true }

// Close implements stack.LinkEndpoint.Close.
func (e *deviceEndpoint) Close() { e.shutdown() }

// SetOnCloseAction implements stack.LinkEndpoint.SetOnCloseAction.
func (e *deviceEndpoint) SetOnCloseAction(func()) {}

// WritePackets implements stack.LinkWriter.WritePackets: one WritePacket per
// packet, copied once into a scratch buffer.
func (e *deviceEndpoint) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	if e.closed.Load() {
		return 0, &tcpip.ErrClosedForSend{}
	}
	e.writeMu.Lock()
	defer e.writeMu.Unlock()
	if e.frames != nil && e.whole.Load() && builtForGSO(pkts) {
		return e.writeFrames(pkts)
	}
	if e.batch != nil {
		return e.writeBatch(pkts)
	}
	return e.writeEach(pkts, (*deviceEndpoint).writeCopy)
}

// writeEach writes the packets one at a time with write, counting them,
// and stops at the first that fails. e.writeMu is held.
func (e *deviceEndpoint) writeEach(pkts stack.PacketBufferList, write func(*deviceEndpoint, *stack.PacketBuffer) error) (int, tcpip.Error) {
	n := 0
	for _, pkt := range pkts.AsSlice() {
		size := pkt.Size()
		e.tx.sent.Add(1)
		if e.hops.On() {
			stampPacket(e.hops, anatomy.TUNWrite, pkt, anatomy.Now())
		}
		if err := write(e, pkt); err != nil {
			e.tx.errorsCount.Add(1)
			if n == 0 {
				return 0, &tcpip.ErrClosedForSend{}
			}
			return n, nil
		}
		e.tx.delivered.Add(1)
		e.tx.bytes.Add(uint64(size))
		n++
	}
	return n, nil
}

// writeCopy writes one packet, copied together, as one device write.
func (e *deviceEndpoint) writeCopy(pkt *stack.PacketBuffer) error {
	if size := pkt.Size(); size > len(e.scratch) {
		e.scratch = make([]byte, size)
	}
	b := e.scratch[:0]
	for _, s := range pkt.AsSlices() {
		b = append(b, s...)
	}
	return e.dev.WritePacket(b)
}

// writeBatch copies the packets into the batch buffers and hands them to
// the device a batch at a time. e.writeMu is held.
func (e *deviceEndpoint) writeBatch(pkts stack.PacketBufferList) (int, tcpip.Error) {
	all := pkts.AsSlice()
	n := 0
	for len(all) > 0 {
		k := min(len(all), len(e.bufs))
		e.pending = e.pending[:0]
		size := 0
		for i, pkt := range all[:k] {
			b := e.bufs[i][:0]
			if pkt.Size() > cap(b) {
				e.bufs[i] = make([]byte, 0, pkt.Size())
				b = e.bufs[i]
			}
			for _, s := range pkt.AsSlices() {
				b = append(b, s...)
			}
			e.pending = append(e.pending, b)
			size += len(b)
		}
		e.tx.sent.Add(uint64(k))
		if e.hops.On() {
			stampOut(e.hops, anatomy.TUNWrite, all[:k])
		}
		w, err := e.batch.WritePackets(e.pending)
		e.tx.delivered.Add(uint64(w))
		if err != nil || w < k {
			e.tx.errorsCount.Add(uint64(k - w))
			if n+w == 0 {
				return 0, &tcpip.ErrClosedForSend{}
			}
			return n + w, nil
		}
		e.tx.bytes.Add(uint64(size))
		n += k
		all = all[k:]
	}
	return n, nil
}

// writeFrames writes each packet as one frame, straight from its buffer
// views, with the offload it asks for (frameOffload). e.writeMu is held.
func (e *deviceEndpoint) writeFrames(pkts stack.PacketBufferList) (int, tcpip.Error) {
	return e.writeEach(pkts, (*deviceEndpoint).writeFrame)
}

// writeFrame writes one packet as one frame, its views as they are.
func (e *deviceEndpoint) writeFrame(pkt *stack.PacketBuffer) error {
	vl, skip := pkt.AsViewList()
	left := pkt.Size()
	e.pieces = e.pieces[:0]
	for v := vl.Front(); v != nil && left > 0; v = v.Next() {
		b := v.AsSlice()
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		b = b[skip:min(len(b), skip+left)]
		skip = 0
		e.pieces = append(e.pieces, b)
		left -= len(b)
	}
	gso, hdrLen, csumStart, csumOffset := frameOffload(pkt)
	err := e.frames.WriteFrame(e.pieces, gso, hdrLen, csumStart, csumOffset)
	clear(e.pieces)
	return err
}

// builtForGSO reports whether gVisor built pkts for segmentation offload
// (a stack with Options.NoGSO builds none: its segments are written in
// batches, which the device joins into super-segments).
func builtForGSO(pkts stack.PacketBufferList) bool {
	for _, pkt := range pkts.AsSlice() {
		if pkt.GSOOptions.Type != stack.GSONone {
			return true
		}
	}
	return false
}
