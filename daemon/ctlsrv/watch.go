package ctlsrv

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"time"

	"github.com/siwtun/siwtun/ctl"
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

// NewWatchEvent converts an engine event.
func NewWatchEvent(e offload.TapEvent) ctl.WatchEvent {
	out := ctl.WatchEvent{Time: e.Time, Mono: monoclock.Nanos(e.Time)}
	switch {
	case e.Segment != nil:
		s := e.Segment
		dir := "in"
		if s.Dir == netstack.Outbound {
			dir = "out"
		}
		out.Segment = &ctl.WatchSegment{Dir: dir, Src: s.Src, Dst: s.Dst, Seq: s.Seq, Ack: s.Ack, Flags: s.Flags, Window: s.Window, MSS: s.MSS, Payload: s.Payload}
	case e.Place != nil:
		p := e.Place
		out.Place = &ctl.WatchPlace{QP: p.QP, Op: p.Op.String(), STag: p.STag, TO: p.TO, Offset: p.Offset, RecvWR: p.RecvWR, MSN: p.MSN, MO: p.MO, Len: p.Len, OutOfOrder: p.OutOfOrder}
	case e.Completion != nil:
		c := e.Completion
		out.WC = &ctl.WatchWC{QP: c.QPNum, ID: c.ID, Opcode: c.Opcode.String(), Status: c.Status.String(), ByteLen: c.ByteLen}
	case e.Gap != nil:
		g := e.Gap
		wg := &ctl.WatchGap{From: g.From, To: g.To, FromMono: monoclock.Nanos(g.From), ToMono: monoclock.Nanos(g.To),
			Segments: g.Segments, Places: g.Places, WCs: g.Completions, MoreDirs: g.MoreDirs}
		for _, d := range g.Dirs {
			wg.Dirs = append(wg.Dirs, ctl.WatchGapDir{Src: d.Src, Dst: d.Dst, Seq: d.Seq, End: d.End, Segments: d.Segments})
		}
		out.Gap = wg
	}
	return out
}

// heartbeatPeriod is how long a watch stream stays silent before the
// daemon sends a heartbeat (a reader merging several daemons' streams by
// time waits for each to pass a time before showing what came before it).
const heartbeatPeriod = 50 * time.Millisecond

// isWatch reports whether a request line asks for OpWatch.
func isWatch(line []byte) bool {
	req, err := ctl.ParseRequest(line)
	return err == nil && req.Op == ctl.OpWatch
}

// watch serves an OpWatch request: an OK response, then one WatchEvent per
// line until the client closes its side (or sends anything), the client
// stops reading for writeTimeout, or the server closes.
func (s *Server) watch(c net.Conn, br *bufio.Reader, line []byte) {
	req, _ := ctl.ParseRequest(line)
	w, ok := s.p.(Watcher)
	if !ok {
		s.reply(c, errorResponse(errors.New("this daemon cannot stream its traffic")))
		return
	}
	if !s.reply(c, ctl.Response{OK: true}) {
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
