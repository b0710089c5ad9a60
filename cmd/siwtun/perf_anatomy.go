package main

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/siwtun/siwtun/anatomy"
	"github.com/siwtun/siwtun/apps/perftest"
	"github.com/siwtun/siwtun/ctl"
)

// perfAnatomy is `siwtun perf write --lat --anatomy`: the round trip taken
// apart hop by hop. Both daemons must run on this host, so that their
// stamps and the applications' come from one clock. The client starts
// both daemons' recorders over their control sockets right before its
// first message; after the run each side hands its application's stamps
// to its own daemon, and the client collects everything from both and
// prints the table.
type perfAnatomy struct {
	dir, dev string
	// peerDir is where the client looks for the server's daemon.
	peerDir string
	client  bool
	stamps  perftest.Stamps
	// peerDev is the daemon holding the server's address (client only).
	peerDev string
}

// anatomyPeerWait bounds the client's wait for the server's application
// stamps, which the server hands over when its own run ends.
const anatomyPeerWait = 10 * time.Second

func newPerfAnatomy(dir, peerDir, dev string, client bool) *perfAnatomy {
	if peerDir == "" {
		peerDir = dir
	}
	a := &perfAnatomy{dir: dir, peerDir: peerDir, dev: dev, client: client}
	a.stamps = perftest.Stamps{Clock: anatomy.Now, Start: a.start}
	return a
}

func (a *perfAnatomy) dial(dir, dev string) (*ctl.Client, error) {
	c, err := ctl.Dial(ctl.SocketPath(dir, dev))
	if err != nil {
		return nil, fmt.Errorf("--anatomy: %w", err)
	}
	return c, nil
}

// prepare finds, before the client connects, the daemon of the server's
// address among the control sockets: both must be on this host.
func (a *perfAnatomy) prepare(server netip.Addr) error {
	peer, err := a.findPeer(server)
	if err != nil {
		return err
	}
	a.peerDev = peer
	return nil
}

// start runs before the first message: the client starts both
// recorders.
func (a *perfAnatomy) start(local, remote netip.AddrPort) error {
	if !a.client {
		return nil
	}
	if a.peerDev == "" {
		if err := a.prepare(remote.Addr()); err != nil {
			return err
		}
	}
	for _, d := range a.daemons() {
		c, err := a.dial(d[0], d[1])
		if err != nil {
			return err
		}
		_, err = c.Anatomy(ctl.AnatomyStart)
		c.Close()
		if err != nil {
			return fmt.Errorf("--anatomy: %w", err)
		}
	}
	return nil
}

// samePeer reports whether the server's daemon is the client's own (both
// applications on one device).
func (a *perfAnatomy) samePeer() bool { return a.peerDev == a.dev && a.peerDir == a.dir }

// daemons are the client's daemon and the server's, once each: directory
// and device.
func (a *perfAnatomy) daemons() [][2]string {
	if a.samePeer() {
		return [][2]string{{a.dir, a.dev}}
	}
	return [][2]string{{a.dir, a.dev}, {a.peerDir, a.peerDev}}
}

// findPeer returns the device of the daemon in the socket directory whose
// stack holds addr: another daemon's, else the client's own.
func (a *perfAnatomy) findPeer(addr netip.Addr) (string, error) {
	paths, _ := filepath.Glob(filepath.Join(a.peerDir, "*"+ctl.SocketSuffix))
	own := false
	for _, p := range paths {
		dev := ctl.DevFromPath(p)
		if dev == a.dev && a.peerDir == a.dir {
			own = true // looked at last
			continue
		}
		if holds(p, addr) {
			return dev, nil
		}
	}
	if own && holds(ctl.SocketPath(a.dir, a.dev), addr) {
		return a.dev, nil
	}
	return "", fmt.Errorf("--anatomy: no daemon with a control socket in %s holds %v: the server's daemon must run on this host (its stamps must come from the same clock; --peer-socket-dir says where its socket is)", a.peerDir, addr)
}

// holds reports whether the daemon of the control socket at path has
// addr on its stack.
func holds(path string, addr netip.Addr) bool {
	c, err := ctl.Dial(path)
	if err != nil {
		return false
	}
	l, err := c.Link()
	c.Close()
	if err != nil {
		return false
	}
	for _, s := range l.Addrs {
		if pfx, err := netip.ParsePrefix(s); err == nil && pfx.Addr() == addr {
			return true
		}
	}
	return false
}

