package netstack

import (
	"fmt"
	"sync"
	"testing"
)

// TestReadPayload checks Segment.ReadPayload in a HeaderHook, both
// directions, against the bytes written: every data segment's payload read
// in two pieces at an offset matches the sent pattern at its sequence number.
func TestReadPayload(t *testing.T) {
	for _, dev := range []bool{false, true} {
		t.Run(fmt.Sprintf("device=%v", dev), func(t *testing.T) {
			var mu sync.Mutex
			iss := map[Direction]uint32{}
			segs, bad := 0, 0
			hook := HeaderHookFunc(func(s *Segment) {
				mu.Lock()
				defer mu.Unlock()
				if s.Flags&FlagSYN != 0 && s.Dir == Outbound {
					iss[Outbound] = s.Seq
				}
				if s.Len == 0 || s.Dir != Outbound {
					return
				}
				buf := make([]byte, s.Len+8)
				cut := s.Len / 3
				n := s.ReadPayload(buf[:cut], 0)
				n += s.ReadPayload(buf[n:], n)
				if n != s.Len || s.ReadPayload(buf, s.Len) != 0 {
					bad++
					return
				}
				off := int64(s.Seq - iss[Outbound] - 1)
				for i := 0; i < n; i++ {
					if buf[i] != pattern(off+int64(i)) {
						bad++
						return
					}
				}
				segs++
			})
			o := pairOpts{mtu: 1500, hookA: hook}
			if dev {
				da, db := devicePair(1500)
				o.linkA, o.linkB = NewDeviceLink(da), NewDeviceLink(db)
			}
			a, b := newPair(t, o)
			ca, cb := connect(t, a, b, addrB4.Addr())
			bulk(t, ca, cb, 4<<20)
			mu.Lock()
			defer mu.Unlock()
			if segs < 1000 || bad != 0 {
				t.Fatalf("%d segments matched, %d did not", segs, bad)
			}
		})
	}
}
