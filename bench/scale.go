package bench

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
)

// Suites a run measures (Config.Suites, Results.Suites).
const (
	// SuitePerf is the main table: kernel TCP, raw gVisor TCP and
	// perftest's bandwidth and latency between the daemons.
	SuitePerf = "perf"
	// SuiteConnect is connection set-up: connect time and connections per
	// second between the daemons, next to kernel TCP over the veth pair.
	SuiteConnect = "connect"
	// SuiteScale is aggregate RDMA WRITE bandwidth over several queue
	// pairs.
	SuiteScale = "scale"
	// SuiteMemory is the daemons' memory per idle connected queue pair.
	SuiteMemory = "memory"
	// SuiteCLib is Debian's perftest (ib_write_lat, ib_write_bw -R)
	// through libsiwtun, each figure next to siwtun perf's with the same
	// arguments: what C programs pay for the library, measured side by side.
	SuiteCLib = "clib"
)

// AllSuites are the suites of a full run, in the order measured.
var AllSuites = []string{SuitePerf, SuiteCLib, SuiteConnect, SuiteScale, SuiteMemory, SuiteShared}

// ran reports whether the run measured suite (a run that does not say
// measured all).
func (r *Results) ran(suite string) bool {
	return len(r.Suites) == 0 || slices.Contains(r.Suites, suite)
}

// The targets of the set-up, scale and memory rows: what an application
// that opens many connections may expect of a daemon.
const (
	// TargetConnectMS is the most a connect between the daemons may take
	// (the median), in milliseconds.
	TargetConnectMS = 2.0
	// TargetConnRate is the fewest connections per second between the
	// daemons, for one client and for several at once.
	TargetConnRate = 500
	// TargetScale is the least aggregate RDMA WRITE bandwidth of the most
	// queue pairs measured, relative to one queue pair.
	TargetScale = 0.9
	// TargetIdleKiB is the most memory a daemon may spend per idle
	// connected queue pair, in KiB, at the most queue pairs measured.
	TargetIdleKiB = 32
)

// findScale returns the set-up, scale or memory row that matches, or nil.
func (r *Results) findScale(mtu int, stack, kind, test string, qps, clients int) *Row {
	for i := range r.Rows {
		x := &r.Rows[i]
		if x.MTU == mtu && x.Stack == stack && x.Kind == kind && x.Test == test && x.QPs > 0 &&
			(qps == 0 || x.QPs == qps) && (clients == 0 || x.Clients == clients) {
			return x
		}
	}
	return nil
}

// analyzeScale fills a set-up, scale or memory row's ratios: a bandwidth
// row's to one queue pair's, a siwtun connect row's to kernel TCP's of the
// same clients.
func (r *Results) analyzeScale(row *Row) {
	row.VsOneQP = 0
	switch row.Kind {
	case KindBW:
		if one := r.findScale(row.MTU, row.Stack, KindBW, row.Test, 1, 0); one != nil && one.Value > 0 {
			row.VsOneQP = row.Value / one.Value
		}
	case KindConnect, KindRate:
		if row.Stack == StackKernel {
			return
		}
		if k := r.findScale(row.MTU, StackKernel, row.Kind, row.Test, 0, row.Clients); k != nil && k.Value > 0 {
			row.VsKernel = row.Value / k.Value
		}
	}
}

// scaleRows returns the set-up, scale or memory rows of mtu of a kind and
// test, fewest queue pairs (then clients) first.
func (r *Results) scaleRows(mtu int, stack, kind, test string) []*Row {
	var out []*Row
	for i := range r.Rows {
		x := &r.Rows[i]
		if x.MTU == mtu && x.Stack == stack && x.Kind == kind && x.Test == test && x.QPs > 0 {
			out = append(out, x)
		}
	}
	slices.SortFunc(out, func(a, b *Row) int {
		if a.QPs != b.QPs {
			return a.QPs - b.QPs
		}
		return a.Clients - b.Clients
	})
	return out
}

