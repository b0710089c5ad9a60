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
// Place and WC is set, or only Dropped.
type WatchEvent struct {
	// Time is when the event happened.
	Time time.Time `json:"time"`
	// Segment is a TCP segment at the device's link.
	Segment *WatchSegment `json:"seg,omitempty"`
	// Place is the payload of a received FPDU placed into memory.
	Place *WatchPlace `json:"place,omitempty"`
	// WC is a work completion.
	WC *WatchWC `json:"wc,omitempty"`
	// Dropped is the number of events the daemon dropped so far because
	// this client did not keep up; sent when it grows.
	Dropped uint64 `json:"dropped,omitempty"`
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
	out := WatchEvent{Time: e.Time}
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
	}
	return out
}

// isWatch reports whether a request line asks for OpWatch.
func isWatch(line []byte) bool {
	req, err := ParseRequest(line)
	return err == nil && req.Op == OpWatch
}

// watch serves an OpWatch request: an OK response, then one WatchEvent per
// line until the client closes its side (or sends anything), the client
// stops reading for writeTimeout, or the server closes.
func (s *Server) watch(c net.Conn, br *bufio.Reader, line []byte) {
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
	for {
		select {
		case <-gone:
			return
		case e, ok := <-ws.Events():
			if !ok {
				return
			}
			ev := NewWatchEvent(e)
			if d := ws.Dropped(); d != dropped {
				dropped = d
				ev.Dropped = d
			}
			c.SetWriteDeadline(time.Now().Add(writeTimeout))
			if err := enc.Encode(ev); err != nil {
				s.log.Debug("ctl: watch ended", "path", s.path, "err", err)
				return
			}
		}
	}
}

// WatchStream is the client's end of an OpWatch stream.
type WatchStream struct {
	c *Client
}

// Watch asks the daemon to stream its device's traffic. The Client is
// dedicated to the stream from then on; Close it to end the stream.
func (c *Client) Watch() (*WatchStream, error) {
	if _, err := c.Call(Request{Op: OpWatch}); err != nil {
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
