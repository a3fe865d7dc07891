#!/usr/bin/env bash
# How long `fragscope snapshot` holds a process on Debian's jemalloc (5.3.0), and how its
# census compares with jemalloc's own figures: tests/c/jemalloc_keep_tenth.c (N blocks,
# most of 16-400 bytes, a tenth kept) is snapshotted ROUNDS times; each round prints the
# stop as fragscope reports it and the census's allocated, resident, slab-free and dirty
# figures against the program's mallctl stats, and the program's state after it (running
# or sleeping, never left stopped).
#
# usage: bench/jemalloc_snapshot.sh [N=4000000] [rounds=5]
# needs: a release build (cargo build --release), libjemalloc-dev.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-4000000}
rounds=${2:-5}
out=bench/out/jemalloc_snapshot
mkdir -p "$out"
cc -O2 -pthread -o "$out/jemalloc_keep_tenth" tests/c/jemalloc_keep_tenth.c -ljemalloc
fs=${FRAGSCOPE:-$PWD/target/release/fragscope}
coproc PROG { exec "$out/jemalloc_keep_tenth" "$n"; }
declare -A own
while read -r line <&"${PROG[0]}"; do
  [[ $line == kept=* ]] && break
  [[ $line == *=* ]] && own[${line%%=*}]=${line#*=}
done
pid=$PROG_PID
echo "## $n blocks, a tenth kept, pid $pid, $(grep VmRSS /proc/$pid/status)"
echo "jemalloc: allocated ${own[stats.allocated]}, resident ${own[stats.resident]}, free regions ${own[bins.free_regions]}, dirty pages ${own[stats.arenas.4096.pdirty]}"
for _ in $(seq 1 "$rounds"); do
  line=$("$fs" snapshot "$pid" -o "$out/snap.fsc" --force 2>&1 | grep 'was stopped for')
  figures=$("$fs" report "$out/snap.fsc" --json | python3 -c '
import json, sys
j = json.load(sys.stdin)["snapshot"]["jemalloc"]
h = j["heap"]
print("census: allocated %d, resident %d, free regions %d, dirty pages %d, read %d bytes"
      % (j["allocated_bytes"], j["resident_bytes"],
         sum(b["free_regions"] for b in h["bins"]),
         sum(a["dirty_pages"] for a in h["arenas"]), h["bytes_read"]))')
  state=$(awk '{print $3}' "/proc/$pid/stat")
  echo "${line#fragscope: }; $figures; state after: $state"
done
exec {PROG[1]}>&-
wait "$pid" || true
