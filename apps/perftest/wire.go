package perftest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
)

// The control exchange of perftest 6.06 (the one in perftest 4.5-0.17, as
// Debian 12 ships it) over the rdma_cm control connection. Every message is
// one IBV_WR_SEND of a fixed size; the client sends first and the server
// answers (perftest_communication.c: ctx_xchg_data_rdma, ctx_hand_shake).

// Version is the perftest version siwtun announces in the version
// exchange. The peer gates features on it: at least 5.70 or it exits,
// from 5.32 on it exchanges page and cache-line sizes, from 5.31 the MTU
// message is 2 bytes, from 5.33 report iteration counts are 64-bit, and
// from 6.28 (newer perftest) it would negotiate parameters with a raw
// ibv_device_attr, which 6.06 keeps it from doing.
const Version = "6.06"

// Control message sizes on the wire.
const (
	versionLen  = 16 // char version[MAX_VERSION]
	sysDataLen  = 4  // int, big-endian
	mtuMsgLen   = 2  // sprintf("%d") of the MTU enum, 2 bytes from 5.31 on
	destLen     = 56 // struct pingpong_dest on x86-64
	reportField = 8  // each field of xchg_bw_reports
	creditLen   = 4  // the receive credit an RDMA Write carries
	// maxCtrlMsg bounds a control message siwtun accepts; a newer perftest
	// may send a longer pingpong_dest, of which the first destLen bytes
	// are read.
	maxCtrlMsg = 256
)

// Dest is perftest's struct pingpong_dest: what one side tells the other
// about a test queue pair. rdma_write_keys sends every integer big-endian
// and the GID raw; rdma_read_keys reads the fields up to the GID.
//
//	off 0  lid        int32
//	off 4  out_reads  int32
//	off 8  qpn        int32
//	off 12 psn        int32
//	off 16 rkey       uint32
//	off 20 (padding)
//	off 24 vaddr      uint64
//	off 32 gid        [16]byte
//	off 48 srqn       uint32
//	off 52 gid_index  int32
type Dest struct {
	LID      uint32
	OutReads uint32
	QPN      uint32
	PSN      uint32
	RKey     uint32
	VAddr    uint64
	GID      [16]byte
	SRQN     uint32
	GIDIndex int32
}

// Marshal returns the 56-byte wire form.
func (d *Dest) Marshal() []byte {
	b := make([]byte, destLen)
	be := binary.BigEndian
	be.PutUint32(b[0:], d.LID)
	be.PutUint32(b[4:], d.OutReads)
	be.PutUint32(b[8:], d.QPN)
	be.PutUint32(b[12:], d.PSN)
	be.PutUint32(b[16:], d.RKey)
	be.PutUint64(b[24:], d.VAddr)
	copy(b[32:48], d.GID[:])
	be.PutUint32(b[48:], d.SRQN)
	be.PutUint32(b[52:], uint32(d.GIDIndex))
	return b
}

// errShortMessage reports a control message shorter than its type.
var errShortMessage = errors.New("control message too short")

// UnmarshalDest parses a pingpong_dest. Longer messages (a later perftest
// with more fields) are accepted; their first 56 bytes are read.
func UnmarshalDest(b []byte) (Dest, error) {
	if len(b) < destLen {
		return Dest{}, fmt.Errorf("pingpong_dest: %d bytes, want %d: %w", len(b), destLen, errShortMessage)
	}
	be := binary.BigEndian
	d := Dest{
		LID: be.Uint32(b[0:]), OutReads: be.Uint32(b[4:]), QPN: be.Uint32(b[8:]),
		PSN: be.Uint32(b[12:]), RKey: be.Uint32(b[16:]), VAddr: be.Uint64(b[24:]),
		SRQN: be.Uint32(b[48:]), GIDIndex: int32(be.Uint32(b[52:])),
	}
	copy(d.GID[:], b[32:48])
	return d, nil
}

// gidFor returns the GID siwtun shows for an address: the IPv4-mapped or
// IPv6 address, as RoCE v2 and rdma_cm GIDs are.
func gidFor(a netip.Addr) [16]byte {
	if !a.IsValid() {
		return [16]byte{}
	}
	return netip.AddrFrom16(a.As16()).As16()
}

