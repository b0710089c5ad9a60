package tun_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"testing"

	"github.com/siwtun/siwtun/tun"
	"github.com/siwtun/siwtun/tun/tuntest"
)

// batchDev is a Device with BatchSize > 1 whose Read returns the queued
// batches one per call.
type batchDev struct {
	batches [][][]byte
	readErr error // returned once the batches are used up
	written [][]byte
	mtu     int
	mtuErr  error
	closed  bool
}

func (d *batchDev) File() *os.File { return nil }
func (d *batchDev) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if len(d.batches) == 0 {
		return 0, d.readErr
	}
	b := d.batches[0]
	d.batches = d.batches[1:]
	for i, p := range b {
		sizes[i] = copy(bufs[i][offset:], p)
	}
	return len(b), nil
}
func (d *batchDev) Write(bufs [][]byte, offset int) (int, error) {
	for _, b := range bufs {
		d.written = append(d.written, bytes.Clone(b[offset:]))
	}
	return len(bufs), nil
}
func (d *batchDev) MTU() (int, error)        { return d.mtu, d.mtuErr }
func (d *batchDev) Name() (string, error)    { return "batch0", nil }
func (d *batchDev) Events() <-chan tun.Event { return nil }
func (d *batchDev) Close() error             { d.closed = true; return nil }
func (d *batchDev) BatchSize() int           { return 4 }
func (d *batchDev) String() string           { return "batchDev" }
func pkt(n int, fill byte) []byte            { return bytes.Repeat([]byte{fill}, n) }
func readAll(p *tun.PacketDevice, bufLen, n int) ([][]byte, error) {
	var out [][]byte
	for range n {
		b := make([]byte, bufLen)
		m, err := p.ReadPacket(b)
		if err != nil {
			return out, err
		}
		out = append(out, b[:m])
	}
	return out, nil
}

func TestPacketDeviceChannelTUN(t *testing.T) {
	tests := []struct {
		name    string
		pkts    [][]byte
		bufLen  int
		wantErr error
	}{
		{name: "one small", pkts: [][]byte{pkt(20, 0x45)}, bufLen: 1500},
		{name: "full MTU", pkts: [][]byte{pkt(1500, 0x45)}, bufLen: 1500},
		{name: "jumbo", pkts: [][]byte{pkt(9000, 0x60)}, bufLen: 9000},
		{name: "several", pkts: [][]byte{pkt(40, 0x45), pkt(1280, 0x60), pkt(60, 0x45)}, bufLen: 1500},
		{name: "too long", pkts: [][]byte{pkt(1501, 0x45)}, bufLen: 1500, wantErr: io.ErrShortBuffer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tuntest.NewChannelTUN()
			p := tun.NewPacketDevice(c)
			defer p.Close()
			for _, b := range tt.pkts {
				c.Outbound <- b
			}
			got, err := readAll(p, tt.bufLen, len(tt.pkts))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ReadPacket error = %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr != nil {
				return
			}
			for i := range tt.pkts {
				if !bytes.Equal(got[i], tt.pkts[i]) {
					t.Errorf("packet %d: got %d bytes, want %d", i, len(got[i]), len(tt.pkts[i]))
				}
			}
			for i, b := range tt.pkts {
				if err := p.WritePacket(b); err != nil {
					t.Fatalf("WritePacket %d: %v", i, err)
				}
				if w := <-c.Inbound; !bytes.Equal(w, b) {
					t.Errorf("written packet %d differs", i)
				}
			}
		})
	}
}

