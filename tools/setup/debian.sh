#!/usr/bin/env bash
# Installs, with apt-get, the Debian packages siwtun's tests use, those that
# are missing: `make setup` runs it, and so does .ci/run on a fresh machine
# (only Go, gcc and git there), and make test runs it first. Installing
# needs root; without root it only says what is missing (the tests that
# need those tools skip, naming the package).
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
need=()
command -v make >/dev/null 2>&1 || need+=(make)
# The integration tests (test/) create network namespaces with ip(8).
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# capture/ and test/ check pcapng files with Wireshark's dissectors, and
# make interop its captures (the peer VM's build-peer.sh installs qemu,
# tcpdump and the rest itself).
command -v tshark >/dev/null 2>&1 || need+=(tshark)
# libsiwtun (libsiwtun/) builds against rdma-core's headers; test/capps runs
# Debian's rping, perftest and ibverbs-utils through it.
[ -e /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
[ -e /usr/include/rdma/rdma_cma.h ] || need+=(librdmacm-dev)
command -v rping >/dev/null 2>&1 || need+=(rdmacm-utils)
command -v ib_write_bw >/dev/null 2>&1 || need+=(perftest)
command -v ibv_devinfo >/dev/null 2>&1 || need+=(ibverbs-utils)
# test/capps runs rdma-core's own test suite (pyverbs, with its tests/ in
# /usr/share/doc/rdma-core/tests), libfabric's fi_info and fi_pingpong, and
# qperf through libsiwtun.
[ -e /usr/share/doc/rdma-core/tests/run_tests.py ] || need+=(python3-pyverbs)
command -v fi_pingpong >/dev/null 2>&1 || need+=(libfabric-bin)
command -v qperf >/dev/null 2>&1 || need+=(qperf)
# test/'s TestOffloadWireAlignment captures a veth with TSO/GSO/GRO off
# (ethtool) with tcpdump.
command -v tcpdump >/dev/null 2>&1 || need+=(tcpdump)
command -v ethtool >/dev/null 2>&1 || need+=(ethtool)
# make bench (bench/, test/'s TestMakeBenchTiny) measures kernel TCP with
# iperf3 and qperf beside siwtun's own tcpperf.
command -v iperf3 >/dev/null 2>&1 || need+=(iperf3)
command -v qperf >/dev/null 2>&1 || need+=(qperf)
# test/'s shared-address tests (siwtun up --shared) look at the daemon's
# nftables table with nft, bind sockets with python3 and drop capabilities
# with setpriv (iperf3 above runs their kernel transfer).
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v python3 >/dev/null 2>&1 || need+=(python3)
command -v setpriv >/dev/null 2>&1 || need+=(util-linux)
# web/ and cmd/siwtun test the web view in a headless Chromium (chromedp).
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
		echo "setup: missing ${need[*]} (as root on Debian, make setup installs them); the tests that need them skip" >&2
		exit 0
	fi
	apt-get update -qq
	apt-get install -y -qq "${need[@]}"
fi

