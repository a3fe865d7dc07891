#!/usr/bin/env bash
# Many threads handing blocks to each other (tests/c/larson.c, a larson-style server load),
# recorded with the default options:
#  1. order: for 48, 128 and 256 threads under glibc and 64 under jemalloc, saturating and
#     in bursts (a thread pool: 2000 operations, then a 20-40 ms sleep), the merge's forced,
#     unknown, late and lost calls (all must be 0), the calls that waited on disk, and what
#     is live at the end: the program frees all its blocks, so the other threads' must be
#     0 and the main thread's only libc's own (examples/check_order);
#  2. analysis: `fragscope report` time and peak memory on the 256-thread trace beside a
#     2-thread trace of the same number of calls;
#  3. recording: bare, fragscope record and heaptrack at 128 threads, interleaved rounds.
#
# usage: bench/many_threads.sh [operations per thread=50000] [rounds=5]
# needs: a release build, libjemalloc, heaptrack (scripts/install-deps.sh --bench).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
ops=${1:-50000}
rounds=${2:-5}
out=bench/out/many_threads
mkdir -p "$out"
rm -f "$out"/*.fsc "$out"/heaptrack.*
cargo build --release -q -p fragscope -p fragscope-trace --example check_order
fs=$PWD/target/release/fragscope
check=$PWD/target/release/examples/check_order
cc -O2 -pthread -o "$out/larson" tests/c/larson.c
jemalloc=$(ls /usr/lib/*/libjemalloc.so.2 | head -1)
cd "$out"

echo "## 1. order ($ops operations per thread; bursty runs: ${ops} / 2000 bursts)"
echo
echo "| run | calls | forced | unknown | late | lost | spilled | live at end: main thread | other threads |"
echo "|---|---|---|---|---|---|---|---|---|"
run() { # name threads mode [preload]
  local name=$1 threads=$2 mode=$3 preload=${4:-}
  LD_PRELOAD=$preload "$fs" record -o "$name.fsc" -- ./larson "$threads" "$ops" "$mode" 2>/dev/null
  "$check" "$name.fsc" | tail -2 | python3 -c '
import re, sys
name, calls = sys.argv[1], sys.argv[2]
live, stats = sys.stdin.read().splitlines()
s = dict(re.findall(r"(\w+): (\d+)", stats))
l = re.findall(r"(\d+) bytes in (\d+) blocks", live)
cols = [name, calls] + [s[k] for k in ("forced_allocs", "unknown_frees", "late", "lost_events", "spilled")]
cols += ["%s B in %s" % l[0], "%s B in %s" % l[1]]
print("| " + " | ".join(cols) + " |")
' "$name" "$("$fs" info "$name.fsc" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["events"])')"
}
for n in 48 128 256; do
  run "glibc-$n" "$n" saturate
  run "glibc-$n-bursts" "$n" bursts
done
run "jemalloc-64" 64 saturate "$jemalloc"
run "jemalloc-64-bursts" 64 bursts "$jemalloc"

echo
echo "## 2. fragscope report: 256 threads beside 2 threads, same calls (best of 3)"
echo
"$fs" record -o two.fsc -- ./larson 2 $((ops * 128)) 2>/dev/null
echo "| trace | calls | report time | report peak RSS |"
echo "|---|---|---|---|"
for t in glibc-256 two; do
  best=""
  for _ in 1 2 3; do
    /usr/bin/time -f "%e %M" -o time.txt "$fs" report "$t.fsc" >/dev/null 2>&1
    read -r secs kib <time.txt
    if [ -z "$best" ] || python3 -c "import sys; sys.exit(not ($secs < ${best% *}))"; then best="$secs $kib"; fi
  done
  calls=$("$fs" info "$t.fsc" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["events"])')
  echo "| $t | $calls | ${best% *} s | $((${best#* } / 1024)) MiB |"
done

echo
echo "## 3. recording at 128 threads"
echo
"$root/bench/interleaved.sh" "$rounds" \
  "bare=./larson 128 $ops" \
  "fragscope=$fs record -o rec.fsc -- ./larson 128 $ops" \
  "heaptrack=heaptrack -o heaptrack.rec ./larson 128 $ops"
