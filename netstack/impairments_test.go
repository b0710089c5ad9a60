package netstack

import (
	"strings"
	"testing"
	"time"
)

func TestParseImpairments(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    Impairments
		wantErr string
	}{
		{name: "empty", in: "", want: Impairments{}},
		{name: "none", in: "none", want: Impairments{}},
		{
			name: "full",
			in:   "loss=0.5%,reorder=2%,dup=0.5%,delay=200us,corrupt=0.01%,seed=7",
			want: Impairments{Seed: 7, Loss: 0.005, Reorder: 0.02, Duplicate: 0.005, Corrupt: 0.0001, Delay: 200 * time.Microsecond},
		},
		{name: "fraction", in: "loss=0.25", want: Impairments{Loss: 0.25}},
		{name: "spaces and case", in: " Loss = 1% , jitter=1ms ", want: Impairments{Loss: 0.01, Jitter: time.Millisecond}},
		{name: "duplicate alias", in: "duplicate=100%", want: Impairments{Duplicate: 1}},
		{name: "negative seed", in: "seed=-3", want: Impairments{Seed: -3}},
		{name: "no equals", in: "loss", wantErr: "want key=value"},
		{name: "unknown key", in: "drop=1%", wantErr: "unknown impairment"},
		{name: "bad number", in: "loss=abc", wantErr: "not a number"},
		{name: "percent out of range", in: "loss=101%", wantErr: "out of range"},
		{name: "fraction out of range", in: "reorder=1.5", wantErr: "out of range"},
		{name: "negative", in: "dup=-1%", wantErr: "out of range"},
		{name: "nan", in: "loss=NaN", wantErr: "not a number"},
		{name: "bad duration", in: "delay=5", wantErr: "not a duration"},
		{name: "negative duration", in: "delay=-1ms", wantErr: "negative"},
		{name: "bad seed", in: "seed=1.5", wantErr: "not an integer"},
		{name: "repeated key", in: "loss=1%,loss=2%", wantErr: "twice"},
		{name: "trailing comma", in: "loss=1%,", wantErr: "want key=value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseImpairments(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseImpairments(%q) error = %v, want containing %q", tc.in, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseImpairments(%q): %v", tc.in, err)
			}
			if got != tc.want {
				t.Fatalf("ParseImpairments(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
			back, err := ParseImpairments(got.String())
			if err != nil || back != got {
				t.Fatalf("round trip via %q = %+v, %v", got.String(), back, err)
			}
		})
	}
}

func TestImpairmentsString(t *testing.T) {
	imp := Impairments{Seed: 7, Loss: 0.005, Delay: 200 * time.Microsecond}
	if got, want := imp.String(), "loss=0.5%,delay=200µs,seed=7"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got := (Impairments{}).String(); got != "none" {
		t.Errorf("zero String() = %q, want none", got)
	}
}

func FuzzParseImpairments(f *testing.F) {
	for _, s := range []string{
		"", "none", "loss=0.5%,reorder=2%,dup=0.5%,delay=200us,corrupt=0.01%,seed=7",
		"loss=0.25", "jitter=1ms", "seed=-9223372036854775808", "loss=1e-300", "delay=1h",
		"loss=", "=", ",", "loss=1%,loss=1%",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		imp, err := ParseImpairments(s)
		if err != nil {
			return
		}
		for _, p := range []float64{imp.Loss, imp.Reorder, imp.Duplicate, imp.Corrupt} {
			if !(p >= 0 && p <= 1) {
				t.Fatalf("ParseImpairments(%q) accepted probability %v", s, p)
			}
		}
		if imp.Delay < 0 || imp.Jitter < 0 {
			t.Fatalf("ParseImpairments(%q) accepted a negative duration", s)
		}
		back, err := ParseImpairments(imp.String())
		if err != nil {
			t.Fatalf("ParseImpairments(%q.String() = %q): %v", s, imp.String(), err)
		}
		if back != imp {
			t.Fatalf("round trip of %q via %q: got %+v, want %+v", s, imp.String(), back, imp)
		}
	})
}