func TestPacketDeviceBatch(t *testing.T) {
	tests := []struct {
		name    string
		batches [][][]byte
		bufLen  int
		want    [][]byte
		wantErr error
	}{
		{
			name:    "one batch of three",
			batches: [][][]byte{{pkt(10, 1), pkt(20, 2), pkt(30, 3)}},
			bufLen:  100,
			want:    [][]byte{pkt(10, 1), pkt(20, 2), pkt(30, 3)},
			wantErr: os.ErrClosed,
		},
		{
			name:    "empty batch is skipped",
			batches: [][][]byte{{pkt(10, 1)}, {}, {pkt(20, 2), pkt(30, 3), pkt(40, 4), pkt(50, 5)}},
			bufLen:  100,
			want:    [][]byte{pkt(10, 1), pkt(20, 2), pkt(30, 3), pkt(40, 4), pkt(50, 5)},
			wantErr: os.ErrClosed,
		},
		{
			name:    "packet longer than the buffer",
			batches: [][][]byte{{pkt(10, 1), pkt(200, 2)}},
			bufLen:  100,
			want:    [][]byte{pkt(10, 1)},
			wantErr: io.ErrShortBuffer,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &batchDev{batches: tt.batches, readErr: os.ErrClosed}
			p := tun.NewPacketDevice(d)
			got, err := readAll(p, tt.bufLen, len(tt.want)+1)
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("final error = %v, want %v", err, tt.wantErr)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("read %d packets, want %d", len(got), len(tt.want))
			}
			for i := range got {
				if !bytes.Equal(got[i], tt.want[i]) {
					t.Errorf("packet %d = %x, want %x", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestPacketDeviceMTUAndClose(t *testing.T) {
	tests := []struct {
		name   string
		mtu    int
		mtuErr error
		want   int
	}{
		{name: "jumbo", mtu: 9000, want: 9000},
		{name: "error", mtu: 1500, mtuErr: errors.New("gone"), want: 0},
		{name: "zero", mtu: 0, want: 0},
		{name: "negative", mtu: -1, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &batchDev{mtu: tt.mtu, mtuErr: tt.mtuErr}
			p := tun.NewPacketDevice(d)
			if got := p.MTU(); got != tt.want {
				t.Errorf("MTU = %d, want %d", got, tt.want)
			}
			if err := p.WritePacket([]byte{0x45, 7}); err != nil || len(d.written) != 1 {
				t.Errorf("WritePacket: %v, %d written", err, len(d.written))
			}
			if p.Device() != tun.Device(d) {
				t.Error("Device() is not the wrapped device")
			}
			if err := p.Close(); err != nil || !d.closed {
				t.Errorf("Close: %v, closed %v", err, d.closed)
			}
		})
	}
}

func TestPacketDeviceUnblocksOnClose(t *testing.T) {
	c := tuntest.NewChannelTUN()
	p := tun.NewPacketDevice(c)
	done := make(chan error, 1)
	go func() {
		_, err := p.ReadPacket(make([]byte, 1500))
		done <- err
	}()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, os.ErrClosed) {
		t.Errorf("ReadPacket after Close = %v, want os.ErrClosed", err)
	}
	if err := p.WritePacket([]byte{0x45}); !errors.Is(err, os.ErrClosed) {
		t.Errorf("WritePacket after Close = %v, want os.ErrClosed", err)
	}
}

// TestPacketDeviceNoAllocs is the CI gate behind BenchmarkPacketDevice: a
// read and a write of one packet over ChannelTUN allocate nothing.
func TestPacketDeviceNoAllocs(t *testing.T) {
	c := tuntest.NewChannelTUN()
	p := tun.NewPacketDevice(c)
	defer p.Close()
	in, buf := pkt(1500, 0x45), make([]byte, 1500)
	round := func() {
		c.Outbound <- in
		if _, err := p.ReadPacket(buf); err != nil {
			t.Fatal(err)
		}
		if err := p.WritePacket(buf); err != nil {
			t.Fatal(err)
		}
		c.Recycle(<-c.Inbound)
	}
	round() // warm the recycled buffer
	if a := testing.AllocsPerRun(1000, round); a != 0 {
		t.Errorf("ReadPacket+WritePacket: %v allocs per packet, want 0", a)
	}
}

// BenchmarkPacketDevice measures one ReadPacket and one WritePacket of an
// MTU-sized packet over ChannelTUN (0 allocs/op).
func BenchmarkPacketDevice(b *testing.B) {
	for _, size := range []int{1500, 9000} {
		b.Run(fmt.Sprintf("mtu%d", size), func(b *testing.B) {
			c := tuntest.NewChannelTUN()
			p := tun.NewPacketDevice(c)
			defer p.Close()
			in, buf := pkt(size, 0x45), make([]byte, size)
			b.ReportAllocs()
			b.SetBytes(int64(2 * size))
			for b.Loop() {
				c.Outbound <- in
				if _, err := p.ReadPacket(buf); err != nil {
					b.Fatal(err)
				}
				if err := p.WritePacket(buf); err != nil {
					b.Fatal(err)
				}
				c.Recycle(<-c.Inbound)
			}
		})
	}
}
