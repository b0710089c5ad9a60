// Package ctlsrv is the daemon's end of the control socket (package ctl
// has the protocol, the client and the printing): a Server answers ctl's
// requests from a Provider, which NewProvider builds over the device's
// engine (offload.Device) — its attributes, links, queue pairs, memory
// regions and counters, arranged by protocol layer — and streams the
// engine's tap to watch requests.
//
//	server.go    Server: the socket, its connections, limits and timeouts
//	provider.go  Provider and the engine's: devinfo, link, queue pairs
//	counters.go  the stats op: stack and engine counters by layer
//	watch.go     the watch op: the engine's tap as a stream of events
//	mr.go, proc.go, tcpperf.go, anatomy.go  the other ops
package ctlsrv
