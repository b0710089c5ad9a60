package main

import "testing"

func TestParseSize(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want uint64
	}{{"0", 0}, {"4096", 4096}, {"64K", 64 << 10}, {"64KiB", 64 << 10}, {"3m", 3 << 20}, {"64G", 64 << 30},
		{"2TB", 2 << 40}, {"16777215T", 16777215 << 40}} {
		got, err := parseSize(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
		if back, err := parseSize(formatSize(tt.want)); err != nil || back != tt.want {
			t.Errorf("formatSize(%d) = %q reads back as %d, %v", tt.want, formatSize(tt.want), back, err)
		}
	}
	for _, bad := range []string{"", "-1", "1.5G", "G", "16777216T", "12X"} {
		if n, err := parseSize(bad); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", bad, n)
		}
	}
}
