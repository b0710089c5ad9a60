package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/siwtun/siwtun/capture"
	"github.com/siwtun/siwtun/iwarp/mpa/inspect"
	"github.com/siwtun/siwtun/netstack"
)

// demoPcap writes the in-process demo's segments (each once, as its
// sender sends it) to a pcapng file with the checker's comments.
type demoPcap struct {
	f       *os.File
	w       *capture.Writer
	packets int
	err     error
}

func newDemoPcap(path string) (*demoPcap, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w, err := capture.NewWriter(f, "siwtun-demo")
	if err != nil {
		f.Close()
		return nil, err
	}
	return &demoPcap{f: f, w: w}, nil
}

// write writes an outbound segment with the checker's Reports for it as
// comments; nothing when p is nil (no -w).
func (p *demoPcap) write(s *netstack.Segment, rs []inspect.Report) {
	if p == nil || p.err != nil {
		return
	}
	var comments []string
	for i := range rs {
		if rs[i].Len > 0 {
			comments = append(comments, rs[i].Comment())
		}
	}
	pkt := capture.Packet{Time: time.Now(), Src: s.Src, Dst: s.Dst, Seq: s.Seq, Ack: s.Ack, Flags: s.Flags, Window: s.Window, MSS: s.MSS, Payload: s.Payload}
	if err := p.w.Write(&pkt, comments...); err != nil {
		p.err = err
		return
	}
	p.packets++
}

// close flushes the file and says where it is.
func (p *demoPcap) close(w io.Writer) {
	err := p.err
	if ferr := p.w.Flush(); err == nil {
		err = ferr
	}
	if cerr := p.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintf(w, "writing %s: %v\n", p.f.Name(), err)
		return
	}
	fmt.Fprintf(w, "%d packets written to %s (wireshark %s, or siwtun check %s)\n", p.packets, p.f.Name(), p.f.Name(), p.f.Name())
}

// describeReports renders the checker's view of a segment for the demo's
// wire log (used with markers, which the plain decoder does not strip).
func describeReports(rs []inspect.Report) []string {
	var out []string
	for i := range rs {
		var b strings.Builder
		inspect.WriteReport(&b, &rs[i], "")
		lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
		for _, l := range lines[1:] {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}
