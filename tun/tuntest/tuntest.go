// Package tuntest provides ChannelTUN, an in-memory tun.Device whose
// packets travel over Go channels, so code above package tun can be tested
// without root or /dev/net/tun. It mirrors wireguard-go's tun/tuntest.
package tuntest

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/siwtun/siwtun/tun"
)

// QueueLen is the capacity of a ChannelTUN's Inbound and Outbound channels.
const QueueLen = 64

// DefaultMTU is the MTU of a new ChannelTUN.
const DefaultMTU = 1500

// ChannelTUN is an in-memory tun.Device. The channels are named from the
// host's side of the TUN, as in wireguard-go: a packet the host sends out
// through the interface is put on Outbound and Read returns it; a packet
// Write delivers to the host arrives on Inbound.
//
// BatchSize is 1. Read and Write may run concurrently with each other and
// with Close.
type ChannelTUN struct {
	// Outbound carries packets to Read: send a packet here to have the
	// device's user read it. Read copies it, so the sender may reuse the
	// slice once Read has returned it; closing Outbound makes Read return
	// io.EOF.
	Outbound chan []byte
	// Inbound receives a copy of every packet passed to Write. A receiver
	// done with a packet may hand the slice back with Recycle so Write
	// reuses it instead of allocating.
	Inbound chan []byte

	name   string
	mtu    atomic.Int64
	free   chan []byte   // recycled packet buffers
	closed chan struct{} // closed by Close

	evMu     sync.Mutex // evMu guards events against a send after close
	events   chan tun.Event
	evClosed bool // guarded by evMu

	closeOnce sync.Once
}

var _ tun.Device = (*ChannelTUN)(nil)

// NewChannelTUN returns an open ChannelTUN named "tuntest0" with MTU
// DefaultMTU. Its Events channel starts with EventUp, as a freshly
// configured link would report.
func NewChannelTUN() *ChannelTUN {
	c := &ChannelTUN{
		Outbound: make(chan []byte, QueueLen),
		Inbound:  make(chan []byte, QueueLen),
		name:     "tuntest0",
		free:     make(chan []byte, QueueLen),
		closed:   make(chan struct{}),
		events:   make(chan tun.Event, 8),
	}
	c.mtu.Store(DefaultMTU)
	c.events <- tun.EventUp
	return c
}

// File returns nil: a ChannelTUN has no file descriptor.
func (c *ChannelTUN) File() *os.File { return nil }

// Read returns the next packet from Outbound in bufs[0][offset:]. A packet
// longer than that space is dropped with an io.ErrShortBuffer error.
func (c *ChannelTUN) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if len(bufs) == 0 || len(sizes) == 0 {
		return 0, errors.New("tuntest: read: no buffers")
	}
	if offset < 0 || offset > len(bufs[0]) {
		return 0, fmt.Errorf("tuntest: read: offset %d outside a %d-byte buffer", offset, len(bufs[0]))
	}
	select {
	case <-c.closed: // a closed device never reads, even with packets queued
		return 0, fmt.Errorf("tuntest: read: %w", os.ErrClosed)
	default:
	}
	select {
	case <-c.closed:
		return 0, fmt.Errorf("tuntest: read: %w", os.ErrClosed)
	case p, ok := <-c.Outbound:
		if !ok {
			return 0, io.EOF
		}
		dst := bufs[0][offset:]
		if len(p) > len(dst) {
			return 0, fmt.Errorf("tuntest: read: packet of %d bytes does not fit %d bytes: %w", len(p), len(dst), io.ErrShortBuffer)
		}
		sizes[0] = copy(dst, p)
		return 1, nil
	}
}

// Write puts a copy of each bufs[i][offset:] on Inbound, blocking while
// Inbound is full. It returns os.ErrClosed once the device is closed.
func (c *ChannelTUN) Write(bufs [][]byte, offset int) (int, error) {
	select {
	case <-c.closed: // a closed device never writes, even with room in Inbound
		return 0, fmt.Errorf("tuntest: write: %w", os.ErrClosed)
	default:
	}
	for i, b := range bufs {
		if offset < 0 || offset > len(b) {
			return i, fmt.Errorf("tuntest: write: offset %d outside a %d-byte buffer", offset, len(b))
		}
		var p []byte
		select {
		case p = <-c.free:
		default:
		}
		p = append(p[:0], b[offset:]...)
		select {
		case <-c.closed:
			return i, fmt.Errorf("tuntest: write: %w", os.ErrClosed)
		case c.Inbound <- p:
		}
	}
	return len(bufs), nil
}

// Recycle hands a packet received from Inbound back for Write to reuse.
// The caller must not use p afterwards. It never blocks: beyond QueueLen
// spare buffers, p is left to the garbage collector.
func (c *ChannelTUN) Recycle(p []byte) {
	select {
	case c.free <- p:
	default:
	}
}

// MTU returns the MTU set by NewChannelTUN or SetMTU.
func (c *ChannelTUN) MTU() (int, error) { return int(c.mtu.Load()), nil }

// SetMTU changes the MTU and reports EventMTUUpdate (dropped if the Events
// channel is full, or after Close).
func (c *ChannelTUN) SetMTU(mtu int) {
	c.mtu.Store(int64(mtu))
	c.evMu.Lock()
	defer c.evMu.Unlock()
	if c.evClosed {
		return
	}
	select {
	case c.events <- tun.EventMTUUpdate:
	default:
	}
}

// Name returns "tuntest0".
func (c *ChannelTUN) Name() (string, error) { return c.name, nil }

// Events returns the event channel; it is closed by Close.
func (c *ChannelTUN) Events() <-chan tun.Event { return c.events }

// BatchSize returns 1.
func (c *ChannelTUN) BatchSize() int { return 1 }

// Close unblocks Read and Write (which then return os.ErrClosed) and closes
// the Events channel. The Inbound and Outbound channels stay open.
func (c *ChannelTUN) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.evMu.Lock()
		c.evClosed = true
		close(c.events)
		c.evMu.Unlock()
	})
	return nil
}