// marshalVersion returns the 16-byte version message.
func marshalVersion(v string) []byte {
	b := make([]byte, versionLen)
	copy(b[:versionLen-1], v)
	return b
}

// parseVersion reads a version message: the string up to the first NUL.
func parseVersion(b []byte) (string, error) {
	if len(b) < versionLen {
		return "", fmt.Errorf("version: %d bytes, want %d: %w", len(b), versionLen, errShortMessage)
	}
	s := string(b[:versionLen])
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	return s, nil
}

// versionNumber is perftest's atof() of a version string: the leading
// decimal number, 0 when there is none.
func versionNumber(v string) float64 {
	end := 0
	dot := false
	for end < len(v) {
		c := v[end]
		if c == '.' && !dot {
			dot = true
		} else if c < '0' || c > '9' {
			break
		}
		end++
	}
	f, err := strconv.ParseFloat(strings.TrimSuffix(v[:end], "."), 64)
	if err != nil {
		return 0
	}
	return f
}

// marshalInt32 is a 4-byte big-endian int (check_sys_data's page and
// cache-line sizes).
func marshalInt32(v int) []byte {
	return binary.BigEndian.AppendUint32(nil, uint32(v))
}

func parseInt32(b []byte) (int, error) {
	if len(b) < sysDataLen {
		return 0, fmt.Errorf("int: %d bytes, want %d: %w", len(b), sysDataLen, errShortMessage)
	}
	return int(int32(binary.BigEndian.Uint32(b))), nil
}

// marshalMTU is check_mtu's message: the verbs MTU enum as decimal text in
// 2 bytes (one digit and the NUL).
func marshalMTU(enum int) []byte {
	b := make([]byte, mtuMsgLen)
	copy(b, strconv.Itoa(enum))
	return b
}

// parseMTU reads an MTU message; 0 when it is not a valid enum (256..4096
// bytes: 1..5), which makes the caller keep its own.
func parseMTU(b []byte) int {
	s := string(b)
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 || v > 5 {
		return 0
	}
	return v
}

// reportFields are the five 8-byte messages of xchg_bw_reports, in order:
// size and iterations (big-endian integers), then the peak and average
// bandwidth and the message rate (IEEE 754 doubles, byte-swapped to
// big-endian).
func reportFields(r BWResult) [5][]byte {
	be := binary.BigEndian
	return [5][]byte{
		be.AppendUint64(nil, uint64(r.Size)),
		be.AppendUint64(nil, r.Iters),
		be.AppendUint64(nil, math.Float64bits(r.Peak)),
		be.AppendUint64(nil, math.Float64bits(r.Average)),
		be.AppendUint64(nil, math.Float64bits(r.MsgRate)),
	}
}

// parseReport assembles a peer's report from its five messages.
func parseReport(f [5][]byte) (BWResult, error) {
	for i, b := range f {
		if len(b) < reportField {
			return BWResult{}, fmt.Errorf("report field %d: %d bytes, want %d: %w", i, len(b), reportField, errShortMessage)
		}
	}
	be := binary.BigEndian
	r := BWResult{
		Size:    int(be.Uint64(f[0])),
		Iters:   be.Uint64(f[1]),
		Peak:    math.Float64frombits(be.Uint64(f[2])),
		Average: math.Float64frombits(be.Uint64(f[3])),
		MsgRate: math.Float64frombits(be.Uint64(f[4])),
	}
	if r.Size < 0 {
		return BWResult{}, fmt.Errorf("report: size %d", r.Size)
	}
	return r, nil
}

// Receive credits (send tests on iWARP, which has no receiver-not-ready
// retry): the receiver RDMA-Writes the count of receives it has completed on
// a queue pair, a 4-byte integer in its host byte order (little-endian on
// the x86-64 and arm64 hosts perftest runs on), into the sender's credit
// slot for that queue pair (perftest_resources.c: ctx_alloc_credit,
// ctx_set_credit_wqes, run_iter_bw_server).

func marshalCredit(b []byte, v uint32) { binary.LittleEndian.PutUint32(b, v) }
