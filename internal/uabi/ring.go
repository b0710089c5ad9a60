package uabi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/siwtun/siwtun/verbs/ibv"
)

// Ring header (HeaderSize bytes at the start of every ring), 32-bit words:
const (
	hdrMagic     = 0  // RingMagic
	hdrEntrySize = 4  // bytes per entry
	hdrCount     = 8  // entries, a power of two
	hdrNotify    = 12 // SQ/RQ: the daemon sleeps until a doorbell; CQ: armed (NotifyNext, NotifySolicited)
	hdrOverflow  = 16 // CQ: completions were lost

	// HeaderSize is the ring header's size; entries follow it.
	HeaderSize = 64
	// RingMagic starts every ring header ("SIWR").
	RingMagic = 0x52574953
)

// CQ arming values of the Notify word.
const (
	NotifyNone      = 0
	NotifyNext      = 1 // notify on the next completion
	NotifySolicited = 2 // notify on the next solicited or error completion
)

// Ownership word bits (the first 32 bits of every entry).
const (
	// Valid: the entry belongs to the consumer (siw's SIW_WQE_VALID).
	Valid = 1 << 0
	// Solicited marks a CQE of a Send with Solicited Event.
	Solicited = 1 << 1
)

// Entry sizes.
const (
	// SQESize: owner u32 | opcode u8 | nsge u8 | inline len u16 | flags u32 |
	// invalidate rkey u32 | id u64 | remote addr u64 | rkey u32 | imm data u32 |
	// 6 SGEs {addr u64, length u32, lkey u32} | 256 bytes inline. An
	// atomic (never inline) carries its operands in the inline area:
	// compare_add u64 | swap u64. A BIND_MW carries the window's rkey in
	// the invalidate rkey, its new rkey in rkey, the window's address in
	// remote addr, and in the inline area: length u64 | MR lkey u32 |
	// access u32 | type 1 u32 (0 or 1). A LOCAL_INV carries its STag in
	// the invalidate rkey.
	SQESize = 40 + ibv.MaxSGE*sgeSize + ibv.MaxInline
	// sqeInline is where an SQE's inline data, or an atomic's operands,
	// start.
	sqeInline = 40 + ibv.MaxSGE*sgeSize
	// RQESize: owner u32 | nsge u8 | pad | id u64 | 6 SGEs.
	RQESize = 16 + ibv.MaxSGE*sgeSize
	// CQESize: owner u32 (Valid|Solicited) | status u32 | id u64 | opcode u32 |
	// vendor err u32 | byte len u32 | qp num u32 | flags u32 | invalidated
	// rkey or imm data u32 (by flags: WCWithImm, as libibverbs' union).
	CQESize = 40
	sgeSize = 16
)

// MaxRingEntries bounds every ring.
const MaxRingEntries = 1 << 20

// RingCount returns the entries of a ring holding at least n (a power of two).
func RingCount(n int) uint32 {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len32(uint32(n-1))
}

// RingBytes is the memory of a ring of count entries of size esz, rounded
// up to whole pages.
func RingBytes(count uint32, esz int) int {
	return pageRound(HeaderSize + int(count)*esz)
}

// RingSpan is the memory of a ring of count entries of size esz, rounded
// up to whole cache lines, for rings that share pages: a queue pair's SQ
// and RQ lie one after the other in one mapping (its CreateQP reply says
// where the RQ begins), so the two rings of a shallow QP take one page.
func RingSpan(count uint32, esz int) int {
	const line = 64
	return (HeaderSize + int(count)*esz + line - 1) &^ (line - 1)
}

// Ring is one ring of fixed-size entries over shared memory.
type Ring struct {
	mem   []byte
	count uint32
	mask  uint32
	esz   int
}

// ErrRing is the root of ring layout errors.
var ErrRing = errors.New("uabi: bad ring")

