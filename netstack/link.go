package netstack

import (
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/siwtun/siwtun/anatomy"
)

// Link is the packet link a Stack's single NIC runs on. It is opaque: build
// one with Pipe or NewDeviceLink and pass it to New. A Link belongs to at
// most one Stack; Stack.Close closes it.
type Link struct {
	ep    stack.LinkEndpoint
	mtu   int
	inUse atomic.Bool
	// batch: the link writes several packets per call (a TUN with
	// segmentation offload coalesces them); the NIC then queues packets
	// so that bursts reach WritePackets together.
	batch bool

	stats    func() LinkStats
	shutdown func() // idempotent; stops the link's goroutines
	// splitSuper, when set, makes a device link read wire segments rather
	// than whole super-segments and write only wire segments (Impair needs
	// segments to impair).
	splitSuper func()
	// gso, when set, reports whether the link takes super-segments for
	// the kernel to cut (segmentation offload on the way out).
	gso func() bool
	// hops is the recorder of hop stamps the link's device stamps into;
	// the Stack on the link creates it when the link has none.
	hops      *anatomy.Recorder
	closeOnce sync.Once
}

// MTU returns the link MTU in bytes (the largest IP packet).
func (l *Link) MTU() int { return l.mtu }

// Stats returns a snapshot of the link's counters.
func (l *Link) Stats() LinkStats { return l.stats() }

// Close stops the link's goroutines and drops all further traffic. Stack.Close
// calls it; call it directly only for a Link that was never passed to New.
// It is idempotent and always returns nil.
func (l *Link) Close() error {
	l.closeOnce.Do(l.shutdown)
	return nil
}

// LinkStats holds a link's counters, one set per direction.
type LinkStats struct {
	// Tx counts packets this link's stack sent. For a Pipe link these are
	// the packets subject to the impairments of the direction towards the
	// peer.
	Tx DirectionStats
	// Rx counts packets delivered to this link's stack. For a Pipe link this
	// is the peer's Tx direction.
	Rx DirectionStats
}

// DirectionStats are the counters of one link direction.
type DirectionStats struct {
	// Sent is the number of packets handed to the direction by the sending
	// stack (or read from the device, for a device link's Rx).
	Sent uint64
	// Delivered is the number of packets handed to the receiving side
	// (duplicates included; for a device link's Tx, packets written).
	Delivered uint64
	// Bytes is the number of IP bytes delivered.
	Bytes uint64
	// Dropped is the number of packets dropped by the Loss impairment.
	Dropped uint64
	// QueueFull is the number of packets dropped because the direction's
	// queue was full or the receiving side was closed.
	QueueFull uint64
	// Reordered is the number of packets held back and delivered after
	// their successor.
	Reordered uint64
	// Duplicated is the number of extra copies delivered.
	Duplicated uint64
	// Corrupted is the number of TCP data segments whose payload had a byte
	// flipped (with the TCP checksum fixed up).
	Corrupted uint64
	// Errors is the number of device read or write errors.
	Errors uint64
}

// dirCounters is the atomic form of DirectionStats.
type dirCounters struct {
	sent, delivered, bytes, dropped, queueFull    atomic.Uint64
	reordered, duplicated, corrupted, errorsCount atomic.Uint64
}

func (c *dirCounters) snapshot() DirectionStats {
	return DirectionStats{
		Sent:       c.sent.Load(),
		Delivered:  c.delivered.Load(),
		Bytes:      c.bytes.Load(),
		Dropped:    c.dropped.Load(),
		QueueFull:  c.queueFull.Load(),
		Reordered:  c.reordered.Load(),
		Duplicated: c.duplicated.Load(),
		Corrupted:  c.corrupted.Load(),
		Errors:     c.errorsCount.Load(),
	}
}
