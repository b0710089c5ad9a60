package interop

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/siwtun/siwtun/iwarp/rdmap"
)

// refusedByPeer is how siwtun perf reports a post refused because the
// connection's peer has no RFC 7306 (verbs.ErrNotSupportedByPeer).
const refusedByPeer = "operation not supported by the connection's peer"

// runRFC7306 asks for RFC 7306 operations toward siw, which has none:
// `siwtun perf write --imm` (RDMA Write with Immediate Data) and `siwtun
// perf atomic` (Fetch-and-Add) as clients of the VM's `ib_write_bw -R`
// server, on a daemon that offers the extensions (its default). siw's MPA
// Reply carries no extension block, so each must fail at its first post
// with the peer's refusal and put no RFC 7306 opcode (Immediate Data with
// or without Solicited Event, Atomic Request or Response) on the wire;
// the capture is checked as every other (all FPDUs good, nothing
// malformed).
func (e *env) runRFC7306(t *testing.T) {
	d := startDaemon(t, e.netns, e.bin)
	for _, op := range []struct{ name, file string }{
		{"write --imm", "write-imm"},
		{"atomic", "atomic"},
	} {
		port := e.nextPort()
		pcap := filepath.Join(e.out, "rfc7306-"+op.file+"-to-siw.pcap")
		c := startCapture(t, e.netns, pcap)
		srv := e.vm.startServer(t, fmt.Sprintf("rfc7306-%d", port), fmt.Sprintf("timeout 60 ib_write_bw -R -F -n 10 -p %d", port), port)
		args := append([]string{e.bin, "perf"}, strings.Fields(op.name)...)
		args = append(args, "-n", "10", "-p", fmt.Sprint(port), "--dev", tunDev, "--socket-dir", d.dir, vmIP)
		cli := startProc(t, e.netns, "siwtun perf "+op.name, args...)
		st := cli.wait(time.Minute)
		out := cli.stdout.String() + cli.stderr.String()
		srv.wait(t, 10*time.Second) // ib_write_bw waits for Writes that never come: ended here
		captured, cerr := c.finish()
		var errs []error
		if st == 0 {
			errs = append(errs, fmt.Errorf("siwtun perf %s exited 0 toward siw; want the peer's refusal", op.name))
		}
		if !strings.Contains(out, refusedByPeer) {
			errs = append(errs, fmt.Errorf("siwtun perf %s did not report %q: %s", op.name, refusedByPeer, tail(out, 5)))
		}
		figs := ""
		if cerr == nil {
			n, err := ext7306Frames(pcap)
			if err != nil {
				errs = append(errs, err)
			} else if n != 0 {
				errs = append(errs, fmt.Errorf("%d frames carry an RFC 7306 opcode", n))
			}
			var terr error
			_, figs, terr = e.checkCapture(pcap, true)
			if terr != nil {
				errs = append(errs, terr)
			}
		} else {
			errs = append(errs, cerr)
		}
		err := joinErrs(errs)
		if err != nil {
			t.Errorf("%s toward siw: %v", op.name, err)
		}
		line := tail(strings.TrimSpace(cli.stderr.String()), 1)
		e.addResult("RFC 7306 toward siw: siwtun perf "+op.name, toSiw, "refused",
			fmt.Sprintf("%q; no RFC 7306 opcode on the wire; %s (%s)", line, figs, captured), err)
	}
	if err := d.stopDaemon(); err != nil {
		t.Error(err)
	}
}

// ext7306Frames counts the frames of a capture that Wireshark decodes as
// RDMAP messages with an RFC 7306 opcode.
func ext7306Frames(pcap string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	filter := fmt.Sprintf("iwarp_rdma.opcode >= %d && iwarp_rdma.opcode <= %d", rdmap.OpImmediate, rdmap.OpAtomicResponse)
	out, err := exec.CommandContext(ctx, "tshark", "-r", pcap, "-n", "-Y", filter, "-T", "fields", "-e", "frame.number").Output()
	if err != nil {
		return 0, fmt.Errorf("tshark -Y %q: %w", filter, err)
	}
	s := strings.TrimSpace(string(out))
	if s == "" {
		return 0, nil
	}
	return len(strings.Split(s, "\n")), nil
}
