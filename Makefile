# siwtun — build, test, demo, benchmarks.
GO      ?= go
PKGS    := ./...
FUZZTIME ?= 10s

.PHONY: all setup build lib install uninstall test test-short vet fmt-check fuzz fuzz-long soak bench gobench demo interop clean

all: build

# The Debian packages the tests use (tshark, tcpdump, ethtool, chromium,
# rdma-core's headers and tools, ...), those that are missing; as root.
setup:
	bash tools/setup/debian.sh

build: lib
	$(GO) build -o bin/siwtun ./cmd/siwtun

# libsiwtun (libsiwtun/): the libibverbs/librdmacm-compatible C library that
# `siwtun exec` preloads, and its sanitizer-built C test program.
lib:
	$(MAKE) -C libsiwtun all test-prog

# make install puts siwtun in PREFIX (default /usr/local), under DESTDIR
# when given (a staging root for a package): the binary in bin/, libsiwtun
# in lib/siwtun/ (where siwtun exec looks, ../lib/siwtun from the binary),
# the man pages, bash, zsh and fish completions (from siwtun completion),
# and the systemd unit template siwtun@.service, which runs one device per
# instance with its flags from SYSCONFDIR/siwtun/<dev>.conf (an example is
# installed beside). doc/install.md says how to use them. It builds what
# it installs into BIN (default bin/) when a source is newer, so that
# make build, then make install as root, does not build again as root.
PREFIX         ?= /usr/local
SYSCONFDIR     ?= /etc
BINDIR         := $(PREFIX)/bin
LIBDIR         := $(PREFIX)/lib/siwtun
MANDIR         ?= $(PREFIX)/share/man
BASHCOMPDIR    ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR     ?= $(PREFIX)/share/zsh/site-functions
FISHCOMPDIR    ?= $(PREFIX)/share/fish/vendor_completions.d
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
BIN            ?= bin
# What the binary is built from: Go sources and the files they embed.
GOSRC          := $(shell find . \( -path ./.git -o -path ./bin \) -prune -o -type f \
                  \( -name '*.go' -o -name '*.html' -o -name '*.css' -o -name '*.js' \) -print) go.mod go.sum

$(BIN)/siwtun: $(GOSRC)
	$(GO) build -o $@ ./cmd/siwtun

