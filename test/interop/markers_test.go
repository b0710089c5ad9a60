package interop

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runMarkers: siw has no markers. siwtun --markers towards siw must fail
// cleanly, saying the peer rejected markers; --markers=prefer connects
// again without them. The other way, siw as initiator cannot take a Reply
// asking for markers; --markers=prefer does not ask an initiator that did
// not ask itself.
func (e *env) runMarkers(t *testing.T) {
	e.vm.setSiw(t, nil)
	for _, flag := range []string{"--markers", "--markers=prefer"} {
		d := startDaemon(t, e.netns, e.bin, flag)
		scenario := "markers (siwtun " + flag + ")"
		for dir, name := range []string{toSiw, fromSiw} {
			tag := strings.TrimPrefix(strings.ReplaceAll(flag, "=", "-"), "--")
			pcap := filepath.Join(e.out, fmt.Sprintf("%s-%s.pcap", tag, map[int]string{dirToSiw: "to-siw", dirFrom: "from-siw"}[dir]))
			c := startCapture(t, e.netns, pcap)
			var fig string
			var err error
			switch {
			case flag == "--markers" && dir == dirToSiw:
				fig, err = e.markersRejectedBySiw(t, d)
			case flag == "--markers":
				fig, err = e.markersRefusedBySiw(t, d)
			default:
				const size = 4096
				var took time.Duration
				if dir == dirToSiw {
					took, err = e.pingSiw(t, d, size, "")
					if err == nil && !strings.Contains(d.stderr.String(), "peer rejected markers; connecting again without them") {
						err = fmt.Errorf("the daemon did not log its second connect without markers")
					}
				} else {
					took, err = e.pingedBySiw(t, d, size)
				}
				fig = fmt.Sprintf("%d pings of 4 KiB, -V: %.2fs", pingCount, took.Seconds())
			}
			captured, cerr := c.finish()
			if cerr != nil {
				err = joinErrs(nonNil(err, cerr))
			}
			v, figs, terr := e.checkCapture(pcap, true) // siwtun asks for CRC: on wherever FPDUs flowed
			if terr != nil {
				err = joinErrs(nonNil(err, terr))
			}
			var mpaLines []string
			for _, f := range v.MPA {
				mpaLines = append(mpaLines, f.String())
			}
			fig += "\n" + figs + " (" + captured + ")\nMPA " + strings.Join(mpaLines, " / ")
			if err != nil {
				t.Errorf("%s %s: %v", scenario, name, err)
			}
			res := "ok"
			if flag == "--markers" {
				res = "ok: fails cleanly"
			}
			e.addResult(scenario, name, res, fig, err)
		}
		if err := d.stopDaemon(); err != nil {
			t.Error(err)
		}
	}
}

func nonNil(errs ...error) []error {
	var out []error
	for _, e := range errs {
		if e != nil {
			out = append(out, e)
		}
	}
	return out
}

// markersRejectedBySiw: siwtun ping -c with markers against rping -s: siw
// rejects the Request (R set, M clear); siwtun ping fails with rping's
// status 255 and says the peer rejected markers; nothing is left behind
// and siw's listener still serves.
func (e *env) markersRejectedBySiw(t *testing.T, d *daemon) (string, error) {
	port := e.nextPort()
	srv := e.vm.startServer(t, fmt.Sprintf("rping-s-%d", port), fmt.Sprintf("rping -s -a %s -p %d -S 4096 -v -V", vmIP, port), port)
	cli := startProc(t, e.netns, "siwtun ping -c", e.bin, "ping", "-c", "-a", vmIP, "-p", fmt.Sprint(port),
		"-S", "4096", "-C", "10", "-V", "--dev", tunDev, "--socket-dir", d.dir)
	st := cli.wait(time.Minute)
	msg := strings.TrimSpace(cli.stderr.String())
	var errs []error
	if st != 255 {
		errs = append(errs, fmt.Errorf("siwtun ping -c exit status %d, want 255: %s", st, msg))
	}
	if !strings.Contains(msg, "peer rejected markers") {
		errs = append(errs, fmt.Errorf("siwtun ping -c did not say the peer rejected markers: %q", msg))
	}
	if err := d.noQPsLeft(); err != nil {
		errs = append(errs, err)
	}
	// siw's listener is untouched by the reject: the VM's own rping -c
	// (no markers) is still served. rping -s serves one client, then exits.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, cerr, cst := e.vm.client(ctx, fmt.Sprintf("rping -c -a %s -p %d -S 4096 -C 3 -V", vmIP, port))
	if cst != 0 {
		errs = append(errs, fmt.Errorf("siw's rping -s no longer serves after the reject: rping -c status %d: %s", cst, tail(cerr, 3)))
	}
	if _, serr, sst := srv.wait(t, 20*time.Second); sst != 0 {
		errs = append(errs, fmt.Errorf("rping -s exit status %d: %s", sst, tail(serr, 3)))
	}
	return fmt.Sprintf("siwtun ping -c: exit %d, %q", st, lastLine(msg)), joinErrs(errs)
}

// markersRefusedBySiw: rping -c in the VM against siwtun ping -s on a
// daemon asking for markers: siwtun's Reply has M set, siw (no markers)
// cannot go on and fails the connect; rping -c exits non-zero, siwtun
// ping -s ends without hanging and nothing is left behind.
func (e *env) markersRefusedBySiw(t *testing.T, d *daemon) (string, error) {
	port := e.nextPort()
	srv := startProc(t, e.netns, "siwtun ping -s", e.bin, "ping", "-s", "-a", rnicIP, "-p", fmt.Sprint(port),
		"-S", "4096", "-V", "-d", "--dev", tunDev, "--socket-dir", d.dir)
	if err := srv.waitFor("rdma_listen\n", 30*time.Second); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, out, st := e.vm.client(ctx, fmt.Sprintf("rping -c -a %s -p %d -S 4096 -C 3 -V", rnicIP, port))
	sst := srv.wait(30 * time.Second)
	var errs []error
	if st == 0 {
		errs = append(errs, fmt.Errorf("rping -c succeeded against a Reply asking for markers: %s", tail(out, 3)))
	}
	if sst == -1 {
		errs = append(errs, fmt.Errorf("siwtun ping -s still running 30 s after siw gave up"))
	}
	if err := d.noQPsLeft(); err != nil {
		errs = append(errs, err)
	}
	return fmt.Sprintf("rping -c: exit %d, %q; siwtun ping -s: exit %d, %q", st, lastLine(out), sst, lastLine(srv.stderr.String())), joinErrs(errs)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndex(s, "\n"); i >= 0 {
		return s[i+1:]
	}
	return s
}
