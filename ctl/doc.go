// Package ctl is siwtun's control plane as its clients see it: what
// `siwtun ctl`, the live view and the benchmarks ask a running daemon
// (`siwtun up`) about its RNIC, the protocol they ask in, and how the
// answers are printed. It imports nothing of the engine: the daemon's end
// of the socket, which reads the engine, is package daemon/ctlsrv.
//
// # Wire protocol
//
// Each device's daemon listens on a Unix stream socket, by default
// /run/siwtun/<dev>.ctl (SocketPath), mode 0660. A client sends one JSON
// request per line and reads one JSON response per line, in order, on the
// same connection:
//
//	{"op":"devinfo"}            → {"ok":true,"devinfo":{...}}
//	{"op":"link"}               → {"ok":true,"link":{...}}
//	{"op":"qp"}                 → {"ok":true,"qps":[...]}
//	{"op":"qp","qp":3}          → {"ok":true,"qps":[{...}]}
//	{"op":"stats"}              → {"ok":true,"stats":{...}}
//	{"op":"watch"}              → {"ok":true}, then one WatchEvent per line
//	{"op":"tcpperf","tcpperf":{"role":"server","addr":"198.18.2.2:5201"}}
//	                            → {"ok":true,"tcpperf":{...}} once its client is done
//	{"op":"tcpperf","tcpperf":{"role":"client","addr":"198.18.2.2:5201","mode":"bulk","size":65536,"duration_ms":3000}}
//	                            → {"ok":true,"tcpperf":{...}}
//	anything else               → {"ok":false,"error":"..."}
//
// A tcpperf request runs plain TCP (apps/tcpperf: bulk or request/response)
// on the RNIC's own TCP/IP stack, for the benchmarks' raw gVisor TCP
// baseline (`siwtun bench`), and blocks until it is over.
//
// A watch request turns the connection into a stream of the device's TCP
// segments (payload included), placements and completions, until the
// client closes its side; events the client does not read in time are
// dropped and counted (WatchEvent.Dropped), never waited for.
//
// A request is at most MaxRequestSize bytes including its newline; a longer
// line, malformed JSON, an unknown field or an unknown op gets an error
// response and the connection stays usable. A connection that does not
// complete a request within the server's read timeout is closed. The JSON
// field names equal the keys of the text output (ibv_devinfo's and the rdma
// tool's), so `siwtun ctl ... -j` and the text agree.
//
// # Text output
//
// WriteDevInfo prints ibv_devinfo's layout (rdma-core
// libibverbs/examples/devinfo.c), WriteLinks `rdma link show`'s,
// WriteQPs `rdma resource show qp`'s and WriteStats `rdma statistic show`'s,
// so what users already grep keeps working; siwtun's own fields come after
// the standard ones.
package ctl