// InitRing formats mem as an empty ring (the daemon, which creates rings).
func InitRing(mem []byte, count uint32, esz int) (*Ring, error) {
	if count == 0 || count&(count-1) != 0 || count > MaxRingEntries || len(mem) < HeaderSize+int(count)*esz {
		return nil, fmt.Errorf("%w: %d entries of %d bytes in %d bytes", ErrRing, count, esz, len(mem))
	}
	clear(mem[:HeaderSize+int(count)*esz])
	binary.LittleEndian.PutUint32(mem[hdrEntrySize:], uint32(esz))
	binary.LittleEndian.PutUint32(mem[hdrCount:], count)
	atomic32(mem, hdrMagic).Store(RingMagic)
	return &Ring{mem: mem, count: count, mask: count - 1, esz: esz}, nil
}

// OpenRing checks the header of a ring created by the other side and
// returns it; want is the entry count the creator announced.
func OpenRing(mem []byte, want uint32, esz int) (*Ring, error) {
	if len(mem) < HeaderSize {
		return nil, fmt.Errorf("%w: %d bytes", ErrRing, len(mem))
	}
	magic := atomic32(mem, hdrMagic).Load()
	gotEsz := binary.LittleEndian.Uint32(mem[hdrEntrySize:])
	count := binary.LittleEndian.Uint32(mem[hdrCount:])
	if magic != RingMagic || int(gotEsz) != esz || count != want || count == 0 || count&(count-1) != 0 ||
		count > MaxRingEntries || len(mem) < HeaderSize+int(count)*esz {
		return nil, fmt.Errorf("%w: magic 0x%x, %d entries of %d bytes (want %d of %d) in %d bytes",
			ErrRing, magic, count, gotEsz, want, esz, len(mem))
	}
	return &Ring{mem: mem, count: count, mask: count - 1, esz: esz}, nil
}

func atomic32(mem []byte, off int) *atomic.Uint32 {
	_ = mem[off+3]
	return (*atomic.Uint32)(unsafe.Pointer(&mem[off]))
}

// Count is the number of entries.
func (r *Ring) Count() uint32 { return r.count }

// Entry returns the bytes of the entry at cursor pos (modulo the count).
func (r *Ring) Entry(pos uint32) []byte {
	off := HeaderSize + int(pos&r.mask)*r.esz
	return r.mem[off : off+r.esz : off+r.esz]
}

func (r *Ring) owner(pos uint32) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&r.mem[HeaderSize+int(pos&r.mask)*r.esz]))
}

// Free reports whether the producer owns the entry at pos.
func (r *Ring) Free(pos uint32) bool { return r.owner(pos).Load() == 0 }

// WaitFree waits for the consumer to hand back the entry at pos, which
// the producer's own accounting says is free, and reports whether it did
// within timeout. The daemon releases an SQ or RQ entry only after handing
// its request to the engine, which may complete it (and the client poll
// that completion and post again) first: the wait is short. It spins a
// little, then yields the processor, which the daemon may need; false
// means the consumer is stuck or gone. libsiwtun's wait_free does the same.
func (r *Ring) WaitFree(pos uint32, timeout time.Duration) bool {
	var deadline time.Time
	for i := 0; !r.Free(pos); i++ {
		if i < 64 {
			continue
		}
		if i == 64 {
			deadline = time.Now().Add(timeout)
		}
		yieldCPU()
		if time.Now().After(deadline) {
			return r.Free(pos)
		}
	}
	return true
}

// Publish hands the entry at pos, filled by the producer, to the consumer.
func (r *Ring) Publish(pos uint32, bits uint32) { r.owner(pos).Store(Valid | bits) }

// Ready returns the ownership bits of the entry at pos and whether the
// consumer owns it.
func (r *Ring) Ready(pos uint32) (uint32, bool) {
	v := r.owner(pos).Load()
	return v, v&Valid != 0
}

// Release hands the entry at pos, read by the consumer, back to the producer.
func (r *Ring) Release(pos uint32) { r.owner(pos).Store(0) }

// Notify is the header's Notify word (see the constants).
func (r *Ring) Notify() *atomic.Uint32 { return atomic32(r.mem, hdrNotify) }

// Overflow is the header's overflow word (CQ).
func (r *Ring) Overflow() *atomic.Uint32 { return atomic32(r.mem, hdrOverflow) }

// Errors of the entry decoders.
var (
	ErrEntry = errors.New("uabi: bad ring entry")
)