// scaleTargets judges the set-up, scale and memory targets at each MTU
// where their suite was measured.
func (r *Results) scaleTargets() []Target {
	var ts []Target
	for _, mtu := range r.mtus() {
		if r.ran(SuiteConnect) {
			ts = append(ts, r.connectTargets(mtu)...)
		}
		if r.ran(SuiteScale) {
			t := Target{Name: "aggregate RDMA WRITE 1 MiB (CRC on): most QPs / 1 QP", MTU: mtu, Limit: TargetScale, Unit: "x"}
			rows := r.scaleRows(mtu, StackSiwtun, KindBW, "RDMA WRITE")
			if n := len(rows); n >= 2 && rows[0].QPs == 1 && rows[n-1].VsOneQP > 0 {
				t.Name = fmt.Sprintf("aggregate RDMA WRITE 1 MiB (CRC on): %d QPs / 1 QP", rows[n-1].QPs)
				t.Figure = rows[n-1].VsOneQP
			} else {
				t.Missing = "RDMA WRITE bandwidth with 1 QP and with more not measured"
			}
			ts = append(ts, t)
		}
		if r.ran(SuiteMemory) {
			ini := r.scaleRows(mtu, StackSiwtun, KindMem, TestIdleInitiator)
			res := r.scaleRows(mtu, StackSiwtun, KindMem, TestIdleResponder)
			if len(ini) == 0 && len(res) == 0 {
				continue // measured at another MTU
			}
			t := Target{Name: "daemon memory per idle connected QP (the larger daemon)", MTU: mtu, Limit: TargetIdleKiB, Max: true, Unit: "KiB"}
			if len(ini) > 0 && len(res) > 0 && ini[len(ini)-1].QPs == res[len(res)-1].QPs {
				a, b := ini[len(ini)-1], res[len(res)-1]
				t.Name = fmt.Sprintf("daemon memory per idle connected QP at %d QPs (the larger daemon)", a.QPs)
				t.Figure = max(a.Value, b.Value)
			} else {
				t.Missing = "memory of both daemons not measured"
			}
			ts = append(ts, t)
		}
	}
	return ts
}

// connectTargets judges connect time and rate at mtu.
func (r *Results) connectTargets(mtu int) []Target {
	one := Target{Name: "connect time between the daemons (median, one client)", MTU: mtu, Limit: TargetConnectMS, Max: true, Unit: "ms"}
	if c := r.findScale(mtu, StackSiwtun, KindConnect, TestConnect, 0, 1); c != nil && c.Value > 0 {
		one.Figure = c.Value / 1000
	} else {
		one.Missing = "connect time not measured"
	}
	ts := []Target{one}
	for _, rate := range r.scaleRows(mtu, StackSiwtun, KindRate, TestConnect) {
		ts = append(ts, Target{Name: fmt.Sprintf("connections per second between the daemons, %s", clientsName(rate.Clients)),
			MTU: mtu, Figure: rate.Value, Limit: TargetConnRate, Unit: "conn/s"})
	}
	if len(ts) == 1 {
		ts = append(ts, Target{Name: "connections per second between the daemons", MTU: mtu, Limit: TargetConnRate, Unit: "conn/s",
			Missing: "connection rate not measured"})
	}
	return ts
}

func clientsName(n int) string {
	if n == 1 {
		return "one client"
	}
	return fmt.Sprintf("%d clients at once", n)
}

// scaleTest names a set-up, scale or memory row in the table, with its
// unit.
func scaleTest(row Row) (test, unit string) {
	switch row.Kind {
	case KindConnect:
		return "connect time", "us"
	case KindRate:
		return "connections/s", "conn/s"
	case KindMem:
		return row.Test, "KiB/QP"
	}
	return fmt.Sprintf("%s bw %s", row.Test, FormatSize(row.Size)), "MB/s"
}

// writeScaleTable prints the set-up, scale and memory rows, if any, as a
// table of their own.
func (r *Results) writeScaleTable(w io.Writer) error {
	if !slices.ContainsFunc(r.Rows, func(x Row) bool { return x.QPs > 0 }) {
		return nil
	}
	if slices.ContainsFunc(r.Rows, func(x Row) bool { return x.QPs == 0 }) {
		fmt.Fprintln(w)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MTU\tSTACK\tSET-UP AND SCALE\tQPS\tCLIENTS\tVALUE\tUNIT\tVS 1 QP\tVS KERNEL\tDAEMON RSS KiB")
	for _, row := range r.Rows {
		if row.QPs == 0 {
			continue
		}
		test, unit := scaleTest(row)
		clients, rss := "-", "-"
		if row.Clients > 0 {
			clients = fmt.Sprint(row.Clients)
		}
		if row.Kind == KindMem {
			rss = fmt.Sprintf("%.0f -> %.0f", row.RSSBaseKiB, row.RSSKiB)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%.1f\t%s\t%s\t%s\t%s\n", row.MTU, stackName(row.Stack, row.Tool), test, row.QPs, clients,
			row.Value, unit, ratio(row.VsOneQP), ratio(row.VsKernel), rss)
	}
	return tw.Flush()
}