// appRecords returns the application's stamps as records of its
// connection's two flows.
func (a *perfAnatomy) appRecords() []anatomy.Record {
	st := &a.stamps
	out := anatomy.Flow{Src: st.Local.Port(), Dst: st.Remote.Port()}
	recs := make([]anatomy.Record, 0, len(st.Posts)+len(st.Seen))
	for _, t := range st.Posts {
		recs = append(recs, anatomy.Record{Hop: anatomy.Post, SrcPort: out.Src, DstPort: out.Dst, T: t})
	}
	for _, t := range st.Seen {
		recs = append(recs, anatomy.Record{Hop: anatomy.Seen, SrcPort: out.Dst, DstPort: out.Src, T: t})
	}
	return recs
}

// finish runs after the test: each side hands its stamps to its daemon;
// the client then collects both daemons' and prints the anatomy to w.
func (a *perfAnatomy) finish(w io.Writer) error {
	if !a.stamps.Local.IsValid() {
		return errors.New("--anatomy: the run recorded no stamps")
	}
	own, err := a.dial(a.dir, a.dev)
	if err != nil {
		return err
	}
	defer own.Close()
	app := a.appRecords()
	if err := own.AnatomyApp(app); err != nil {
		if !a.client && strings.Contains(err.Error(), anatomy.ErrNotStarted.Error()) {
			return fmt.Errorf("--anatomy: %s was not recording: run the client with --anatomy too", a.dev)
		}
		return fmt.Errorf("--anatomy: %w", err)
	}
	if !a.client {
		fmt.Fprintf(w, "anatomy: %d stamps handed to %s; the client prints the table\n", len(a.stamps.Posts)+len(a.stamps.Seen), a.dev)
		return nil
	}
	peer, ours := own, len(app) // the server's stamps come on top of ours
	if !a.samePeer() {
		if peer, err = a.dial(a.peerDir, a.peerDev); err != nil {
			return err
		}
		defer peer.Close()
		ours = 0
	}
	for _, c := range []*ctl.Client{own, peer} {
		if _, err := c.Anatomy(ctl.AnatomyStop); err != nil {
			return fmt.Errorf("--anatomy: %w", err)
		}
	}
	theirs, peerApp, st, err := a.peerRecords(peer, ours)
	if err != nil {
		return err
	}
	lost := st.Lost
	mine := theirs
	if !a.samePeer() {
		if mine, st, err = own.AnatomyRecords(); err != nil {
			return fmt.Errorf("--anatomy: %w", err)
		}
		lost += st.Lost
	}
	flow := anatomy.Flow{Src: a.stamps.Local.Port(), Dst: a.stamps.Remote.Port()}
	an := anatomy.Assemble(anatomy.Side{Name: "client", Records: mine}, anatomy.Side{Name: "server", Records: theirs}, flow)
	fmt.Fprintf(w, "\nanatomy of the round trip: %s (%s) <-> %s (%s), CLOCK_MONOTONIC of one host\n", a.stamps.Local, a.dev, a.stamps.Remote, a.peerDev)
	fmt.Fprint(w, an.String())
	if peerApp == 0 {
		fmt.Fprintln(w, "the server handed over no stamps of its own (run it with --anatomy): its application's hops are missing")
	}
	if lost > 0 {
		fmt.Fprintf(w, "%d stamps were lost (the daemons keep the newest %d each): the oldest messages are incomplete\n", lost, anatomy.RingSize)
	}
	return nil
}

// peerRecords waits until the server's application stamps have come to
// its daemon, beyond the ours already there (their count grew and then
// stays the same for a moment), or anatomyPeerWait passed, and returns the
// daemon's records and how many are the server application's.
func (a *perfAnatomy) peerRecords(peer *ctl.Client, ours int) ([]anatomy.Record, int, ctl.AnatomyState, error) {
	deadline := time.Now().Add(anatomyPeerWait)
	last := -1
	for {
		recs, st, err := peer.AnatomyRecords()
		if err != nil {
			return nil, 0, st, fmt.Errorf("--anatomy: %w", err)
		}
		n := countApp(recs) - ours
		if (n > 0 && n == last) || time.Now().After(deadline) {
			return recs, max(n, 0), st, nil
		}
		last = n
		time.Sleep(200 * time.Millisecond)
	}
}

func countApp(recs []anatomy.Record) int {
	return len(slices.DeleteFunc(slices.Clone(recs), func(r anatomy.Record) bool {
		return r.Hop != anatomy.Post && r.Hop != anatomy.Seen
	}))
}