// EncodeSQE writes wr into the entry e (everything but the ownership word).
// The caller has checked the request (counts and sizes).
func EncodeSQE(e []byte, wr *ibv.SendWR) {
	_ = e[SQESize-1]
	e[4] = uint8(wr.Opcode)
	le := binary.LittleEndian
	if wr.Flags&ibv.FlagInline != 0 {
		e[5] = 0
		n := copy(e[sqeInline:SQESize], wr.Inline)
		le.PutUint16(e[6:], uint16(n))
	} else {
		n := min(len(wr.SGL), ibv.MaxSGE)
		e[5] = uint8(n)
		le.PutUint16(e[6:], 0)
		for i, s := range wr.SGL[:n] {
			putSGE(e[40+i*sgeSize:], s)
		}
	}
	le.PutUint32(e[8:], uint32(wr.Flags))
	le.PutUint32(e[12:], wr.InvalidateRKey)
	le.PutUint64(e[16:], wr.ID)
	le.PutUint64(e[24:], wr.RemoteAddr)
	le.PutUint32(e[32:], wr.RKey)
	le.PutUint32(e[36:], wr.ImmData)
	if wr.Opcode.Atomic() {
		le.PutUint64(e[sqeInline:], wr.CompareAdd)
		le.PutUint64(e[sqeInline+8:], wr.Swap)
	}
	if wr.Opcode == ibv.WRBindMW {
		b := &wr.Bind
		le.PutUint32(e[12:], b.MW)
		le.PutUint32(e[32:], b.RKey)
		le.PutUint64(e[24:], b.Addr)
		le.PutUint64(e[sqeInline:], b.Length)
		le.PutUint32(e[sqeInline+8:], b.MRKey)
		le.PutUint32(e[sqeInline+12:], uint32(b.Access))
		t1 := uint32(0)
		if b.Type1 {
			t1 = 1
		}
		le.PutUint32(e[sqeInline+16:], t1)
	}
}

// SQEBuf is the storage a decoded send request points into.
type SQEBuf struct {
	SGL    [ibv.MaxSGE]ibv.SGE
	Inline [ibv.MaxInline]byte
}

// DecodeSQE reads the entry e into wr, whose SGL and Inline point into buf.
// The entry is read once, field by field; it is checked for sizes only (the
// engine checks opcodes, keys and bounds when it posts and executes).
func DecodeSQE(e []byte, wr *ibv.SendWR, buf *SQEBuf) error {
	if len(e) < SQESize {
		return fmt.Errorf("%w: SQE of %d bytes", ErrEntry, len(e))
	}
	le := binary.LittleEndian
	op := e[4]
	nsge := int(e[5])
	inl := int(le.Uint16(e[6:]))
	flags := ibv.SendFlags(le.Uint32(e[8:]))
	if flags&^(ibv.FlagFence|ibv.FlagSignaled|ibv.FlagSolicited|ibv.FlagInline) != 0 {
		return fmt.Errorf("%w: send flags 0x%x", ErrEntry, uint32(flags))
	}
	if nsge > ibv.MaxSGE {
		return fmt.Errorf("%w: %d SGEs", ErrEntry, nsge)
	}
	if inl > ibv.MaxInline {
		return fmt.Errorf("%w: %d inline bytes", ErrEntry, inl)
	}
	*wr = ibv.SendWR{
		ID: le.Uint64(e[16:]), Opcode: ibv.WROpcode(op), Flags: flags,
		RemoteAddr: le.Uint64(e[24:]), RKey: le.Uint32(e[32:]), InvalidateRKey: le.Uint32(e[12:]),
		ImmData: le.Uint32(e[36:]),
	}
	if flags&ibv.FlagInline != 0 {
		copy(buf.Inline[:inl], e[sqeInline:])
		wr.Inline = buf.Inline[:inl]
		return nil
	}
	for i := 0; i < nsge; i++ {
		buf.SGL[i] = getSGE(e[40+i*sgeSize:])
	}
	wr.SGL = buf.SGL[:nsge]
	if wr.Opcode.Atomic() {
		wr.CompareAdd, wr.Swap = le.Uint64(e[sqeInline:]), le.Uint64(e[sqeInline+8:])
	}
	if wr.Opcode == ibv.WRBindMW {
		wr.Bind = ibv.MWBind{
			MW: wr.InvalidateRKey, RKey: wr.RKey, Addr: wr.RemoteAddr,
			Length: le.Uint64(e[sqeInline:]), MRKey: le.Uint32(e[sqeInline+8:]),
			Access: ibv.Access(le.Uint32(e[sqeInline+12:])), Type1: le.Uint32(e[sqeInline+16:]) == 1,
		}
		wr.InvalidateRKey, wr.RKey, wr.RemoteAddr = 0, 0, 0
	}
	return nil
}

