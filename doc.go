// Package siwtun is a software iWARP RNIC: a user-space TCP/IP stack
// (gVisor's netstack) behind a TUN device, with the iWARP protocols MPA,
// DDP and RDMAP running inside the stack's receive and transmit paths, and a
// verbs API for applications.
//
// The tree is laid out like the RNIC it emulates, from the wire up: each
// section below is one layer, read top to bottom as a message travels
// from the wire to the application, and each folder is named once with
// what it is. Every folder that holds Go or C code is on the map, and
// every folder on the map exists (maps_test.go checks both), so the map
// can be trusted as the tree's table of contents.
//
// # The wire
//
// The link the RNIC's packets cross, and the iWARP protocols' bytes on it.
// The codecs sit apart from the engine so that everything that reads or
// writes iWARP, the engine, the verbs vocabulary and the inspectors, uses
// the same definition of each header.
//
//	tun/                    the TUN device siwtun0: the RNIC's port to the host
//	tun/tuntest/            an in-memory TUN device, to test the layers above
//	                        without root or /dev/net/tun
//	iwarp/                  the iWARP protocols' wire codecs, one package each:
//	iwarp/mpa/              MPA framing (RFC 5044, RFC 6581): startup frames,
//	                        FPDUs with Markers and CRC, sent and received
//	iwarp/mpa/inspect/      checks the iWARP traffic of TCP connections
//	                        segment by segment (captures, a live device's tap)
//	iwarp/mpa/internal/crc32c/
//	                        the CRC32c that ends every FPDU
//	iwarp/ddp/              the DDP segment header (RFC 5041)
//	iwarp/rdmap/            the RDMAP headers (RFC 5040): control, Read
//	                        Request, Terminate, RFC 7306's atomics and
//	                        Immediate Data
//	capture/                reads and writes packet captures of iWARP traffic
//
// # The stack
//
// The RNIC's own TCP/IP, as a card runs TCP itself instead of the host.
//
//	netstack/               the private TCP/IP stack (gVisor's tcpip, no
//	                        gVisor type outside it), hooked at TCP segment
//	                        granularity; Pipe links two stacks in memory
//	portmap/                the port mapper: the RNIC answers on an address
//	                        the host already has, as iwpm does for a card
//
// # The engine
//
// What a card's offload does between its TCP and its verbs.
//
//	offload/                the iWARP engine: queue pairs running MPA, DDP
//	                        and RDMAP on the stack's connections, placing
//	                        payload into registered memory as segments arrive
//	anatomy/                where a round trip's time goes: the hops the
//	                        engine and the stack stamp, their medians and p99
//	rnic/                   the RNIC in one process: stack + engine + verbs
//	                        device, assembled
//	rnic/rnictest/          in-process RNICs for tests, as httptest's servers
//
// # The daemon
//
// One process per device (`siwtun up`) serves the RNIC to the host's
// applications and tools over two Unix sockets.
//
//	daemon/                 runs one device: its lock, TUN, shared address,
//	                        RNIC and sockets, started and stopped in order
//	daemon/uverbs/          the daemon's end of the verbs socket
//	daemon/ctlsrv/          the daemon's end of the control socket: the
//	                        engine's state, counters and tap for ctl's requests
//
// # The verbs
//
// The application's side: the API a verbs program calls, in Go or in C.
//
//	verbs/                  the Go verbs API (PD, MR, CQ, QP, SRQ, MW,
//	                        connection management), in process or over the
//	                        verbs socket (verbs.Dial)
//	verbs/ibv/              the vocabulary both sides share: work requests,
//	                        completions, states, limits, and their checks
//	internal/uabi/          the verbs socket's ABI: shared-memory rings and
//	                        messages, for verbs, daemon/uverbs and libsiwtun
//	internal/uabi/genheader/
//	                        writes that ABI as libsiwtun's C header
//	                        (go generate ./internal/uabi)
//	libsiwtun/              the C library, libibverbs- and librdmacm-
//	                        compatible, that `siwtun exec` preloads
//	libsiwtun/test/         libsiwtun's own C test programs
//
// # Applications and tools
//
// What runs on the verbs and beside the daemon: the command, the control
// plane's clients, workloads and the teaching view.
//
//	cmd/                    the commands:
//	cmd/siwtun/             the command-line tool: up, exec, ctl, ping, perf,
//	                        bench, trace, capture, check, web, demo
//	ctl/                    the control plane as its clients see it: the
//	                        protocol, the client, the printing (no engine)
//	ctl/watch/              follows a device's traffic through its control
//	                        socket, for trace, capture and the live view
//	web/                    the teaching view: a page drawing the engine's own
//	                        records (segments, placements, queue pairs)
//	web/assets/             the page's scripts and styles, embedded
//	apps/                   workloads on the verbs and on TCP:
//	apps/perftest/          perftest's bandwidth and latency tests, wire-
//	                        compatible with the real perftest
//	apps/connperf/          the connection set-up workload of `siwtun bench`
//	apps/tcpperf/           the TCP workload of `siwtun bench`, kernel TCP
//	                        and the RNIC's TCP measured by the same code
//	tools/                  tools beside the product:
//	tools/rping/            rdma-core's rping protocol on siwtun's verbs
//	tools/fuzz/             the scripts of make fuzz and make fuzz-long
//	tools/setup/            what make setup installs (Debian packages)
//	bench/                  make bench: two RNICs in namespaces, measured
//	                        beside the kernel's TCP in the same run
//	bench/results/          the runs of make bench, one JSON file each
//	bench/internal/pagegen/ renders the newest run into doc/performance.md
//	examples/               verbs programs to start from:
//	examples/hello/         a first verbs program, client and listener
//
// # Tests, shared helpers and documentation
//
//	test/                   the integration tests: two daemons in network
//	                        namespaces, driven through the command
//	test/capps/             unmodified C verbs programs (rping, perftest,
//	                        ibverbs-utils) on two daemons through libsiwtun
//	test/interop/           interop with Linux's kernel siw in a peer VM
//	test/interop/hostile/   the peer VM's misbehaving iWARP initiator
//	test/interop/sendfirst/ a C program for the peer VM that sends first
//	internal/               helpers the tree shares, outside its API:
//	internal/browsertest/   headless Chromium for the web view's tests
//	internal/monoclock/     CLOCK_MONOTONIC, the clock every process shares
//	internal/netns/         what the namespace runs share: the host check
//	                        and a runner for ip(8)
//	internal/sdnotify/      tells systemd the daemon is up (sd_notify)
//	internal/syncbuf/       a buffer one goroutine writes while others read
//	internal/testkit/       what the tests share: golden files, hex vectors,
//	                        waiting for a condition
//	doc/                    the user documentation, one page per concern;
//	                        doc/cli and doc/man are generated from the commands
//	packaging/              the systemd unit template and its flags file
package siwtun
