#!/usr/bin/env bash
# The Go heap census: how long `fragscope snapshot` holds a Go program per GiB of heap,
# and how its figures compare with the program's own runtime.MemStats; then what
# recording a Go program costs (the census at every snapshot is its only observer).
#
# 1. tests/go/keep_tenth (N records, a tenth kept, collected, then held still) at each N,
#    snapshotted ROUNDS times: the stop as fragscope reports it, and HeapAlloc, HeapInuse
#    and HeapIdle as the census counts them against the program's own.
# 2. bench/go/churn (rounds of mixed allocations with a rolling window of survivors):
#    bare against `fragscope record` (a census at every snapshot), interleaved rounds.
#
# usage: bench/go_census.sh ["2000000 8000000 16000000"] [rounds=3] [churn rounds=10]
# GO_BUILD_FLAGS (e.g. '-ldflags=-s -w', as programs are shipped: no symbol table, no
# DWARF) is passed to go build of both programs; GOTOOLCHAIN chooses the release.
# needs: go (1.22 or newer), a release build (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
sizes=${1:-2000000 8000000 16000000}
rounds=${2:-3}
churn_rounds=${3:-10}
out=bench/out/go_census
mkdir -p "$out"
fs=$root/target/release/fragscope
flags=()
[[ -n ${GO_BUILD_FLAGS:-} ]] && flags=("$GO_BUILD_FLAGS")
(cd tests/go/keep_tenth && go build -o "$root/$out/keep_tenth" "${flags[@]}" .)
(cd bench/go/churn && go build -o "$root/$out/churn" "${flags[@]}" .)
cd "$out"
echo "| records | heap (HeapSys) | snapshot, whole command | stop | stop per GiB | HeapAlloc census / own | HeapInuse census / own | HeapIdle census / own |"
echo "|---|---|---|---|---|---|---|---|"
for n in $sizes; do
  rm -f stats.json
  coproc PROG { exec ./keep_tenth stats.json "$n"; }
  while read -r line <&"${PROG[0]}"; do
    [[ $line == ready* ]] && break
  done
  pid=$PROG_PID
  for _ in $(seq 1 "$rounds"); do
    start=$(date +%s%N)
    "$fs" snapshot "$pid" -o snap.fsc --force 2>stop.txt
    wall_ms=$(( ($(date +%s%N) - start) / 1000000 ))
    "$fs" report snap.fsc --json | python3 -c '
import json, re, sys
own = json.load(open("stats.json"))
go = json.load(sys.stdin)["snapshots"][0]["go"]
stop = re.search(r"stopped for ([0-9.]+) ms", open("stop.txt").read()).group(1)
gib = own["HeapSys"] / 2**30
r = lambda k, o: "%.4f" % (go[k] / own[o])
print("| %s | %.0f MiB | %s ms | %s ms | %.0f ms | %s | %s | %s |" % (sys.argv[1], own["HeapSys"] / 2**20,
      sys.argv[2], stop, float(stop) / gib, r("heap_alloc", "HeapAlloc"), r("heap_in_use", "HeapInuse"),
      r("heap_idle", "HeapIdle")))' "$n" "$wall_ms"
    state=$(awk '{print $3}' "/proc/$pid/stat")
    [[ $state == T ]] && { echo "process $pid left stopped" >&2; exit 1; }
  done
  kill "$pid"
  wait "$pid" 2>/dev/null || true
done
echo
"$root/bench/interleaved.sh" "$churn_rounds" \
  "bare=./churn" \
  "fragscope record=$fs record -o churn.fsc --force -- ./churn"
"$fs" report churn.fsc --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
gos = [s["go"] for s in r["snapshots"] if s.get("go")]
print("\nlast recording: %d snapshots with a Go census, pause %.1f-%.1f ms" % (
    len(gos), min(g["pause_ms"] for g in gos), max(g["pause_ms"] for g in gos)))'
