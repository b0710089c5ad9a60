package uabi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Messages on the verbs socket (a SOCK_SEQPACKET Unix socket: one message
// per packet, file descriptors attached with SCM_RIGHTS). Every message
// starts with a header, little-endian:
//
//	u32 length (of the whole message, header included)
//	u16 op     (requests; replies have ReplyBit set; OpEvent for events)
//	u16 nfds   (file descriptors attached)
//	u32 seq    (request number, echoed by the reply; 0 for events)
//
// A reply's body starts with a u32 status: 0, or an error code followed by
// a u16-length-prefixed message.
const (
	MsgHeaderLen = 12
	// MaxMsg bounds every message; longer ones are refused.
	MaxMsg = 4096
	// MaxFDs bounds the descriptors of one message.
	MaxFDs = 2
	// Version is the protocol version of Hello. 2: QPEvent carries
	// PrivateData. 3: immediate data (SQE and CQE), Connect and Accept
	// reply Established, QueryQPReply and QPEvent carry Ext. 4: shared
	// receive queues (the SRQ ops, CreateQP's SRQ, HelloReply's SRQ
	// limits, SRQEvent), ReregMR. 5: atomics
	// (their operands in the SQE's inline area), HelloReply carries
	// AtomicCap. 6: memory windows (AllocMW, DeallocMW, the SQE of
	// BIND_MW and LOCAL_INV, HelloReply's MaxMW). 7: port reservations
	// (ReservePort, ReleasePort).
	Version = 7
	// ReplyBit marks a reply's op.
	ReplyBit = 0x8000
)

// Ops.
const (
	OpHello uint16 = iota + 1
	OpAllocPD
	OpDeallocPD
	OpRegMR
	OpDeregMR
	OpCreateCQ
	OpDestroyCQ
	OpCreateQP
	OpDestroyQP
	OpModifyQP
	OpQueryQP
	OpConnect
	OpDisconnect
	OpListen
	OpCloseListener
	OpGetRequest
	OpAccept
	OpReject
	OpCancel
	OpCreateSRQ
	OpDestroySRQ
	OpModifySRQ
	OpQuerySRQ
	OpReregMR
	OpAllocMW
	OpDeallocMW
	OpReservePort
	OpReleasePort
	opMax

	// OpEvent is an asynchronous event from the daemon.
	OpEvent uint16 = 0x4000
)

// Event kinds (first u32 of an OpEvent body).
const (
	EvQP            = 1 // u32 QP handle, u32 type, u16 code, string error, bytes private data (EventEstablished), u8 ext
	EvDeviceRemoved = 2 // string reason
	EvSRQ           = 3 // u32 SRQ handle, u32 type (the limit event)
)

// Status codes of replies.
const (
	StOK           = 0
	StError        = 1 // generic failure, see the message
	StBadMessage   = 2 // truncated, oversized or malformed message
	StUnknownOp    = 3
	StBadHandle    = 4 // no such object in this session
	StForeign      = 5 // the handle is another client's
	StBusy         = 6
	StQPState      = 7
	StRejected     = 8 // Connect: the peer rejected; the message is its private data's reason
	StCanceled     = 9
	StRemoved      = 10 // the device is going away
	StNotSupported = 11
	StLimit        = 12 // a per-client limit of the daemon was reached (siwtun up --max-client-*)
)

// ErrBadMessage is returned by the decoders for malformed messages.
var ErrBadMessage = errors.New("uabi: malformed message")

// Header is a decoded message header.
type Header struct {
	Len  uint32
	Op   uint16
	NFDs uint16
	Seq  uint32
}

// Enc builds one message.
type Enc struct{ B []byte }

// Begin starts a message.
func (e *Enc) Begin(op uint16, seq uint32) {
	e.B = append(e.B[:0], make([]byte, MsgHeaderLen)...)
	binary.LittleEndian.PutUint16(e.B[4:], op)
	binary.LittleEndian.PutUint32(e.B[8:], seq)
}

// Finish fills in the length and descriptor count and returns the message.
func (e *Enc) Finish(nfds int) []byte {
	binary.LittleEndian.PutUint32(e.B[0:], uint32(len(e.B)))
	binary.LittleEndian.PutUint16(e.B[6:], uint16(nfds))
	return e.B
}

// U8 appends v.
func (e *Enc) U8(v uint8) { e.B = append(e.B, v) }

// U16 appends v, little-endian.
func (e *Enc) U16(v uint16) { e.B = binary.LittleEndian.AppendUint16(e.B, v) }

// U32 appends v, little-endian.
func (e *Enc) U32(v uint32) { e.B = binary.LittleEndian.AppendUint32(e.B, v) }

// U64 appends v, little-endian.
func (e *Enc) U64(v uint64) { e.B = binary.LittleEndian.AppendUint64(e.B, v) }

// MaxBytes bounds a bytes or string field.
const MaxBytes = 1024

// Bytes appends b with a u16 length, truncated to MaxBytes.
func (e *Enc) Bytes(b []byte) {
	if len(b) > MaxBytes {
		b = b[:MaxBytes]
	}
	e.U16(uint16(len(b)))
	e.B = append(e.B, b...)
}

// String appends s like Bytes.
func (e *Enc) String(s string) { e.Bytes([]byte(s)) }

// AddrPort appends an address (16 bytes, IPv4-mapped for IPv4) and a port.
func (e *Enc) AddrPort(a netip.AddrPort) {
	b := a.Addr().As16()
	flag := uint8(0)
	if a.Addr().Is4() {
		flag = 4
	} else if a.Addr().Is6() {
		flag = 6
	}
	e.U8(flag)
	e.B = append(e.B, b[:]...)
	e.U16(a.Port())
}

// Dec reads one message body; the first error sticks and every later read
// returns zero values.
type Dec struct {
	B   []byte
	Err error
}

func (d *Dec) take(n int) []byte {
	if d.Err != nil {
		return nil
	}
	if len(d.B) < n {
		d.Err = fmt.Errorf("%w: %d bytes left, field of %d", ErrBadMessage, len(d.B), n)
		return nil
	}
	b := d.B[:n]
	d.B = d.B[n:]
	return b
}

// U8 reads a u8.
func (d *Dec) U8() uint8 {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

// U16 reads a little-endian u16.
func (d *Dec) U16() uint16 {
	if b := d.take(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

// U32 reads a little-endian u32.
func (d *Dec) U32() uint32 {
	if b := d.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

// U64 reads a little-endian u64.
func (d *Dec) U64() uint64 {
	if b := d.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// Bytes reads a u16-length-prefixed field (a copy; nil if empty); one
// longer than MaxBytes, which no encoder writes, is malformed.
func (d *Dec) Bytes() []byte {
	n := int(d.U16())
	if n > MaxBytes && d.Err == nil {
		d.Err = fmt.Errorf("%w: field of %d bytes, more than %d", ErrBadMessage, n, MaxBytes)
	}
	b := d.take(n)
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}

// String reads a field written by Enc.String.
func (d *Dec) String() string { return string(d.Bytes()) }

// AddrPort reads a field written by Enc.AddrPort.
func (d *Dec) AddrPort() netip.AddrPort {
	flag := d.U8()
	b := d.take(16)
	port := d.U16()
	if d.Err != nil {
		return netip.AddrPort{}
	}
	a := netip.AddrFrom16([16]byte(b))
	switch flag {
	case 4:
		a = a.Unmap()
	case 6:
	case 0:
		a = netip.Addr{}
	default:
		d.Err = fmt.Errorf("%w: address family %d", ErrBadMessage, flag)
	}
	return netip.AddrPortFrom(a, port)
}

// End fails if bytes are left over or a read failed.
func (d *Dec) End() error {
	if d.Err == nil && len(d.B) != 0 {
		d.Err = fmt.Errorf("%w: %d trailing bytes", ErrBadMessage, len(d.B))
	}
	return d.Err
}

// ParseHeader checks a received packet of n bytes (trunc: the kernel cut
// it) against its header and returns the header and the body.
func ParseHeader(p []byte, trunc bool) (Header, []byte, error) {
	if len(p) < MsgHeaderLen {
		return Header{}, nil, fmt.Errorf("%w: %d bytes, shorter than a header", ErrBadMessage, len(p))
	}
	h := Header{
		Len: binary.LittleEndian.Uint32(p), Op: binary.LittleEndian.Uint16(p[4:]),
		NFDs: binary.LittleEndian.Uint16(p[6:]), Seq: binary.LittleEndian.Uint32(p[8:]),
	}
	switch {
	case trunc || h.Len > MaxMsg:
		return h, nil, fmt.Errorf("%w: longer than %d bytes", ErrBadMessage, MaxMsg)
	case int(h.Len) != len(p):
		return h, nil, fmt.Errorf("%w: header says %d bytes, got %d", ErrBadMessage, h.Len, len(p))
	case h.NFDs > MaxFDs:
		return h, nil, fmt.Errorf("%w: %d descriptors", ErrBadMessage, h.NFDs)
	}
	return h, p[MsgHeaderLen:], nil
}

// Conn reads and writes messages with descriptors on a seqpacket socket.
type Conn struct {
	C   *net.UnixConn
	buf []byte
	oob []byte
}

// NewConn wraps c.
func NewConn(c *net.UnixConn) *Conn {
	return &Conn{C: c, buf: make([]byte, MaxMsg+1), oob: make([]byte, unix.CmsgSpace(4*(MaxFDs+1)))}
}

// Send writes one message with fds attached.
func (c *Conn) Send(msg []byte, fds ...int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err := c.C.WriteMsgUnix(msg, oob, nil)
	return err
}

// Recv reads one message. The returned packet is valid until the next Recv;
// fds are the received descriptors (the caller owns them, even on a
// header error). A non-nil err with ErrBadMessage concerns this message
// only; any other error ends the connection.
func (c *Conn) Recv() (h Header, body []byte, fds []int, err error) {
	n, oobn, flags, _, err := c.C.ReadMsgUnix(c.buf, c.oob)
	if err != nil {
		return Header{}, nil, nil, err
	}
	if n == 0 && oobn == 0 {
		return Header{}, nil, nil, errEOF
	}
	if oobn > 0 {
		fds = parseRights(c.oob[:oobn])
	}
	if flags&unix.MSG_CTRUNC != 0 {
		err = fmt.Errorf("%w: descriptors lost (control data truncated: too many descriptors, or the receiving process is at its open-file limit, RLIMIT_NOFILE)", ErrBadMessage)
		h, _, _ = ParseHeader(c.buf[:n], false)
		return h, nil, fds, err
	}
	h, body, err = ParseHeader(c.buf[:n], n > MaxMsg || flags&unix.MSG_TRUNC != 0)
	if err == nil && int(h.NFDs) != len(fds) {
		err = fmt.Errorf("%w: header announces %d descriptors, %d attached", ErrBadMessage, h.NFDs, len(fds))
	}
	return h, body, fds, err
}

var errEOF = errors.New("uabi: connection closed")

// IsEOF reports whether err is the peer's orderly close (an empty read, or
// io.EOF, which the net package returns for it on a unixpacket socket).
func IsEOF(err error) bool { return errors.Is(err, errEOF) || errors.Is(err, io.EOF) }

func parseRights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if f, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

// CloseFDs closes every descriptor in fds.
func CloseFDs(fds []int) {
	for _, fd := range fds {
		Close(fd)
	}
}
