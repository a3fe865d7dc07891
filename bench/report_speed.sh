#!/usr/bin/env bash
# Analysis speed and memory: `fragscope report` on a trace of churn.c with 2*n calls
# (default n = 50 M: 100 M calls), side by side with heaptrack_print on heaptrack's trace
# of the same program: wall time, calls/s, CPU time (user + system: `report` decodes the
# trace on a second thread when the machine has a second core) and peak RSS.
#
# usage: bench/report_speed.sh [path/to/churn.c] [n=50000000]
#   BEFORE=path/to/an/older/fragscope adds its report of the same trace, side by side.
# needs: heaptrack (scripts/install-deps.sh --bench), GNU time, a release build.
set -euo pipefail
# Resolved before the cd below, so that a path relative to the caller works.
before=${BEFORE:+$(realpath "$BEFORE")}
cd "$(dirname "$0")/.."
src=${1:-../shared/cases/churn.c}
n=${2:-50000000}
out=bench/out
mkdir -p "$out"
cargo build --release -q -p fragscope
fs=$PWD/target/release/fragscope
cc -O2 -g -o "$out/churn" "$src"
cd "$out"
rm -f report.fsc heaptrack.report.*
"$fs" record -o report.fsc -- ./churn "$n" >/dev/null
heaptrack -o heaptrack.report ./churn "$n" >/dev/null 2>&1
ht=$(ls heaptrack.report.* | head -1)
measure() { # name, command...: wall seconds, CPU seconds and peak RSS (KiB) of one run
  local name=$1; shift
  /usr/bin/time -f "%e %U %S %M" -o time.txt "$@" >/dev/null 2>&1
  read -r wall user sys rss < time.txt
  echo "$name $wall $(python3 -c "print($user + $sys)") $rss"
}
{
  measure "fragscope-report" "$fs" report report.fsc
  measure "fragscope-report-json" "$fs" report --json report.fsc
  if [[ -n "$before" ]]; then
    measure "fragscope-report-before" "$before" report report.fsc
  fi
  measure "heaptrack_print" heaptrack_print "$ht"
} > speed.txt
calls=$("$fs" info --json report.fsc | python3 -c 'import json,sys; print(json.load(sys.stdin)["events"])')
python3 - "$calls" "$(stat -c %s report.fsc)" "$(stat -c %s "$ht")" <<'PY'
import sys
calls, fsc_bytes, ht_bytes = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rows = [l.split() for l in open("speed.txt")]
print(f"trace: {calls/1e6:.1f} M calls; fragscope {fsc_bytes/2**20:.1f} MiB, heaptrack {ht_bytes/2**20:.1f} MiB\n")
print("| analysis | wall time | calls/s | CPU time | peak RSS |")
print("|---|---|---|---|---|")
for name, wall, cpu, rss in rows:
    wall = float(wall)
    print(f"| {name} | {wall:.2f} s | {calls/wall/1e6:.1f} M/s | {float(cpu):.2f} s | {int(rss)/1024:.0f} MiB |")
PY
