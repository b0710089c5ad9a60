package anatomy

import (
	"fmt"
	"strings"
	"time"
)

// String renders the anatomy as the table `siwtun perf --anatomy` prints:
// one row per leg, the median and 99th percentile in microseconds for
// each direction, and the count of messages each figure rests on.
func (an Anatomy) String() string { return an.Table(nil) }

// Table renders the anatomy as String does, naming each leg by name (nil:
// Leg.Name): a link other than a TUN device has legs of its own.
func (an Anatomy) Table(name func(Leg) string) string {
	if name == nil {
		name = Leg.Name
	}
	var b strings.Builder
	d0, d1 := &an.Dirs[0], &an.Dirs[1]
	w := len("HOP")
	for _, s := range d0.Legs {
		w = max(w, len(name(s.Leg))+2)
	}
	dir := func(d *Direction) string { return d.From + " -> " + d.To }
	fmt.Fprintf(&b, "%-*s  %26s  %26s\n", w, "", dir(d0), dir(d1))
	fmt.Fprintf(&b, "%-*s  %10s %8s %6s  %10s %8s %6s\n", w, "HOP", "MEDIAN us", "P99 us", "N", "MEDIAN us", "P99 us", "N")
	for i := range d0.Legs {
		s0, s1 := d0.Legs[i], d1.Legs[i]
		leg := name(s0.Leg)
		if i == len(d0.Legs)-1 {
			leg = "= " + leg
		}
		fmt.Fprintf(&b, "%-*s  %10s %8s %6d  %10s %8s %6d\n", w, leg, us(s0, s0.Median), us(s0, s0.P99), s0.N, us(s1, s1.Median), us(s1, s1.P99), s1.N)
	}
	rt := an.RoundTrip
	if rt.N == 0 {
		fmt.Fprintln(&b, "no stamps of the applications: their legs are empty")
		return b.String()
	}
	fmt.Fprintf(&b, "%s (%s's application): median %s us, p99 %s us over %d round trips\n",
		name(rt.Leg), d0.From, us(rt, rt.Median), us(rt, rt.P99), rt.N)
	return b.String()
}

// us formats d in microseconds with one decimal, or "-" when s rests on
// no message.
func us(s Stat, d time.Duration) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(d)/float64(time.Microsecond))
}
