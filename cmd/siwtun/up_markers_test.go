package main

import (
	"slices"
	"testing"
)

// TestUpMarkersFlag: --markers alone is on; on, off, prefer and the old
// boolean spellings map to the engine's Markers and MarkersPrefer; any
// other value is refused with a message naming the choices.
func TestUpMarkersFlag(t *testing.T) {
	tests := []struct {
		args            []string
		markers, prefer bool
		bad             bool
	}{
		{args: nil},
		{args: []string{"--markers"}, markers: true},
		{args: []string{"--markers=on"}, markers: true},
		{args: []string{"--markers=true"}, markers: true},
		{args: []string{"--markers=off"}},
		{args: []string{"--markers=false"}},
		{args: []string{"--markers=prefer"}, markers: true, prefer: true},
		{args: []string{"--markers=maybe"}, bad: true},
	}
	for _, tt := range tests {
		cmd := newUpCmd()
		err := cmd.ParseFlags(tt.args)
		if tt.bad {
			if err == nil || err.Error() != `invalid argument "maybe" for "--markers" flag: want on, off, prefer, true or false` {
				t.Errorf("%v: err = %v", tt.args, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		v := cmd.Flags().Lookup("markers").Value.String()
		m, p, err := parseMarkers(v)
		if err != nil || m != tt.markers || p != tt.prefer {
			t.Errorf("%v: markers %v prefer %v err %v, want %v %v", tt.args, m, p, err, tt.markers, tt.prefer)
		}
	}
}

// TestWordFlagsSpaced: --markers prefer and --crc off, as the docs and
// the help write them, parse like --markers=prefer and --crc=off (pflag alone
// takes the word for an argument: "unknown command"), for siwtun up and
// siwtun demo; a word the flag does not take stays an argument, and --crc
// alone is still on.
func TestWordFlagsSpaced(t *testing.T) {
	tests := []struct {
		args          []string
		want          []string // after joinWordValues
		crc           string
		markers       string
		leftOver      []string
		wantParseFail bool
	}{
		{args: []string{"up", "--markers", "prefer", "--crc", "off"},
			want: []string{"up", "--markers=prefer", "--crc=off"}, crc: "off", markers: "prefer"},
		{args: []string{"up", "--crc", "--markers", "--dev", "siwtun3"},
			want: []string{"up", "--crc", "--markers", "--dev", "siwtun3"}, crc: "on", markers: "on"},
		{args: []string{"up", "--crc", "false", "--markers", "on"},
			want: []string{"up", "--crc=false", "--markers=on"}, crc: "off", markers: "on"},
		{args: []string{"up", "--crc=off", "--markers=off"},
			want: []string{"up", "--crc=off", "--markers=off"}, crc: "off", markers: "off"},
		{args: []string{"demo", "--crc", "off", "--markers", "on", "--in-process"},
			want: []string{"demo", "--crc=off", "--markers=on", "--in-process"}, crc: "off", markers: "on"},
		{args: []string{"demo", "--markers", "prefer"}, // demo has no prefer
			want: []string{"demo", "--markers", "prefer"}, crc: "on", markers: "on", leftOver: []string{"prefer"}},
		{args: []string{"up", "--", "--crc", "off"},
			want: []string{"up", "--", "--crc", "off"}, crc: "on", markers: "off", leftOver: []string{"--crc", "off"}},
	}
	for _, tt := range tests {
		root := newRootCmd()
		got := joinWordValues(root, tt.args)
		if !slices.Equal(got, tt.want) {
			t.Errorf("joinWordValues(%q) = %q, want %q", tt.args, got, tt.want)
			continue
		}
		cmd, rest, err := root.Find(got)
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Errorf("%q: %v", tt.args, err)
			continue
		}
		if c := cmd.Flags().Lookup("crc").Value.String(); c != tt.crc {
			t.Errorf("%q: crc %s, want %s", tt.args, c, tt.crc)
		}
		if m := cmd.Flags().Lookup("markers").Value.String(); m != tt.markers {
			t.Errorf("%q: markers %s, want %s", tt.args, m, tt.markers)
		}
		if a := cmd.Flags().Args(); !slices.Equal(a, tt.leftOver) {
			t.Errorf("%q: arguments left %q, want %q", tt.args, a, tt.leftOver)
		}
	}
}
