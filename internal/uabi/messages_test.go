package uabi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"reflect"
	"testing"
)

// allBodies is every message body of the protocol: requests, replies and
// events, each with where it comes from.
func allBodies() map[string]Msg {
	out := make(map[string]Msg)
	for _, op := range Ops {
		out[op.Name+" request"] = op.Request
		if op.Reply != nil {
			out[op.Name+" reply"] = op.Reply
		}
	}
	for _, ev := range Events {
		out[ev.Name+" event"] = ev.Body
	}
	return out
}

// filled returns a fresh m with every field set to a value of its own, so
// a field written twice, skipped or swapped shows.
func filled(m Msg, seed int) Msg {
	m = newMsg(m)
	n := seed
	fill(reflect.ValueOf(m).Elem(), &n)
	return m
}

func fill(v reflect.Value, n *int) {
	*n++
	switch {
	case v.Type() == addrPortType:
		a := netip.AddrFrom4([4]byte{198, 18, byte(*n), 2})
		if *n%2 == 0 {
			a = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(*n)})
		}
		v.Set(reflect.ValueOf(netip.AddrPortFrom(a, uint16(7000+*n))))
	case v.Kind() == reflect.Struct:
		for i := range v.NumField() {
			fill(v.Field(i), n)
		}
	case v.Kind() == reflect.Bool:
		v.SetBool(true)
	case v.Kind() == reflect.String:
		v.SetString(string(rune('a' + *n%26)))
	case v.Kind() == reflect.Slice:
		v.SetBytes(bytes.Repeat([]byte{byte(*n)}, *n%5+1))
	default:
		v.SetUint(uint64(*n) * 0x01010101)
	}
}

// wireValues reads b field by field as fields describes it.
func wireValues(t *testing.T, fields []Field, b []byte) []any {
	t.Helper()
	d := &Dec{B: b}
	var out []any
	for _, f := range fields {
		switch f.Kind {
		case KindU8:
			out = append(out, uint64(d.U8()))
		case KindU16:
			out = append(out, uint64(d.U16()))
		case KindU32:
			out = append(out, uint64(d.U32()))
		case KindU64:
			out = append(out, d.U64())
		case KindBytes:
			out = append(out, string(d.Bytes()))
		case KindAddr:
			out = append(out, d.AddrPort())
		}
	}
	if err := d.End(); err != nil {
		t.Fatalf("reading %d bytes as %v: %v", len(b), fields, err)
	}
	return out
}

// structValues are v's field values in declaration order, as wireValues
// reads them.
func structValues(v reflect.Value) []any {
	var out []any
	for i := range v.NumField() {
		f := v.Field(i)
		switch {
		case f.Type() == addrPortType:
			out = append(out, f.Interface())
		case f.Kind() == reflect.Struct:
			out = append(out, structValues(f)...)
		case f.Kind() == reflect.Bool:
			out = append(out, uint64(map[bool]int{false: 0, true: 1}[f.Bool()]))
		case f.Kind() == reflect.String:
			out = append(out, f.String())
		case f.Kind() == reflect.Slice:
			out = append(out, string(f.Bytes()))
		default:
			out = append(out, f.Uint())
		}
	}
	return out
}

// TestMessagesMatchFields checks that every message travels as Fields
// describes it (its struct's fields, in order, each of its kind), and
// that Decode reads what Encode wrote.
func TestMessagesMatchFields(t *testing.T) {
	for name, m := range allBodies() {
		t.Run(name, func(t *testing.T) {
			m := filled(m, len(name))
			var e Enc
			e.Msg(m)
			fields := Fields(m)
			got := wireValues(t, fields, e.B)
			if want := structValues(reflect.ValueOf(m).Elem()); !reflect.DeepEqual(got, want) {
				t.Fatalf("on the wire %v, fields %v: want %v", got, fields, want)
			}
			back := newMsg(m)
			if err := Decode(e.B, back); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(back, m) {
				t.Fatalf("round trip: %+v, want %+v", back, m)
			}
		})
	}
}

