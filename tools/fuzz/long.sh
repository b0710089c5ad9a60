#!/usr/bin/env bash
# make fuzz-long: every native fuzz target of the tree (go test -list
# '^Fuzz' over every package), each for FUZZTIME (default 10m), one after
# the other; then a table of what each run did, taken from the fuzzer's own
# last status line: executions, "new interesting" inputs (inputs that
# reached new coverage during this run, beyond the seed corpus and the
# cached corpus of earlier runs in $(go env GOCACHE)/fuzz) and the corpus
# size it ended with, and whether it found a crash (the failing input is
# then in the package's testdata/fuzz/<target>/, as go test says).
#
# Environment: FUZZTIME (a duration or Nx for N executions, as go test's
# -fuzztime takes it), FUZZPARALLEL (go test's -parallel; default
# GOMAXPROCS), FUZZMINTIME (go test's -fuzzminimizetime, default 60s: the
# time spent minimizing each new interesting input, during which no
# executions are counted; short runs may want it shorter), FUZZLOG (the directory for each target's full output;
# default a temporary one), FUZZPKGS (packages; default ./...),
# FUZZMATCH (a grep -E pattern a target's "package target" must match).
set -uo pipefail
cd "$(dirname "$0")/../.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-10m}
FUZZLOG=${FUZZLOG:-$(mktemp -d "${TMPDIR:-/tmp}/siwtun-fuzz-long.XXXXXX")}
FUZZMATCH=${FUZZMATCH:-.}
mkdir -p "$FUZZLOG"
par=()
[ -n "${FUZZPARALLEL:-}" ] && par=(-parallel "$FUZZPARALLEL")
[ -n "${FUZZMINTIME:-}" ] && par+=(-fuzzminimizetime "$FUZZMINTIME")

targets=()
for pkg in $($GO list ${FUZZPKGS:-./...}); do
	for f in $($GO test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
		if echo "$pkg $f" | grep -Eq -- "$FUZZMATCH"; then
			targets+=("$pkg $f")
		fi
	done
done
echo "fuzz-long: ${#targets[@]} targets, -fuzztime $FUZZTIME each ${par[*]}; logs in $FUZZLOG"
start=$(date +%s)
rows=()
failed=0
for t in "${targets[@]}"; do
	set -- $t
	pkg=$1 f=$2
	log="$FUZZLOG/$(echo "${pkg#github.com/siwtun/siwtun/}" | tr / _)_$f.log"
	echo "fuzz-long: $pkg $f"
	t0=$(date +%s)
	$GO test -run '^$' -fuzz "^$f\$" -fuzztime "$FUZZTIME" "${par[@]}" "$pkg" >"$log" 2>&1
	rc=$?
	secs=$(($(date +%s) - t0))
	# The last status line: "fuzz: elapsed: 1m0s, execs: 123456 (2057/sec),
	# new interesting: 3 (total: 120)".
	last=$(grep -E '^fuzz: elapsed: .*execs: ' "$log" | tail -n 1)
	execs=$(echo "$last" | sed -nE 's/.*execs: ([0-9]+).*/\1/p')
	# The rate over the whole run: the last line's own rate is that of its
	# last 3 s.
	el=$(echo "$last" | sed -nE 's/^fuzz: elapsed: ([0-9hms.]+),.*/\1/p')
	elsecs=$(echo "$el" | awk '{ s = 0; n = $0; if (match(n, /[0-9]+h/)) s += 3600 * substr(n, RSTART, RLENGTH - 1); if (match(n, /[0-9]+m/)) s += 60 * substr(n, RSTART, RLENGTH - 1); if (match(n, /[0-9.]+s/)) s += substr(n, RSTART, RLENGTH - 1); print s }')
	rate=$(awk -v e="${execs:-0}" -v s="${elsecs:-0}" 'BEGIN { if (s > 0) printf "%d", e / s; else print "?" }')
	newi=$(echo "$last" | sed -nE 's/.*new interesting: ([0-9]+).*/\1/p')
	total=$(echo "$last" | sed -nE 's/.*\(total: ([0-9]+)\).*/\1/p')
	crash=0
	if [ $rc -ne 0 ] && ! grep -q 'Failing input written to' "$log" && grep -q '^    context deadline exceeded$' "$log"; then
		# Go 1.26's fuzzing coordinator race at the end of a duration
		# (golang/go#75804; see tools/fuzz/run.sh): no input failed.
		echo "fuzz-long: $pkg $f: \"context deadline exceeded\" with no failing input (golang/go#75804), not a crash"
	elif [ $rc -ne 0 ]; then
		crash=1
		failed=$((failed + 1))
		echo "fuzz-long: $pkg $f FAILED (exit $rc); its output:"
		tail -n 40 "$log"
	fi
	rows+=("$(printf '%-46s %-20s %6ss %12s %8s %6s %7s %7s' "${pkg#github.com/siwtun/siwtun/}" "$f" "$secs" "${execs:-?}" "${rate:-?}" "${newi:-?}" "${total:-?}" "$crash")")
done
echo
echo "fuzz-long: -fuzztime $FUZZTIME ${par[*]}, $(($(date +%s) - start)) s in all, $(date -u +%Y-%m-%dT%H:%MZ), $($GO version | cut -d' ' -f3), $(nproc) CPUs"
printf '%-46s %-20s %7s %12s %8s %6s %7s %7s\n' PACKAGE TARGET TIME EXECS EXECS/S NEW CORPUS CRASHES
for r in "${rows[@]}"; do echo "$r"; done
echo "fuzz-long: $failed of ${#targets[@]} targets failed"
[ $failed -eq 0 ]