install: $(BIN)/siwtun
	$(MAKE) -C libsiwtun all OUT=$(abspath $(BIN))
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(BASHCOMPDIR) \
		$(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(FISHCOMPDIR) $(DESTDIR)$(SYSTEMDUNITDIR) $(DESTDIR)$(SYSCONFDIR)/siwtun
	install -m 0755 $(BIN)/siwtun $(DESTDIR)$(BINDIR)/siwtun
	@if [ -f $(BIN)/libsiwtun.so ]; then \
		echo install -d $(DESTDIR)$(LIBDIR); install -d $(DESTDIR)$(LIBDIR); \
		echo install -m 0755 $(BIN)/libsiwtun.so $(DESTDIR)$(LIBDIR)/libsiwtun.so; \
		install -m 0755 $(BIN)/libsiwtun.so $(DESTDIR)$(LIBDIR)/libsiwtun.so; \
	else \
		echo "install: libsiwtun was not built (install libibverbs-dev and librdmacm-dev): siwtun exec will not work"; \
	fi
	install -m 0644 doc/man/*.1 $(DESTDIR)$(MANDIR)/man1/
	$(BIN)/siwtun completion bash > $(DESTDIR)$(BASHCOMPDIR)/siwtun
	$(BIN)/siwtun completion zsh > $(DESTDIR)$(ZSHCOMPDIR)/_siwtun
	$(BIN)/siwtun completion fish > $(DESTDIR)$(FISHCOMPDIR)/siwtun.fish
	chmod 0644 $(DESTDIR)$(BASHCOMPDIR)/siwtun $(DESTDIR)$(ZSHCOMPDIR)/_siwtun $(DESTDIR)$(FISHCOMPDIR)/siwtun.fish
	sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' 'packaging/siwtun@.service.in' \
		> '$(DESTDIR)$(SYSTEMDUNITDIR)/siwtun@.service'
	chmod 0644 '$(DESTDIR)$(SYSTEMDUNITDIR)/siwtun@.service'
	install -m 0644 packaging/siwtun0.conf.example $(DESTDIR)$(SYSCONFDIR)/siwtun/siwtun0.conf.example

# make uninstall removes what make install put there (same PREFIX and
# DESTDIR); the devices' .conf files in SYSCONFDIR/siwtun stay.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/siwtun $(DESTDIR)$(LIBDIR)/libsiwtun.so
	rm -f $(DESTDIR)$(MANDIR)/man1/siwtun.1 $(DESTDIR)$(MANDIR)/man1/siwtun-*.1
	rm -f $(DESTDIR)$(BASHCOMPDIR)/siwtun $(DESTDIR)$(ZSHCOMPDIR)/_siwtun $(DESTDIR)$(FISHCOMPDIR)/siwtun.fish
	rm -f '$(DESTDIR)$(SYSTEMDUNITDIR)/siwtun@.service' $(DESTDIR)$(SYSCONFDIR)/siwtun/siwtun0.conf.example
	-rmdir $(DESTDIR)$(LIBDIR) $(DESTDIR)$(SYSCONFDIR)/siwtun 2>/dev/null

# The test suite: formatting, vet, every package with the race detector,
# then the integration tests (root; real TUN devices and daemons, run on
# their own so the machine is not starved under them), and a short run of
# every fuzz target.
test: setup fmt-check vet build
	$(GO) test -race -count=1 -timeout 20m $$($(GO) list ./... | grep -v -e /test$$ -e /test/capps$$)
	# The allocation checks skip under -race (its sync.Pool drops items).
	$(GO) test -count=1 -run 'NoAllocs|ZeroAlloc' ./netstack/ ./offload/... ./verbs/ ./tun/...
	# The 100,000-segment page skips under -race (building it takes minutes).
	$(GO) test -count=1 -run 'TestPageLarge' -v ./web/
	$(GO) test -count=1 -timeout 20m ./test/
	# Unmodified C verbs programs through libsiwtun (after test/: both run daemons).
	$(GO) test -count=1 -timeout 20m ./test/capps/
	$(MAKE) fuzz

test-short:
	$(GO) test -short -count=1 $(PKGS)

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# Each native fuzz target runs for FUZZTIME (tools/fuzz/run.sh: a bare
# "context deadline exceeded" with no failing input, Go 1.26's fuzzing
# coordinator race golang/go#75804, is run once more).
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) tools/fuzz/run.sh

# Every fuzz target of the tree for FUZZTIME each (default 10 minutes; a
# duration, or Nx for N executions), one after the other, then a table of
# each one's executions, new coverage and crashes (tools/fuzz/long.sh; its
# header lists the other settings). Not part of make test: 25 targets at
# 10 minutes is over 4 hours.
fuzz-long:
	FUZZTIME=$(if $(filter command line environment,$(origin FUZZTIME)),$(FUZZTIME),10m) GO=$(GO) bash tools/fuzz/long.sh

# The soak tests (root; test/soak_test.go, skipped by make test): SOAK_TIME
# (default 10m) of verified Write/Read/Send traffic on 16 QPs between two
# daemons over impaired links (1 % loss, 2 % reorder, 0.5 % duplication,
# 0.01 % corruption); 10,000 QPs connected and torn down (SOAK_QPS); a
# client SIGKILLed at random moments, 100 times (SOAK_KILLS); a daemon
# stopped under load, 10 times. Each prints its figures (lines with SOAK)
# and the daemons' footprints before and after. SOAK_IMPAIR replaces the
# impairments (siwtun up --impair syntax) to look for a rare failure faster.
SOAK_TIME ?= 10m
soak: build
	SIWTUN_SOAK=1 SOAK_TIME=$(SOAK_TIME) $(GO) test -count=1 -v -timeout 90m -run '^TestSoak' ./test/

# The side-by-side benchmark (root): in namespaces it creates and removes,
# kernel TCP over veth, raw gVisor TCP between two daemons' stacks through
# their TUN devices, and siwtun's RDMA WRITE/READ/SEND bandwidth and
# latency with CRC on and off, at MTU 1500 and 9000; one table on stdout,
# the same as JSON in bench/results/; and Debian's ib_write_lat/ib_write_bw
# -R through libsiwtun next to siwtun perf (skipped without perftest).
# Then doc/performance.md shows the newest full run (go generate ./bench);
# commit the run's JSON with the page.
# BENCHFLAGS: e.g. --mtu 9000 -D 2, or --suites clib --rounds 5.
BENCHFLAGS ?=
bench: build
	./bin/siwtun bench --out bench/results $(BENCHFLAGS)
	$(GO) generate ./bench

# Go benchmarks: FPDU build/parse (0 allocs), CQ, RDMA WRITE next to raw TCP
# between two in-process stacks.
gobench:
	$(GO) test -run '^$$' -bench . -benchmem ./offload/... ./verbs/... ./netstack/ ./tun/...

# The demo: a Send, an RDMA Write and an RDMA Read between two RNICs. As
# root, two siwtun up daemons on TUN devices in a private network namespace
# it creates and removes; otherwise (or siwtun demo --in-process) two
# in-process RNICs on an in-memory link, with what crossed the wire.
demo:
	$(GO) run ./cmd/siwtun demo

# Interop with Linux's kernel siw (root): builds and boots the peer VM of
# ../shared/peer beside the checkout (or SIWPEER_SCRIPTS), runs rping both
# ways in every MPA mode, the markers and hostile-peer scenarios, captures
# and checks each with tshark, prints the table and stops the VM. Captures and the table go to
# SIWTUN_INTEROP_OUT (default: $$TMPDIR/siwtun-interop, emptied first).
SIWPEER_SCRIPTS ?=
interop:
	SIWTUN_INTEROP=1 SIWPEER_SCRIPTS=$(SIWPEER_SCRIPTS) $(GO) test -count=1 -v -timeout 30m -run '^TestInterop$$' ./test/interop/

clean:
	rm -rf bin
