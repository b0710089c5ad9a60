// Package daemon runs one siwtun device, what `siwtun up` is: Start takes
// the device's lock, creates the TUN device, sets up a shared address
// (shared.go, with package portmap), starts the RNIC on the device's link
// (package rnic) and serves it on two sockets; Close stops it all in the
// reverse order.
//
// Its subpackages are the servers of those sockets: uverbs the verbs
// socket, through which applications (the Go verbs API and libsiwtun)
// drive queue pairs; ctlsrv the control socket, through which `siwtun
// ctl`, the live view and the benchmarks read the device's state. The
// control plane's tcpperf op runs on the RNIC's own stack (tcpperf.go).
package daemon
