package uabi

import (
	"bytes"
	"fmt"
	"strings"
	"unicode"
)

// CHeader renders the protocol (Ops, Events, the status codes, the limits
// and the ring layout constants) as a C header: #defines, and for every
// message an X-macro listing its fields in wire order, X(kind, name), with
// kinds u8, u16, u32, u64, bytes and addr (see Kind). A C client includes
// it, or checks its own definitions against it; testdata/siwtun_uabi.h is
// the current one (go test -update rewrites it).
func CHeader() []byte {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("/* siwtun verbs-socket ABI, generated from internal/uabi (CHeader). Do not edit. */\n")
	p("#ifndef SIWTUN_UABI_H\n#define SIWTUN_UABI_H\n\n")
	p("/* Messages: a little-endian header (u32 length, u16 op, u16 nfds, u32 seq), then the body.\n")
	p(" * A reply's body is a status (u32 code; if not OK: bytes msg, then bytes detail if present),\n")
	p(" * then, if OK, the op's reply fields. An event's body is a u32 kind, then its fields.\n")
	p(" * Kinds: u8 u16 u32 u64; bytes = u16 length + at most SIWTUN_MAX_BYTES bytes;\n")
	p(" * addr = u8 family (0 none, 4, 6), 16 address bytes (IPv4-mapped), u16 port. */\n")
	for _, c := range []struct {
		name string
		v    int
	}{{"MSG_HEADER_LEN", MsgHeaderLen}, {"MAX_MSG", MaxMsg}, {"MAX_FDS", MaxFDs}, {"VERSION", Version},
		{"REPLY_BIT", ReplyBit}, {"MAX_BYTES", MaxBytes}, {"ADDR_SIZE", AddrSize}, {"OP_EVENT", int(OpEvent)},
		{"RING_HEADER_SIZE", HeaderSize}, {"RING_MAGIC", RingMagic}, {"SQE_SIZE", SQESize}, {"RQE_SIZE", RQESize},
		{"CQE_SIZE", CQESize}, {"WQE_VALID", Valid}, {"CQE_SOLICITED", Solicited}, {"NOTIFY_NONE", NotifyNone},
		{"NOTIFY_NEXT", NotifyNext}, {"NOTIFY_SOLICITED", NotifySolicited}} {
		if c.v >= 0x4000 { // bits and magic numbers
			p("#define SIWTUN_%s %#x\n", c.name, c.v)
		} else {
			p("#define SIWTUN_%s %d\n", c.name, c.v)
		}
	}
	p("\n/* Reply status codes. */\n")
	for i, name := range statusNames {
		p("#define SIWTUN_ST_%s %d\n", name, i)
	}
	for _, op := range Ops {
		name := cName(op.Name)
		p("\n/* %s */\n#define SIWTUN_OP_%s %d\n", op.Name, name, op.Op)
		cFields(&b, name+"_REQUEST", op.Request)
		p("#define SIWTUN_%s_REQUEST_FDS %d\n", name, op.RequestFDs)
		if op.Reply != nil {
			cFields(&b, name+"_REPLY", op.Reply)
			p("#define SIWTUN_%s_REPLY_FDS %d\n", name, op.ReplyFDs)
		}
	}
	for _, ev := range Events {
		name := cName(ev.Name)
		p("\n/* %s event */\n#define SIWTUN_EV_%s %d\n", ev.Name, name, ev.Kind)
		cFields(&b, name+"_EVENT", ev.Body)
	}
	p("\n#endif /* SIWTUN_UABI_H */\n")
	return b.Bytes()
}

// statusNames are the St* codes' names, by value.
var statusNames = [...]string{StOK: "OK", StError: "ERROR", StBadMessage: "BAD_MESSAGE", StUnknownOp: "UNKNOWN_OP",
	StBadHandle: "BAD_HANDLE", StForeign: "FOREIGN", StBusy: "BUSY", StQPState: "QP_STATE", StRejected: "REJECTED",
	StCanceled: "CANCELED", StRemoved: "REMOVED", StNotSupported: "NOT_SUPPORTED", StLimit: "LIMIT"}

// cFields writes m's X-macro.
func cFields(b *bytes.Buffer, name string, m Msg) {
	fmt.Fprintf(b, "#define SIWTUN_%s(X)", name)
	for _, f := range Fields(m) {
		fmt.Fprintf(b, " \\\n\tX(%s, %s)", f.Kind, strings.ToLower(cName(f.Name)))
	}
	b.WriteString("\n")
}

// cName turns a Go name into C's upper snake case: MaxQPWR → MAX_QPWR,
// Param.PrivateData → PARAM_PRIVATE_DATA, STag → STAG.
func cName(s string) string {
	r := []rune(strings.ReplaceAll(s, "STag", "Stag"))
	var out []rune
	for i, c := range r {
		switch {
		case c == '.':
			out = append(out, '_')
			continue
		case i > 0 && unicode.IsUpper(c) && r[i-1] != '.' &&
			(unicode.IsLower(r[i-1]) || i+1 < len(r) && unicode.IsLower(r[i+1]) && unicode.IsUpper(r[i-1])):
			out = append(out, '_')
		}
		out = append(out, unicode.ToUpper(c))
	}
	return string(out)
}
