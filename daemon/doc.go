// Package daemon is the daemon's side of a siwtun device: what `siwtun up`
// runs beside the RNIC (package rnic). Its subpackages serve the device's
// two sockets: uverbs the verbs socket, through which applications (the
// Go verbs API and libsiwtun) drive queue pairs; ctlsrv the control
// socket, through which `siwtun ctl`, the live view and the benchmarks read
// its state.
//
// The daemon's own package holds what it plugs into them: the control
// plane's tcpperf op on the RNIC's TCP/IP stack.
package daemon
