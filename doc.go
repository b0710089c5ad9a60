// Package siwtun is a software iWARP RNIC: a user-space TCP/IP stack
// (gVisor's netstack) behind a TUN device, with the iWARP protocols MPA,
// DDP and RDMAP running inside the stack's receive and transmit paths, and a
// verbs API for applications.
//
// The tree is laid out like the RNIC it emulates:
//
//	tun/        the TUN device (the wire)
//	netstack/   the RNIC's private TCP/IP stack, with segment-level hooks
//	iwarp/      the iWARP protocols' wire codecs: mpa/, ddp/, rdmap/ (both sides
//	            use them: the engine, the verbs vocabulary, the inspectors)
//	offload/    the iWARP engine: queue pairs running MPA, DDP and RDMAP on the
//	            stack's connections
//	rnic/       the in-process RNIC: stack + engine + verbs device, assembled
//	daemon/     the daemon's side, serving the RNIC: uverbs/ the verbs socket,
//	            ctlsrv/ the control socket
//	verbs/      the application API: PD, MR, CQ, QP, connection management;
//	            verbs/ibv its vocabulary
//	ctl/        the control plane's protocol, client and printing
//	cmd/siwtun  the command-line tool
package siwtun
