package perftest

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestNormalizeDefaults: perftest's defaults per test (init_perftest_params,
// force_dependecies).
func TestNormalizeDefaults(t *testing.T) {
	attr := NominalDeviceAttr()
	cases := []struct {
		in                                 Config
		size, iters, tx, rx, inline, reads int
		cqMod                              int
	}{
		{Config{Verb: Write, Inline: -1}, 65536, 5000, 128, 1, 0, 1, 1},
		{Config{Verb: Read, Inline: -1}, 65536, 1000, 128, 1, 0, 128, 1},
		{Config{Verb: Send, Inline: -1}, 65536, 1000, 128, 512, 0, 1, 1},
		{Config{Verb: Send, Inline: -1, Size: 4096}, 4096, 1000, 128, 512, 0, 1, 100},
		{Config{Verb: Send, Inline: -1, Iters: 100}, 65536, 100, 100, 100, 0, 1, 1},
		{Config{Verb: Write, Latency: true, Inline: -1}, 2, 1000, 1, 1, 220, 1, 1},
		{Config{Verb: Send, Latency: true, Inline: -1}, 2, 1000, 1, 512, 236, 1, 1},
		{Config{Verb: Read, Latency: true, Inline: -1, OutReads: 4}, 2, 1000, 1, 1, 0, 4, 1},
		{Config{Verb: Write, All: true, Inline: -1}, 1 << 23, 5000, 128, 1, 0, 1, 100},
		{Config{Verb: Write, Duration: 4 * time.Second, Inline: 0}, 65536, 0, 128, 1, 0, 1, 1},
		{Config{Verb: Atomic, Inline: -1}, 8, 1000, 128, 1, 0, 128, 100},
		{Config{Verb: Atomic, AtomicType: CmpAndSwap, Size: 8, Inline: -1, OutReads: 16}, 8, 1000, 128, 1, 0, 16, 100},
	}
	for _, c := range cases {
		got, err := c.in.Normalize(attr)
		if err != nil {
			t.Errorf("%+v: %v", c.in, err)
			continue
		}
		if got.Size != c.size || got.Iters != c.iters || got.TxDepth != c.tx || got.RxDepth != c.rx ||
			got.Inline != c.inline || got.OutReads != c.reads || got.cqMod() != c.cqMod || got.QPs != 1 {
			t.Errorf("%+v:\n got size %d iters %d tx %d rx %d inline %d reads %d cqmod %d qps %d\nwant size %d iters %d tx %d rx %d inline %d reads %d cqmod %d",
				c.in, got.Size, got.Iters, got.TxDepth, got.RxDepth, got.Inline, got.OutReads, got.cqMod(), got.QPs,
				c.size, c.iters, c.tx, c.rx, c.inline, c.reads, c.cqMod)
		}
	}
	c, _ := Config{Verb: Write, All: true}.Normalize(attr)
	if s := c.sizes(); len(s) != 23 || s[0] != 2 || s[22] != 1<<23 {
		t.Errorf("-a sizes %v", s)
	}
	if c, _ := (Config{Verb: Write, Duration: 8 * time.Second}).Normalize(attr); c.margin() != 2*time.Second {
		t.Errorf("margin of -D 8: %v, want 2s", c.margin())
	}
	if c, _ := (Config{Verb: Write, Duration: 3 * time.Second}).Normalize(attr); c.margin() != 0 {
		t.Errorf("margin of -D 3: %v, want 0 (a quarter, in whole seconds)", c.margin())
	}
}

// TestNormalizeErrors: what perftest refuses is refused, with a message
// that names the parameter.
func TestNormalizeErrors(t *testing.T) {
	attr := NominalDeviceAttr()
	cases := []struct {
		in   Config
		want string
	}{
		{Config{Verb: Write, Latency: true, QPs: 2}, "latency tests run on one queue pair"},
		{Config{Verb: Write, Latency: true, Bidirectional: true}, "--bidirectional is only available in bandwidth tests"},
		{Config{Verb: Write, Size: -1}, "size -1"},
		{Config{Verb: Write, Size: 8, All: true}, "--size and --all"},
		{Config{Verb: Write, Iters: 4}, "iterations 4"},
		{Config{Verb: Write, Iters: 100, Duration: time.Second}, "--iters and --duration"},
		{Config{Verb: Write, All: true, Duration: time.Second}, "--duration does not run on all sizes"},
		{Config{Verb: Write, Duration: 1500 * time.Millisecond}, "whole seconds"},
		{Config{Verb: Write, TxDepth: 20000}, "tx depth 20000"},
		{Config{Verb: Write, RxDepth: 10}, "--rx-depth applies to send and write --imm tests only"},
		{Config{Verb: Send, RxDepth: 20000}, "rx depth 20000"},
		{Config{Verb: Send, RxDepth: 2}, "at least 3"},
		{Config{Verb: Read, Inline: 16}, "--inline_size does not apply to RDMA Read"},
		{Config{Verb: Atomic, Inline: 16}, "--inline_size does not apply to atomic tests"},
		{Config{Verb: Atomic, Size: 64}, "atomic tests move 8 bytes"},
		{Config{Verb: Atomic, All: true}, "atomic tests move 8 bytes"},
		{Config{Verb: Atomic, Latency: true}, "atomic tests measure bandwidth only"},
		{Config{Verb: Write, AtomicType: CmpAndSwap}, "--atomic_type applies to atomic tests only"},
		{Config{Verb: Write, Inline: 4096}, "inline size 4096: the device allows 256"},
		{Config{Verb: Read, OutReads: 1000}, "outstanding reads 1000"},
		{Config{Verb: Write, OutReads: 4}, "--outs applies to RDMA Read and atomic tests only"},
		{Config{Verb: Write, QPs: 20000}, "queue pairs 20000"},
		{Config{Verb: Verb(9)}, "verb 9"},
		{Config{Verb: Write, Spin: true}, "--spin applies to RDMA Write latency tests only"},
		{Config{Verb: Read, Latency: true, Spin: true}, "--spin applies to RDMA Write latency tests only"},
		{Config{Verb: Write, Latency: true, Imm: true, Spin: true}, "--spin applies to RDMA Write latency tests only"},
	}
	for _, c := range cases {
		_, err := c.in.Normalize(attr)
		if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want ErrConfig %q", c.in, err, c.want)
		}
	}
}

func TestParseVerb(t *testing.T) {
	for s, v := range map[string]Verb{"write": Write, "read": Read, "send": Send, "atomic": Atomic} {
		if got, err := ParseVerb(s); err != nil || got != v {
			t.Errorf("ParseVerb(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseVerb("swap"); err == nil || !strings.Contains(err.Error(), "want write, read, send or atomic") {
		t.Errorf("ParseVerb(swap): %v", err)
	}
	for s, a := range map[string]AtomicType{"FETCH_AND_ADD": FetchAndAdd, "CMP_AND_SWAP": CmpAndSwap} {
		if got, err := ParseAtomicType(s); err != nil || got != a || got.String() != s {
			t.Errorf("ParseAtomicType(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseAtomicType("SWAP"); !errors.Is(err, ErrConfig) {
		t.Errorf("ParseAtomicType(SWAP): %v", err)
	}
}
