package main

import "testing"

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
		if err := cmd.ParseFlags(tt.args); err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		v := cmd.Flags().Lookup("markers").Value.String()
		m, p, err := parseMarkers(v)
		if tt.bad {
			if err == nil || err.Error() != `--markers "maybe": want on, off or prefer` {
				t.Errorf("%v: err = %v", tt.args, err)
			}
			continue
		}
		if err != nil || m != tt.markers || p != tt.prefer {
			t.Errorf("%v: markers %v prefer %v err %v, want %v %v", tt.args, m, p, err, tt.markers, tt.prefer)
		}
	}
}
