#!/usr/bin/env bash
# The census of a mimalloc linked into a Rust program (tests/rust/linked_alloc, feature
# mimalloc: the mimalloc crate's default, mimalloc 3.x, and mimalloc-v2: its 2.x; the
# program prints mimalloc's area visitor):
# N boxes of 64-200 bytes (one in a thousand of 20-28 KiB), a tenth kept, on THREADS
# threads. `fragscope snapshot` takes it ROUNDS times; each round prints the stop as
# fragscope reports it and the census's figures against mimalloc's own (blocks in use and
# their bytes: 2.x's for one thread, 3.x's for all) and the usable bytes the program holds, and the program's
# state after it (never left stopped). Then `fragscope record` runs the program to its
# end with a snapshot every 200 ms (a census at each): its run time against the program
# alone, and the recording's census stops.
#
# usage: bench/mimalloc_linked.sh [N=4000000] [rounds=5] [THREADS=1] [BUILDS="mimalloc mimalloc-v2"]
# needs: a release build (cargo build --release), cargo (crates.io reachable once).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-4000000}
rounds=${2:-5}
threads=${3:-1}
builds=${4:-mimalloc mimalloc-v2}
fs=${FRAGSCOPE:-$PWD/target/release/fragscope}
for build in $builds; do
out=bench/out/mimalloc_linked/$build
mkdir -p "$out"
cargo build --release --locked --quiet --features "$build" \
  --manifest-path tests/rust/linked_alloc/Cargo.toml --target-dir "$out/target"
prog=$out/target/release/linked_alloc
coproc PROG { exec "$prog" "$n" 10 stdin "$threads"; }
declare -A own
read -r line <&"${PROG[0]}"
usable=$(echo "$line" | sed -E 's/.*, ([0-9]+) usable bytes/\1/')
while read -r line <&"${PROG[0]}"; do
  [[ $line == kept=* ]] && break
  [[ $line == *=* ]] && own[${line%%=*}]=${line#*=}
done
pid=$PROG_PID
echo "## $build: $n boxes, a tenth kept, $threads threads, pid $pid, $(grep VmRSS /proc/$pid/status)"
echo "mimalloc (its heap's areas): ${own[mi.pages]} pages, ${own[mi.blocks]} blocks, ${own[mi.used_bytes]} bytes used; the program holds $usable usable bytes"
for _ in $(seq 1 "$rounds"); do
  line=$("$fs" snapshot "$pid" -o "$out/snap.fsc" --force 2>&1 | grep 'was stopped for')
  figures=$("$fs" report "$out/snap.fsc" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
m, d = r["snapshot"]["mimalloc"], r["snapshots"][0]
print("census: %d pages, in use %d (+%d freed by other threads), live+rounding %d, free in used pages %d, other anonymous %.1f%% of RSS, read %d bytes"
      % (m["pages"], m["in_use_bytes"], m["thread_freed_bytes"], d["live"] + d["rounding"], d["free_in_used_pages"],
         100.0 * d["other_anon"] / d["rss"], m["heap"]["bytes_read"]))')
  state=$(awk '{print $3}' "/proc/$pid/stat")
  echo "${line#fragscope: }; $figures; state after: $state"
done
exec {PROG[1]}>&-
wait "$pid" || true

echo "## $build recorded: $n boxes, a tenth kept, held 2 s, a snapshot every 200 ms"
start=$(date +%s.%N)
"$prog" "$n" 10 2 "$threads" > /dev/null
alone=$(echo "$(date +%s.%N) - $start" | bc)
start=$(date +%s.%N)
"$fs" record -o "$out/rec.fsc" --force --snapshot-ms 200 -- "$prog" "$n" 10 2 "$threads" > /dev/null 2>&1
recorded=$(echo "$(date +%s.%N) - $start" | bc)
echo "run time: alone ${alone} s, recorded ${recorded} s"
"$fs" report "$out/rec.fsc" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
s = r.get("snapshot") or {}
d = r["snapshots"][r["focus_snapshot"]]
print("snapshots with a census: %d of %d; at the focus (%.2f s): live+rounding %d, other anonymous %.1f%% of RSS, its census stopped the program %.1f ms"
      % (len([x for x in r["snapshots"] if x["live"] > 0]), len(r["snapshots"]), d["t_ms"] / 1000,
         d["live"] + d["rounding"], 100.0 * d["other_anon"] / d["rss"], s["pause_ms"]))
print("headline:", r["headline"]["sentence"][:160])'
done
