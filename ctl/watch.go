package ctl

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/siwtun/siwtun/internal/monoclock"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
)

// Watcher is implemented by a Provider that can stream its device's
// traffic for OpWatch (the engine's Provider does).
type Watcher interface {
	// Watch opens a stream of the device's segments, placements and
	// completions; the caller closes it.
	Watch() *offload.Watch
}

// WatchEvent is one line of an OpWatch stream: exactly one of Segment,
// Place, WC and Gap is set, or none (a heartbeat: the daemon had nothing
// to report between the previous event and Mono).
type WatchEvent struct {
	// Time is when the event happened (wall clock, for people).
	Time time.Time `json:"time"`
	// Mono is when it happened in CLOCK_MONOTONIC nanoseconds, the clock
	// every daemon on a host shares: the events of two daemons are put in
	// one order by it. One daemon's events never go back in it.
	Mono int64 `json:"mono,omitempty"`
	// Segment is a TCP segment at the device's link.
	Segment *WatchSegment `json:"seg,omitempty"`
	// Place is the payload of a received FPDU placed into memory.
	Place *WatchPlace `json:"place,omitempty"`
	// WC is a work completion.
	WC *WatchWC `json:"wc,omitempty"`
	// Gap is a window of events the daemon left out, just before this
	// point of the stream (this client did not keep up).
	Gap *WatchGap `json:"gap,omitempty"`
	// Dropped is the number of events the daemon left out so far; sent
	// when it grows.
	Dropped uint64 `json:"dropped,omitempty"`
}

// WatchGap is a window of events the daemon left out (offload.TapGap):
// from the first to the last of them (wall clock and CLOCK_MONOTONIC
// nanoseconds), how many of each kind, and per connection direction the
// sequence range of the segments among them.
type WatchGap struct {
	From     time.Time     `json:"from"`
	To       time.Time     `json:"to"`
	FromMono int64         `json:"from_mono"`
	ToMono   int64         `json:"to_mono"`
	Segments uint64        `json:"segs"`
	Places   uint64        `json:"places,omitempty"`
	WCs      uint64        `json:"wcs,omitempty"`
	Dirs     []WatchGapDir `json:"dirs,omitempty"`
	// MoreDirs: segments of more directions were left out than Dirs
	// lists (offload.MaxGapDirs): any direction may have lost some.
	MoreDirs bool `json:"more_dirs,omitempty"`
}

// WatchGapDir is one direction's segments in a WatchGap: every octet left
// out lies in [Seq, End) (sequence numbers, modulo 2^32).
type WatchGapDir struct {
	Src      netip.AddrPort `json:"src"`
	Dst      netip.AddrPort `json:"dst"`
	Seq      uint32         `json:"seq"`
	End      uint32         `json:"end"`
	Segments int            `json:"segs"`
}

// WatchSegment is a TCP segment: Dir is "out" (sent by the RNIC) or "in"
// (received, before TCP looked at it). Flags are the TCP header's bits.
type WatchSegment struct {
	Dir     string         `json:"dir"`
	Src     netip.AddrPort `json:"src"`
	Dst     netip.AddrPort `json:"dst"`
	Seq     uint32         `json:"seq"`
	Ack     uint32         `json:"ack"`
	Flags   uint8          `json:"flags"`
	Window  uint16         `json:"win"`
	MSS     uint16         `json:"mss,omitempty"`
	Payload []byte         `json:"payload,omitempty"`
	// Len is the payload's length when the stream leaves payloads out
	// (Request.Headers); 0 otherwise.
	Len int `json:"len,omitempty"`
}

// PayloadLen returns the length of the segment's payload.
func (s *WatchSegment) PayloadLen() int {
	if s.Payload != nil {
		return len(s.Payload)
	}
	return s.Len
}

// WatchPlace says where a received FPDU's payload went (offload.Placement).
type WatchPlace struct {
	QP         uint32 `json:"qp"`
	Op         string `json:"op"`
	STag       uint32 `json:"stag,omitempty"`
	TO         uint64 `json:"to,omitempty"`
	Offset     uint64 `json:"offset"`
	RecvWR     uint64 `json:"recv_wr,omitempty"`
	MSN        uint32 `json:"msn,omitempty"`
	MO         uint32 `json:"mo,omitempty"`
	Len        int    `json:"len"`
	OutOfOrder bool   `json:"out_of_order,omitempty"`
}

// WatchWC is a work completion.
type WatchWC struct {
	QP      uint32 `json:"qp"`
	ID      uint64 `json:"id"`
	Opcode  string `json:"opcode"`
	Status  string `json:"status"`
	ByteLen uint32 `json:"byte_len"`
}

