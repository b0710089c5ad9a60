package tuntest

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/siwtun/siwtun/tun"
)

func TestChannelTUNRead(t *testing.T) {
	tests := []struct {
		name    string
		pkt     []byte
		bufLen  int
		offset  int
		want    []byte
		wantErr error
	}{
		{name: "fits", pkt: []byte{0x45, 1, 2, 3}, bufLen: 16, want: []byte{0x45, 1, 2, 3}},
		{name: "exact", pkt: []byte{0x45, 1, 2, 3}, bufLen: 4, want: []byte{0x45, 1, 2, 3}},
		{name: "offset", pkt: []byte{0x60, 9}, bufLen: 12, offset: 10, want: []byte{0x60, 9}},
		{name: "empty", pkt: []byte{}, bufLen: 4, want: []byte{}},
		{name: "too long", pkt: make([]byte, 10), bufLen: 9, wantErr: io.ErrShortBuffer},
		{name: "too long after offset", pkt: make([]byte, 10), bufLen: 12, offset: 3, wantErr: io.ErrShortBuffer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewChannelTUN()
			defer c.Close()
			c.Outbound <- tt.pkt
			bufs := [][]byte{make([]byte, tt.bufLen)}
			sizes := make([]int, 1)
			n, err := c.Read(bufs, sizes, tt.offset)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || n != 0 {
					t.Fatalf("Read = %d, %v; want 0, %v", n, err, tt.wantErr)
				}
				return
			}
			if err != nil || n != 1 {
				t.Fatalf("Read = %d, %v; want 1, nil", n, err)
			}
			if got := bufs[0][tt.offset : tt.offset+sizes[0]]; !bytes.Equal(got, tt.want) {
				t.Errorf("packet = %x, want %x", got, tt.want)
			}
		})
	}
}

func TestChannelTUNWrite(t *testing.T) {
	c := NewChannelTUN()
	defer c.Close()
	bufs := [][]byte{{0, 0, 0x45, 1}, {0, 0, 0x60, 2, 3}}
	n, err := c.Write(bufs, 2)
	if err != nil || n != 2 {
		t.Fatalf("Write = %d, %v; want 2, nil", n, err)
	}
	for i, want := range [][]byte{{0x45, 1}, {0x60, 2, 3}} {
		got := <-c.Inbound
		if !bytes.Equal(got, want) {
			t.Errorf("packet %d = %x, want %x", i, got, want)
		}
		c.Recycle(got)
	}
	// The caller's buffers are not retained: change them and write again
	// into recycled buffers.
	bufs[0][2] = 0x46
	if _, err := c.Write(bufs[:1], 2); err != nil {
		t.Fatal(err)
	}
	if got := <-c.Inbound; !bytes.Equal(got, []byte{0x46, 1}) {
		t.Errorf("packet = %x, want 4601", got)
	}
	if _, err := c.Write([][]byte{{1}}, 2); err == nil {
		t.Error("Write with offset past the buffer: no error")
	}
}

func TestChannelTUNClose(t *testing.T) {
	c := NewChannelTUN()
	readErr := make(chan error, 1)
	go func() {
		_, err := c.Read([][]byte{make([]byte, 64)}, make([]int, 1), 0)
		readErr <- err
	}()
	// Fill Inbound so the next Write blocks until Close.
	for range QueueLen {
		if _, err := c.Write([][]byte{{0x45}}, 0); err != nil {
			t.Fatal(err)
		}
	}
	writeErr := make(chan error, 1)
	go func() {
		_, err := c.Write([][]byte{{0x45}}, 0)
		writeErr <- err
	}()
	time.Sleep(10 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for name, ch := range map[string]chan error{"Read": readErr, "Write": writeErr} {
		select {
		case err := <-ch:
			if !errors.Is(err, os.ErrClosed) {
				t.Errorf("%s after Close: %v, want os.ErrClosed", name, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s still blocked after Close", name)
		}
	}
	c.Outbound <- []byte{0x45}
	if _, err := c.Read([][]byte{make([]byte, 64)}, make([]int, 1), 0); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Read of a queued packet after Close: %v, want os.ErrClosed", err)
	}
}

func TestChannelTUNOutboundClosed(t *testing.T) {
	c := NewChannelTUN()
	defer c.Close()
	close(c.Outbound)
	if _, err := c.Read([][]byte{make([]byte, 64)}, make([]int, 1), 0); !errors.Is(err, io.EOF) {
		t.Errorf("Read = %v, want io.EOF", err)
	}
}

func TestChannelTUNEvents(t *testing.T) {
	c := NewChannelTUN()
	if e := <-c.Events(); e != tun.EventUp {
		t.Errorf("first event = %v, want %v", e, tun.EventUp)
	}
	c.SetMTU(9000)
	if e := <-c.Events(); e != tun.EventMTUUpdate {
		t.Errorf("event = %v, want %v", e, tun.EventMTUUpdate)
	}
	if mtu, err := c.MTU(); err != nil || mtu != 9000 {
		t.Errorf("MTU = %d, %v; want 9000", mtu, err)
	}
	for range 100 { // never blocks on a full channel
		c.SetMTU(1500)
	}
	c.Close()
	c.SetMTU(1280) // no panic after Close
	n := 0
	for range c.Events() {
		n++
	}
	if n == 0 {
		t.Error("no MTU events queued")
	}
	if name, _ := c.Name(); name != "tuntest0" || c.BatchSize() != 1 || c.File() != nil {
		t.Errorf("Name, BatchSize, File = %q, %d, %v", name, c.BatchSize(), c.File())
	}
}
