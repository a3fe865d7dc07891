#!/usr/bin/env bash
# `fragscope report` on a pre-fork server's trace: a parent holding BLOCKS small blocks
# forks WORKERS workers, each of which frees and allocates a few (bench/c/prefork_many.c).
# Each worker starts from its parent's heap, so the analysis follows BLOCKS live blocks in
# every process. Wall time and peak RSS of the report of one worker (--pid) and of the
# default report, in ROUNDS interleaved rounds (min and median of each), for this build
# and, with BEFORE=..., an older one side by side, with the ratios new / old.
#
# usage: [BEFORE=path/to/an/older/fragscope] [ROUNDS=5] bench/prefork_report.sh [blocks=2000000] [workers=8]
# needs: GNU time, a C compiler, a release build (in $CARGO_TARGET_DIR when it is set).
set -euo pipefail
# Resolved before the cd below, so that a path relative to the caller works.
before=${BEFORE:+$(realpath "$BEFORE")}
cd "$(dirname "$0")/.."
blocks=${1:-2000000}
workers=${2:-8}
rounds=${ROUNDS:-5}
out=$PWD/bench/out
mkdir -p "$out"
cargo build --release -q -p fragscope
fs=${CARGO_TARGET_DIR:-$PWD/target}/release/fragscope
cc -O2 -g -o "$out/prefork_many" bench/c/prefork_many.c
cd "$out"
"$fs" record -o prefork.fsc -- ./prefork_many "$blocks" "$workers" > prefork.workers
worker=$(tail -1 prefork.workers | awk '{print $2}')

builds=("new $fs")
[[ -n "$before" ]] && builds+=("old $before")
measure() { # label, command...: "label wall_s max_rss_kib" of one run
  local label=$1; shift
  /usr/bin/time -f "%e %M" -o time.txt "$@" > /dev/null 2>&1
  echo "$label $(cat time.txt)"
}
: > prefork_report.txt
for ((r = 0; r < rounds; r++)); do
  for b in "${builds[@]}"; do
    read -r name bin <<< "$b"
    measure "$name worker" "$bin" report prefork.fsc --pid "$worker" >> prefork_report.txt
    measure "$name all" "$bin" report prefork.fsc >> prefork_report.txt
  done
done

python3 - "$blocks" "$workers" "$rounds" <<'PY'
import statistics, sys
blocks, workers, rounds = sys.argv[1:]
runs = {}
for line in open("prefork_report.txt"):
    build, what, wall, rss = line.split()
    runs.setdefault((build, what), []).append((float(wall), int(rss)))
print(f"{int(blocks):,} blocks in the parent, {workers} workers, {rounds} interleaved rounds\n")
print("| report | build | wall min | wall median | peak RSS (median) | wall vs old (median) | RSS vs old |")
print("|---|---|---|---|---|---|---|")
for what, title in [("worker", "--pid WORKER"), ("all", "default (every process)")]:
    old = runs.get(("old", what))
    for build in ["old", "new"]:
        r = runs.get((build, what))
        if not r:
            continue
        walls, rss = [w for w, _ in r], statistics.median(m for _, m in r)
        wall_med = statistics.median(walls)
        vs = ("-", "-")
        if old and build == "new":
            old_wall = statistics.median(w for w, _ in old)
            old_rss = statistics.median(m for _, m in old)
            vs = (f"{wall_med / old_wall:.2f}x", f"{rss / old_rss:.2f}x")
        print(f"| {title} | {build} | {min(walls):.2f} s | {wall_med:.2f} s | "
              f"{rss / 1024:.0f} MiB | {vs[0]} | {vs[1]} |")
PY
