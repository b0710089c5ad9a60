package netstack

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Impairments describe what a Pipe direction does to the packets it carries.
// The zero value is a perfect link.
type Impairments struct {
	// Seed seeds the direction's PRNG (a→b uses Seed, b→a Seed+1).
	Seed int64
	// Loss is the probability that a packet is dropped.
	Loss float64
	// Reorder is the probability that a packet is held back and delivered
	// after the next one (or after 1 ms if no other packet comes).
	Reorder float64
	// Duplicate is the probability that a packet is delivered twice.
	Duplicate float64
	// Corrupt is the probability that a TCP data segment has one payload
	// byte flipped. The TCP checksum is fixed up, so TCP accepts the damage
	// and only an upper-layer CRC (MPA's) can catch it.
	Corrupt float64
	// Delay is the one-way latency added to every packet.
	Delay time.Duration
	// Jitter adds a uniformly random extra delay in [0, Jitter] per packet.
	// Packets still leave in order: jitter changes spacing, not order.
	Jitter time.Duration
}

// impairmentKeys lists the keys in canonical order.
const impairmentKeys = "loss, reorder, dup, corrupt, delay, jitter, seed"

// ParseImpairments parses a comma-separated key=value list such as
// "loss=0.5%,reorder=2%,dup=0.5%,delay=200us,corrupt=0.01%,seed=7".
//
// Keys: loss, reorder, dup (or duplicate), corrupt take a probability either
// as a percentage ("0.5%") or as a fraction in [0,1] ("0.005"); delay and
// jitter take a time.ParseDuration value (>= 0); seed takes an integer.
// Spaces around items are ignored; "" and "none" mean no impairment. Each key
// may appear once.
func ParseImpairments(s string) (Impairments, error) {
	var imp Impairments
	s = strings.TrimSpace(s)
	if s == "" || s == "none" {
		return imp, nil
	}
	seen := make(map[string]bool)
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		key, val, ok := strings.Cut(item, "=")
		if !ok {
			return Impairments{}, fmt.Errorf("netstack: impairment %q: want key=value", item)
		}
		key, val = strings.ToLower(strings.TrimSpace(key)), strings.TrimSpace(val)
		if key == "duplicate" {
			key = "dup"
		}
		if seen[key] {
			return Impairments{}, fmt.Errorf("netstack: impairment %q given twice", key)
		}
		seen[key] = true
		var err error
		switch key {
		case "loss":
			imp.Loss, err = parseProbability(val)
		case "reorder":
			imp.Reorder, err = parseProbability(val)
		case "dup":
			imp.Duplicate, err = parseProbability(val)
		case "corrupt":
			imp.Corrupt, err = parseProbability(val)
		case "delay":
			imp.Delay, err = parseNonNegDuration(val)
		case "jitter":
			imp.Jitter, err = parseNonNegDuration(val)
		case "seed":
			imp.Seed, err = strconv.ParseInt(val, 10, 64)
			if err != nil {
				err = fmt.Errorf("not an integer")
			}
		default:
			return Impairments{}, fmt.Errorf("netstack: unknown impairment %q (want one of %s)", key, impairmentKeys)
		}
		if err != nil {
			return Impairments{}, fmt.Errorf("netstack: impairment %s=%q: %w", key, val, err)
		}
	}
	return imp, nil
}

func parseProbability(v string) (float64, error) {
	pct := strings.HasSuffix(v, "%")
	num := strings.TrimSuffix(v, "%")
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("not a number")
	}
	if pct {
		if f < 0 || f > 100 {
			return 0, fmt.Errorf("percentage out of range [0%%,100%%]")
		}
		return f / 100, nil
	}
	if f < 0 || f > 1 {
		return 0, fmt.Errorf("probability out of range [0,1] (use %% for percentages)")
	}
	return f, nil
}

func parseNonNegDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("not a duration")
	}
	if d < 0 {
		return 0, fmt.Errorf("negative duration")
	}
	return d, nil
}

// formatProbability prints p as a percentage when that parses back to
// exactly p, else as a fraction.
func formatProbability(p float64) string {
	pct := p * 100
	if pct/100 == p {
		return strconv.FormatFloat(pct, 'g', -1, 64) + "%"
	}
	return strconv.FormatFloat(p, 'g', -1, 64)
}

// String returns the canonical ParseImpairments form of i (only non-zero
// fields, in a fixed order), or "none". ParseImpairments(i.String()) == i for
// every valid i.
func (i Impairments) String() string {
	var parts []string
	add := func(k, v string) { parts = append(parts, k+"="+v) }
	if i.Loss != 0 {
		add("loss", formatProbability(i.Loss))
	}
	if i.Reorder != 0 {
		add("reorder", formatProbability(i.Reorder))
	}
	if i.Duplicate != 0 {
		add("dup", formatProbability(i.Duplicate))
	}
	if i.Corrupt != 0 {
		add("corrupt", formatProbability(i.Corrupt))
	}
	if i.Delay != 0 {
		add("delay", i.Delay.String())
	}
	if i.Jitter != 0 {
		add("jitter", i.Jitter.String())
	}
	if i.Seed != 0 {
		add("seed", strconv.FormatInt(i.Seed, 10))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// Active reports whether i impairs anything (the seed alone does not).
func (i Impairments) Active() bool {
	return i.Loss > 0 || i.Reorder > 0 || i.Duplicate > 0 || i.Corrupt > 0 || i.Delay > 0 || i.Jitter > 0
}
