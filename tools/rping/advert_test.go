package rping

import (
	"bytes"
	"testing"
)

func TestAdvertGolden(t *testing.T) {
	tests := []struct {
		name string
		a    Advert
		wire []byte
	}{
		{"fields", Advert{Addr: 0x0102030405060708, RKey: 0x0a0b0c0d, Size: 64},
			[]byte{1, 2, 3, 4, 5, 6, 7, 8, 0x0a, 0x0b, 0x0c, 0x0d, 0, 0, 0, 0x40}},
		// An x86-64 heap address and siw-style STag, 64 KiB - 1 bytes.
		{"siw-like", Advert{Addr: 0x00007f3a12345000, RKey: 0x00000301, Size: 65535},
			[]byte{0, 0, 0x7f, 0x3a, 0x12, 0x34, 0x50, 0, 0, 0, 3, 1, 0, 0, 0xff, 0xff}},
		{"zero (the server's go-ahead)", Advert{}, make([]byte, 16)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.a.Append(nil); !bytes.Equal(got, tt.wire) {
				t.Fatalf("Append = % x, want % x", got, tt.wire)
			}
			b := make([]byte, AdvertLen)
			tt.a.Put(b)
			if !bytes.Equal(b, tt.wire) {
				t.Fatalf("Put = % x, want % x", b, tt.wire)
			}
			got, err := ParseAdvert(tt.wire)
			if err != nil || got != tt.a {
				t.Fatalf("ParseAdvert = %+v, %v; want %+v", got, err, tt.a)
			}
		})
	}
}

func TestParseAdvertLength(t *testing.T) {
	for _, n := range []int{0, 1, 15, 17, 64} {
		if _, err := ParseAdvert(make([]byte, n)); err == nil {
			t.Errorf("ParseAdvert of %d bytes: no error", n)
		}
	}
}

func FuzzParseAdvert(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 0x0a, 0x0b, 0x0c, 0x0d, 0, 0, 0, 0x40})
	f.Add(make([]byte, 16))
	f.Add([]byte{0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseAdvert(b)
		if err != nil {
			if len(b) == AdvertLen {
				t.Fatalf("ParseAdvert(% x): %v", b, err)
			}
			return
		}
		if len(b) != AdvertLen {
			t.Fatalf("ParseAdvert accepted %d bytes", len(b))
		}
		if got := a.Append(nil); !bytes.Equal(got, b) {
			t.Fatalf("round trip: % x -> %+v -> % x", b, a, got)
		}
	})
}

func TestFillGolden(t *testing.T) {
	tests := []struct {
		ping, size int
		want       string
	}{
		// rping's well-known first line: 64 bytes, the last one the NUL.
		{0, 64, "rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr\x00"},
		{1, 64, "rdma-ping-1: BCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrs\x00"},
		// Each ping starts one character on; after 'z' (ping 57) comes 'A'.
		{57, 32, "rdma-ping-57: zABCDEFGHIJKLMNOP\x00"},
		{58, 32, "rdma-ping-58: ABCDEFGHIJKLMNOPQ\x00"},
		// Within a ping the rotation wraps from 'z' to 'A' too.
		{0, 80, "rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyzABCDEFGH\x00"},
		// The minimum size holds the longest number: INT_MAX % 58 = 7 -> 'H'.
		{2147483647, MinSize, "rdma-ping-2147483647: HIJ\x00"},
	}
	for _, tt := range tests {
		b := make([]byte, tt.size)
		Fill(b, tt.ping)
		if string(b) != tt.want {
			t.Errorf("Fill(ping %d, %d bytes) = %q, want %q", tt.ping, tt.size, b, tt.want)
		}
	}
}