// EncodeRQE writes wr into the entry e.
func EncodeRQE(e []byte, wr *ibv.RecvWR) {
	_ = e[RQESize-1]
	n := min(len(wr.SGL), ibv.MaxSGE)
	e[4] = uint8(n)
	binary.LittleEndian.PutUint64(e[8:], wr.ID)
	for i, s := range wr.SGL[:n] {
		putSGE(e[16+i*sgeSize:], s)
	}
}

// DecodeRQE reads the entry e into wr, whose SGL points into sgl.
func DecodeRQE(e []byte, wr *ibv.RecvWR, sgl *[ibv.MaxSGE]ibv.SGE) error {
	if len(e) < RQESize {
		return fmt.Errorf("%w: RQE of %d bytes", ErrEntry, len(e))
	}
	nsge := int(e[4])
	if nsge > ibv.MaxSGE {
		return fmt.Errorf("%w: %d SGEs", ErrEntry, nsge)
	}
	wr.ID = binary.LittleEndian.Uint64(e[8:])
	for i := 0; i < nsge; i++ {
		sgl[i] = getSGE(e[16+i*sgeSize:])
	}
	wr.SGL = sgl[:nsge]
	return nil
}

// EncodeCQE writes wc into the entry e (everything but the ownership word).
func EncodeCQE(e []byte, wc *ibv.WorkCompletion) {
	_ = e[CQESize-1]
	le := binary.LittleEndian
	le.PutUint32(e[4:], uint32(wc.Status))
	le.PutUint64(e[8:], wc.ID)
	le.PutUint32(e[16:], uint32(wc.Opcode))
	le.PutUint32(e[20:], wc.VendorErr)
	le.PutUint32(e[24:], wc.ByteLen)
	le.PutUint32(e[28:], wc.QPNum)
	le.PutUint32(e[32:], uint32(wc.Flags))
	if wc.Flags&ibv.WCWithImm != 0 {
		le.PutUint32(e[36:], wc.ImmData)
	} else {
		le.PutUint32(e[36:], wc.InvalidatedRKey)
	}
}

// DecodeCQE reads the entry e into wc.
func DecodeCQE(e []byte, wc *ibv.WorkCompletion) error {
	if len(e) < CQESize {
		return fmt.Errorf("%w: CQE of %d bytes", ErrEntry, len(e))
	}
	le := binary.LittleEndian
	*wc = ibv.WorkCompletion{
		Status: ibv.WCStatus(le.Uint32(e[4:])), ID: le.Uint64(e[8:]),
		Opcode: ibv.WCOpcode(le.Uint32(e[16:])), VendorErr: le.Uint32(e[20:]),
		ByteLen: le.Uint32(e[24:]), QPNum: le.Uint32(e[28:]), Flags: ibv.WCFlags(le.Uint32(e[32:])),
	}
	if wc.Flags&ibv.WCWithImm != 0 {
		wc.ImmData = le.Uint32(e[36:])
	} else {
		wc.InvalidatedRKey = le.Uint32(e[36:])
	}
	return nil
}

func putSGE(b []byte, s ibv.SGE) {
	binary.LittleEndian.PutUint64(b, s.Addr)
	binary.LittleEndian.PutUint32(b[8:], s.Length)
	binary.LittleEndian.PutUint32(b[12:], s.LKey)
}

func getSGE(b []byte) ibv.SGE {
	return ibv.SGE{Addr: binary.LittleEndian.Uint64(b), Length: binary.LittleEndian.Uint32(b[8:]), LKey: binary.LittleEndian.Uint32(b[12:])}
}
