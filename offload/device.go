package offload

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/siwtun/siwtun/anatomy"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/verbs/ibv"
)

// Device is one software RNIC: a private TCP/IP stack, the memory regions
// and queue pairs on it, and its iWARP defaults.
type Device struct {
	cfg     Config
	stack   *netstack.Stack
	regions *Regions
	log     *slog.Logger

	mu        sync.Mutex
	qps       map[uint32]*QP
	nextQPN   uint32
	srqs      int // live SRQs, at most cfg.MaxQP
	listeners map[*Listener]struct{}
	retired   QPStats // counters of destroyed QPs
	closed    bool

	tap tap // segment tap and event fan-out (tap.go)
	// hops records the hop stamps of round trips (hops.go): the stack's.
	hops *anatomy.Recorder

	badRevLogged atomic.Bool // the first unsupported MPA revision was logged

	// writeBufs holds buffers of one TCP write of FPDUs (*[]byte of
	// capacity maxBatch), lent to a QP for a short write (fpduPayload):
	// an idle QP holds none.
	writeBufs sync.Pool
}

// NewDevice creates a device on stack with configuration cfg.
func NewDevice(stack *netstack.Stack, cfg Config) (*Device, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("device %s: %w", cfg.Name, err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Device{
		cfg: cfg, stack: stack, regions: NewRegions(cfg.MaxMR), log: log,
		qps: make(map[uint32]*QP), nextQPN: 1, listeners: make(map[*Listener]struct{}),
		hops: hopRecorder(stack),
	}
	d.writeBufs.New = func() any {
		b := make([]byte, 0, maxBatch)
		return &b
	}
	return d, nil
}

// Config returns the device's configuration.
func (d *Device) Config() Config { return d.cfg }

// Stack returns the device's TCP/IP stack.
func (d *Device) Stack() *netstack.Stack { return d.stack }

// Regions returns the device's memory-region table.
func (d *Device) Regions() *Regions { return d.regions }

func (d *Device) logf(format string, args ...any) {
	d.log.Debug(fmt.Sprintf(format, args...), "dev", d.cfg.Name)
}

// ErrDeviceClosed is returned by calls on a closed device.
var ErrDeviceClosed = errors.New("offload: device closed")

// CreateQP creates a queue pair in RESET in protection domain pd, completing
// into sendCQ and recvCQ.
func (d *Device) CreateQP(pd uint32, sendCQ, recvCQ ibv.CompletionQueue, attr QPAttr) (*QP, error) {
	if sendCQ == nil || recvCQ == nil {
		return nil, fmt.Errorf("create QP: %w: nil completion queue", ibv.ErrInvalidWR)
	}
	if attr.SRQ != nil {
		attr.MaxRecvWR = 1 // ignored: see below
	}
	if attr.MaxSendWR <= 0 || attr.MaxSendWR > ibv.MaxQPWR || attr.MaxRecvWR <= 0 || attr.MaxRecvWR > ibv.MaxQPWR {
		return nil, fmt.Errorf("create QP: queue depths %d/%d: want 1..%d", attr.MaxSendWR, attr.MaxRecvWR, ibv.MaxQPWR)
	}
	rqDepth := attr.MaxRecvWR
	if attr.SRQ != nil {
		if attr.SRQ.dev != d {
			return nil, fmt.Errorf("create QP: %w: SRQ of another device", ibv.ErrInvalidWR)
		}
		// The QP's receive queue holds the one receive its message in
		// progress took from the SRQ.
		rqDepth = 1
		if err := attr.SRQ.attach(); err != nil {
			return nil, err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	fail := func(err error) (*QP, error) {
		if attr.SRQ != nil {
			attr.SRQ.detach()
		}
		return nil, err
	}
	if d.closed {
		return fail(ErrDeviceClosed)
	}
	if len(d.qps) >= d.cfg.MaxQP {
		return fail(fmt.Errorf("create QP: device %s has its maximum of %d QPs", d.cfg.Name, d.cfg.MaxQP))
	}
	num := d.nextQPN
	for d.qps[num] != nil || num == 0 {
		num++
	}
	d.nextQPN = num + 1
	qp := &QP{
		dev: d, num: num, pd: pd, sendCQ: sendCQ, recvCQ: recvCQ, sigAll: attr.SignalAll, srq: attr.SRQ,
		state: ibv.QPReset, sq: make([]sendWQE, attr.MaxSendWR), rq: make([]recvWQE, rqDepth),
		events: make(chan ibv.Event, 32),
	}
	qp.txCond = sync.NewCond(&qp.mu)
	d.qps[num] = qp
	return qp, nil
}

// removeQP removes qp from the device and reports whether it was there
// (a second Destroy finds it gone).
func (d *Device) removeQP(qp *QP) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.qps[qp.num] == qp {
		delete(d.qps, qp.num)
		d.retired.add(&qp.stats)
		return true
	}
	return false
}

// QP returns the queue pair numbered num.
func (d *Device) QP(num uint32) (*QP, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	qp, ok := d.qps[num]
	return qp, ok
}

// QPs returns snapshots of every queue pair, by number.
func (d *Device) QPs() []ibv.Info {
	d.mu.Lock()
	list := slices.Collect(maps.Values(d.qps))
	d.mu.Unlock()
	out := make([]ibv.Info, 0, len(list))
	for _, qp := range list {
		out = append(out, qp.Info())
	}
	slices.SortFunc(out, func(a, b ibv.Info) int { return cmp.Compare(a.Num, b.Num) })
	return out
}

// Stats returns a snapshot of the device's counters: every live queue
// pair's plus those of destroyed ones.
func (d *Device) Stats() *QPStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := new(QPStats)
	s.add(&d.retired)
	for _, qp := range d.qps {
		s.add(&qp.stats)
	}
	return s
}

// Close disconnects every queue pair and closes every listener.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	qps := slices.Collect(maps.Values(d.qps))
	ls := slices.Collect(maps.Keys(d.listeners))
	d.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	for _, qp := range qps {
		qp.Disconnect()
	}
	return nil
}