// NewWatchEvent converts an engine event.
func NewWatchEvent(e offload.TapEvent) WatchEvent {
	out := WatchEvent{Time: e.Time, Mono: monoclock.Nanos(e.Time)}
	switch {
	case e.Segment != nil:
		s := e.Segment
		dir := "in"
		if s.Dir == netstack.Outbound {
			dir = "out"
		}
		out.Segment = &WatchSegment{Dir: dir, Src: s.Src, Dst: s.Dst, Seq: s.Seq, Ack: s.Ack, Flags: s.Flags, Window: s.Window, MSS: s.MSS, Payload: s.Payload}
	case e.Place != nil:
		p := e.Place
		out.Place = &WatchPlace{QP: p.QP, Op: p.Op.String(), STag: p.STag, TO: p.TO, Offset: p.Offset, RecvWR: p.RecvWR, MSN: p.MSN, MO: p.MO, Len: p.Len, OutOfOrder: p.OutOfOrder}
	case e.Completion != nil:
		c := e.Completion
		out.WC = &WatchWC{QP: c.QPNum, ID: c.ID, Opcode: c.Opcode.String(), Status: c.Status.String(), ByteLen: c.ByteLen}
	case e.Gap != nil:
		g := e.Gap
		wg := &WatchGap{From: g.From, To: g.To, FromMono: monoclock.Nanos(g.From), ToMono: monoclock.Nanos(g.To),
			Segments: g.Segments, Places: g.Places, WCs: g.Completions, MoreDirs: g.MoreDirs}
		for _, d := range g.Dirs {
			wg.Dirs = append(wg.Dirs, WatchGapDir{Src: d.Src, Dst: d.Dst, Seq: d.Seq, End: d.End, Segments: d.Segments})
		}
		out.Gap = wg
	}
	return out
}

// Heartbeat reports whether e carries nothing but its time.
func (e *WatchEvent) Heartbeat() bool {
	return e.Segment == nil && e.Place == nil && e.WC == nil && e.Gap == nil
}

// MonoTime returns e's CLOCK_MONOTONIC time: Mono, or for an event without
// it (from an older daemon) its wall clock time read on this host's
// monotonic scale.
func (e *WatchEvent) MonoTime() int64 {
	if e.Mono != 0 {
		return e.Mono
	}
	return monoclock.Nanos(e.Time)
}

// heartbeatPeriod is how long a watch stream stays silent before the
// daemon sends a heartbeat (a reader merging several daemons' streams by
// time waits for each to pass a time before showing what came before it).
const heartbeatPeriod = 50 * time.Millisecond

// isWatch reports whether a request line asks for OpWatch.
func isWatch(line []byte) bool {
	req, err := ParseRequest(line)
	return err == nil && req.Op == OpWatch
}

// watch serves an OpWatch request: an OK response, then one WatchEvent per
// line until the client closes its side (or sends anything), the client
// stops reading for writeTimeout, or the server closes.
func (s *Server) watch(c net.Conn, br *bufio.Reader, line []byte) {
	req, _ := ParseRequest(line)
	w, ok := s.p.(Watcher)
	if !ok {
		s.reply(c, errorResponse(errors.New("this daemon cannot stream its traffic")))
		return
	}
	if !s.reply(c, Response{OK: true}) {
		return
	}
	ws := w.Watch()
	defer ws.Close()
	s.log.Debug("ctl: watch started", "path", s.path)
	// The client ends the stream by closing (or writing to) its side.
	gone := make(chan struct{})
	c.SetReadDeadline(time.Time{})
	go func() {
		defer close(gone)
		br.ReadByte()
	}()
	enc := json.NewEncoder(c)
	var dropped uint64
	beat := time.NewTicker(heartbeatPeriod)
	defer beat.Stop()
	sent := false // something was sent since the last tick
	for {
		select {
		case <-gone:
			return
		case <-beat.C:
			if !sent {
				ws.Idle()
			}
			sent = false
		case e, ok := <-ws.Events():
			if !ok {
				return
			}
			ev := NewWatchEvent(e)
			if req.Headers && ev.Segment != nil {
				ev.Segment.Len, ev.Segment.Payload = len(ev.Segment.Payload), nil
			}
			if d := ws.Dropped(); d != dropped {
				dropped = d
				ev.Dropped = d
			}
			c.SetWriteDeadline(time.Now().Add(writeTimeout))
			if err := enc.Encode(ev); err != nil {
				s.log.Debug("ctl: watch ended", "path", s.path, "err", err)
				return
			}
			sent = true
		}
	}
}

// WatchStream is the client's end of an OpWatch stream.
type WatchStream struct {
	c *Client
}

// Watch asks the daemon to stream its device's traffic. The Client is
// dedicated to the stream from then on; Close it to end the stream.
func (c *Client) Watch() (*WatchStream, error) { return c.watch(false) }

// WatchHeaders is Watch with the segments' payloads left out (their
// lengths in WatchSegment.Len).
func (c *Client) WatchHeaders() (*WatchStream, error) { return c.watch(true) }

func (c *Client) watch(headers bool) (*WatchStream, error) {
	if _, err := c.Call(Request{Op: OpWatch, Headers: headers}); err != nil {
		return nil, err
	}
	if err := c.conn.SetDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("%s: %w", c.dev, err)
	}
	return &WatchStream{c: c}, nil
}

// Next returns the next event. It returns io.EOF when the daemon ended the
// stream.
func (w *WatchStream) Next() (WatchEvent, error) {
	line, err := readLine(w.c.br, maxResponseSize)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return WatchEvent{}, io.EOF
		}
		return WatchEvent{}, fmt.Errorf("%s: watch: %w", w.c.dev, err)
	}
	var e WatchEvent
	if err := json.Unmarshal(line, &e); err != nil {
		return WatchEvent{}, fmt.Errorf("%s: watch: malformed event: %w", w.c.dev, err)
	}
	return e, nil
}
