// Package interop holds siwtun's interoperability tests against a real
// iWARP stack: the Linux kernel's soft-iWARP (siw) with rdma-core's
// unmodified tools, in the peer VM of ../shared/peer (a qemu VM on a tap
// link inside the network namespace "siwpeer").
//
// The tests run only when asked (SIWTUN_INTEROP=1, as `make interop` does),
// as root: they build and boot the VM, put a `siwtun up` daemon's TUN
// device in the VM's namespace, run rping against `siwtun ping` both ways
// in every MPA mode siw offers, the markers and hostile-peer scenarios and
// perftest against `siwtun perf` both ways, capture every scenario with
// tcpdump, check each capture with tshark and `siwtun check`, print a
// table and stop the VM. The VM side of the hostile scenarios is the static binary built from
// ./hostile. The server-sends-first scenario runs the C program in
// ./sendfirst on both sides (through libsiwtun on the host, on siw in the
// VM).
package interop
