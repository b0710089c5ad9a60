// Package bench is `make bench` (`siwtun bench`): it builds, in network
// namespaces it creates and removes, the two-RNIC topology of the
// integration tests and measures, side by side and in the same run,
//
//   - kernel TCP between two namespaces over a veth pair (apps/tcpperf in
//     two `siwtun bench tcp` processes: bulk and request/response),
//   - raw gVisor TCP between the two daemons' own TCP/IP stacks through
//     their TUN devices (the same workload, run by the daemons' ctl
//     tcpperf op): the engine's floor,
//   - siwtun: perftest's RDMA WRITE, READ and SEND bandwidth and latency
//     between two `siwtun perf` processes on the daemons' verbs sockets,
//     with MPA CRC on and off,
//
// at each MTU (the perf suite), and then
//
//   - Debian's perftest, C programs linked with rdma-core, through
//     libsiwtun (`siwtun exec`): ib_write_lat -R at 2 B and ib_write_bw -R
//     at 64 KiB, each right next to `siwtun perf` with the same arguments,
//     ib_write_lat also next to `siwtun perf --spin`, which busy-waits as
//     it does (clib; skipped, with a note, when perftest or the library
//     is missing),
//   - connection set-up (connect): `siwtun bench conn` (apps/connperf)
//     opening connections one after the other, from one client process
//     and from several at once, between the daemons and, for comparison,
//     over the kernel's TCP on the veth pair: the median connect time and
//     the connections per second,
//   - scale: the aggregate RDMA WRITE bandwidth of 1, 4, 16 and 64 queue
//     pairs between the daemons,
//   - memory: each daemon's resident set with 1,000 and 10,000 connected
//     idle queue pairs, per queue pair, on daemons started afresh (at the
//     first MTU only),
//
// and prints one table of absolute figures, ratios to both baselines, the
// receiving application's CPU seconds per GB (its own rusage) next to the
// kernel socket receiver's, a table of set-up, scale and memory, and the
// performance targets marked PASS or MISS. Results also goes to JSON
// (bench/results/).
//
// Every process the run starts is stopped by its PID, and every namespace
// removed, on every exit path (the caller cancels the context on SIGINT).
package bench

//go:generate go run ./internal/pagegen -page ../doc/performance.md -results results -source bench/results
