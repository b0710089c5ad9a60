package bench

import "testing"

// TestParseQperf reads qperf's reports: tcp_bw in MB/s, tcp_lat as a
// round trip (twice the one-way latency qperf prints).
func TestParseQperf(t *testing.T) {
	for _, tc := range []struct {
		out, test string
		want      float64
	}{
		{"tcp_bw:\n    bw  =  2.57 GB/sec\n", "tcp_bw", 2570},
		{"tcp_bw:\n    bw  =  193 MB/sec\n", "tcp_bw", 193},
		{"tcp_bw:\n    bw                =   71.4 MB/sec\n    msg_rate          =   1.09 K/sec\n", "tcp_bw", 71.4},
		{"tcp_lat:\n    latency  =  19.2 us\n", "tcp_lat", 38.4},
		{"tcp_lat:\n    latency  =  1.05 ms\n", "tcp_lat", 2100},
		{"tcp_lat:\n    latency  =  1,234 ns\n", "tcp_lat", 2.468},
	} {
		got, err := parseQperf(tc.out, tc.test)
		if err != nil || got-tc.want > 1e-9 || tc.want-got > 1e-9 {
			t.Errorf("%q: %v, %v; want %v", tc.out, got, err, tc.want)
		}
	}
	for _, bad := range []struct{ out, test string }{
		{"qperf: failed to connect\n", "tcp_lat"},
		{"tcp_lat:\n    latency  =  19.2 furlongs\n", "tcp_lat"},
		{"tcp_bw:\n    bw  =  19.2 us\n", "tcp_bw"},
		{"tcp_lat:\n    bw  =  2 GB/sec\n", "tcp_lat"},
	} {
		if v, err := parseQperf(bad.out, bad.test); err == nil {
			t.Errorf("%q: %v, want an error", bad.out, v)
		}
	}
}

// TestMergeRoundsKeepsTools: kernel TCP rows of different tools stay
// apart when rounds are merged.
func TestMergeRoundsKeepsTools(t *testing.T) {
	r := &Results{Rows: []Row{
		{MTU: 1500, Stack: StackKernel, Kind: KindBW, Test: TestTCPBulk, Size: BulkSize, Value: 100},
		{MTU: 1500, Stack: StackKernel, Tool: ToolIperf3, Kind: KindBW, Test: TestTCPBulk, Size: BulkSize, Value: 200},
		{MTU: 1500, Stack: StackKernel, Kind: KindBW, Test: TestTCPBulk, Size: BulkSize, Value: 120},
		{MTU: 1500, Stack: StackKernel, Tool: ToolIperf3, Kind: KindBW, Test: TestTCPBulk, Size: BulkSize, Value: 220},
	}}
	r.MergeRounds()
	if len(r.Rows) != 2 || r.Rows[0].Value != 110 || r.Rows[1].Value != 210 || r.Rows[1].Tool != ToolIperf3 {
		t.Fatalf("merged %+v", r.Rows)
	}
}