func TestOpsTable(t *testing.T) {
	if len(Ops) != int(opMax)-1 {
		t.Fatalf("%d ops described, want %d", len(Ops), opMax-1)
	}
	for i, op := range Ops {
		if op.Op != uint16(i+1) {
			t.Errorf("Ops[%d] is op %d", i, op.Op)
		}
		if got, ok := Lookup(op.Op); !ok || got.Name != op.Name {
			t.Errorf("Lookup(%d) = %v, %v", op.Op, got.Name, ok)
		}
		if op.RequestFDs > MaxFDs || op.ReplyFDs > MaxFDs {
			t.Errorf("%s carries more than %d descriptors", op.Name, MaxFDs)
		}
	}
	for _, op := range []uint16{0, opMax, OpEvent} {
		if _, ok := NewRequest(op); ok {
			t.Errorf("NewRequest(%d) exists", op)
		}
	}
	if OpName(OpQueryQP|ReplyBit) != "QueryQP" || OpName(999) != "op 999" {
		t.Errorf("OpName: %q %q", OpName(OpQueryQP|ReplyBit), OpName(999))
	}
}

// TestSamplesRoundTrip decodes every golden message from its packet.
func TestSamplesRoundTrip(t *testing.T) {
	for _, s := range samples() {
		h, body, err := ParseHeader(s.packet(), false)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		var got Msg
		switch {
		case s.op == OpEvent:
			var kind uint32
			kind, got, err = DecodeEvent(body)
			if kind != s.kind {
				t.Errorf("%s: kind %d", s.name, kind)
			}
		case s.st != nil:
			var st Status
			d := &Dec{B: body}
			err = st.Decode(d)
			if err == nil && !reflect.DeepEqual(&st, s.st) {
				t.Errorf("%s: status %+v, want %+v", s.name, st, *s.st)
			}
			if err == nil && s.m != nil {
				got = newMsg(s.m)
				err = d.Msg(got)
			}
		default:
			got, _ = NewRequest(h.Op)
			err = Decode(body, got)
		}
		if err != nil {
			t.Errorf("%s: %v", s.name, err)
		} else if s.m != nil && !reflect.DeepEqual(got, s.m) {
			t.Errorf("%s: %+v, want %+v", s.name, got, s.m)
		}
	}
}

// TestDecodeRejects checks that every decoder refuses a truncated body and
// one with a byte too many, with ErrBadMessage.
func TestDecodeRejects(t *testing.T) {
	for name, m := range allBodies() {
		m := filled(m, 3)
		var e Enc
		e.Msg(m)
		for n := range len(e.B) {
			if err := Decode(e.B[:n], newMsg(m)); !errors.Is(err, ErrBadMessage) {
				t.Errorf("%s cut to %d of %d bytes: %v", name, n, len(e.B), err)
			}
		}
		if err := Decode(append(e.B, 0), newMsg(m)); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s with a trailing byte: %v", name, err)
		}
	}
	var e Enc
	e.U16(MaxBytes + 1)
	e.B = append(e.B, make([]byte, MaxBytes+1)...)
	if err := Decode(e.B, &DeviceRemoved{}); !errors.Is(err, ErrBadMessage) {
		t.Errorf("a field of %d bytes: %v", MaxBytes+1, err)
	}
	bad := &Dec{B: []byte{9, 15: 0, 18: 0}}
	if bad.AddrPort(); !errors.Is(bad.Err, ErrBadMessage) {
		t.Errorf("address family 9: %v", bad.Err)
	}
	if _, _, err := DecodeEvent([]byte{9, 0, 0, 0}); !errors.Is(err, ErrBadMessage) {
		t.Errorf("event kind 9: %v", err)
	}
	if _, m, err := DecodeEvent([]byte{EvQP, 0, 0, 0, 1}); m != nil || !errors.Is(err, ErrBadMessage) {
		t.Errorf("a truncated QP event: %v, %v", m, err)
	}
}

func TestStatus(t *testing.T) {
	if got := DetailErrno(ErrnoDetail(111)); got != 111 {
		t.Errorf("errno 111 comes back as %d", got)
	}
	for _, st := range []Status{{}, {Code: StBusy, Msg: "busy"}, {Code: StRejected, Msg: "", Detail: []byte{1}}} {
		var e Enc
		st.Encode(&e)
		var got Status
		if err := got.Decode(&Dec{B: e.B}); err != nil || !reflect.DeepEqual(got, st) {
			t.Errorf("%+v: decoded %+v, %v", st, got, err)
		}
	}
}

// seeds adds every golden message's body to f, after a u16 op.
func seeds(f *testing.F, replies bool) {
	for _, s := range samples() {
		if (s.st != nil) != replies || s.op == OpEvent {
			continue
		}
		_, body, _ := ParseHeader(s.packet(), false)
		f.Add(binary.LittleEndian.AppendUint16(nil, s.op), body)
	}
}

// decoded checks a decoder's result: an error is ErrBadMessage; a message
// decoded encodes to bytes that decode to it again.
func decoded(t *testing.T, m Msg, err error) {
	if err != nil {
		if !errors.Is(err, ErrBadMessage) {
			t.Fatalf("error %v is not ErrBadMessage", err)
		}
		return
	}
	var e Enc
	e.Msg(m)
	again := newMsg(m)
	if err := Decode(e.B, again); err != nil || !reflect.DeepEqual(again, m) {
		t.Fatalf("%T %+v: re-encoded, decodes to %+v, %v", m, m, again, err)
	}
}

// fuzzOp is the op a fuzz input's first bytes name.
func fuzzOp(op []byte) (OpInfo, bool) {
	if len(op) < 2 {
		return OpInfo{}, false
	}
	return Lookup(binary.LittleEndian.Uint16(op))
}

func FuzzDecodeRequest(f *testing.F) {
	seeds(f, false)
	f.Fuzz(func(t *testing.T, op []byte, body []byte) {
		if in, ok := fuzzOp(op); ok {
			m := newMsg(in.Request)
			decoded(t, m, Decode(body, m))
		}
	})
}

func FuzzDecodeReply(f *testing.F) {
	seeds(f, true)
	f.Fuzz(func(t *testing.T, op []byte, body []byte) {
		in, ok := fuzzOp(op)
		if !ok || in.Reply == nil {
			return
		}
		var st Status
		d := &Dec{B: body}
		if err := st.Decode(d); err != nil || st.Code != StOK {
			return
		}
		m := newMsg(in.Reply)
		decoded(t, m, d.Msg(m))
	})
}

func FuzzDecodeEvent(f *testing.F) {
	for _, s := range samples() {
		if s.op == OpEvent {
			_, body, _ := ParseHeader(s.packet(), false)
			f.Add(body)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		_, m, err := DecodeEvent(body)
		decoded(t, m, err)
	})
}

func FuzzDecodeStatus(f *testing.F) {
	seeds(f, true)
	f.Fuzz(func(t *testing.T, _ []byte, body []byte) {
		var st Status
		if err := st.Decode(&Dec{B: body}); err != nil || st.Code == StOK {
			return
		}
		var e Enc
		st.Encode(&e)
		var again Status
		if err := again.Decode(&Dec{B: e.B}); err != nil || !reflect.DeepEqual(again, st) {
			t.Fatalf("%+v: re-encoded, decodes to %+v, %v", st, again, err)
		}
		DetailErrno(st.Detail)
	})
}

func FuzzParseHeader(f *testing.F) {
	for _, s := range samples() {
		f.Add(s.packet())
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		h, body, err := ParseHeader(p, false)
		if err != nil {
			return
		}
		if int(h.Len) != len(p) || len(body) != len(p)-MsgHeaderLen || h.NFDs > MaxFDs {
			t.Fatalf("accepted %x as %+v", p, h)
		}
	})
}
