#!/usr/bin/env bash
# The larson-style load (tests/c/larson.c: threads swap fresh blocks of 8..1007 bytes
# into a shared 4096-slot array and free what another thread put there) at 2, 4 and 8
# threads: operations per second and CPU time, bare and recorded, in interleaved rounds.
# Ratios are "x fewer operations per second" (wall) and "x the CPU time" (user + system,
# fragscope's recorder included) against the bare run of the same round.
#
# usage: bench/larson_threads.sh [operations per thread=1000000] [rounds=5] [threads...]
# needs: a release build, heaptrack (scripts/install-deps.sh --bench).
set -euo pipefail
cd "$(dirname "$0")/.."
ops=${1:-1000000}
rounds=${2:-5}
shift 2 || true
threads=("${@:-2 4 8}")
[ $# -eq 0 ] && threads=(2 4 8)
out=bench/out/larson_threads
mkdir -p "$out"
cc -O2 -pthread -o "$out/larson" tests/c/larson.c
fs=$PWD/target/release/fragscope
cd "$out"
samples=$(mktemp)
trap 'rm -f "$samples"' EXIT
for t in "${threads[@]}"; do
  for _ in $(seq 1 "$rounds"); do
    for run in bare fragscope stacks-all heaptrack; do
      case $run in
        bare) cmd=(./larson "$t" "$ops") ;;
        fragscope) cmd=("$fs" record -o rec.fsc -- ./larson "$t" "$ops") ;;
        stacks-all) cmd=("$fs" record --stacks all -o all.fsc -- ./larson "$t" "$ops") ;;
        heaptrack) cmd=(heaptrack -o ht ./larson "$t" "$ops") ;;
      esac
      /usr/bin/time -f "%e %U %S" -o time.txt "${cmd[@]}" >/dev/null 2>&1
      echo "$t $run $(cat time.txt)" >>"$samples"
      rm -f ht*.zst ht*.gz
    done
  done
done
python3 - "$ops" "$samples" <<'PY'
import sys, statistics
ops, path = int(sys.argv[1]), sys.argv[2]
rows = {}
for line in open(path):
    t, run, wall, user, sys_ = line.split()
    rows.setdefault((int(t), run), []).append((float(wall), float(user) + float(sys_)))
print("| threads | run | median ops/s | x fewer ops/s than bare | x the CPU time of bare |")
print("|---|---|---|---|---|")
for t in sorted({k[0] for k in rows}):
    bare_wall = statistics.median(w for w, _ in rows[(t, "bare")])
    bare_cpu = statistics.median(c for _, c in rows[(t, "bare")])
    for run in ("bare", "fragscope", "stacks-all", "heaptrack"):
        w = statistics.median(x for x, _ in rows[(t, run)])
        c = statistics.median(x for _, x in rows[(t, run)])
        print(f"| {t} | {run} | {t * ops / w:,.0f} | {w / bare_wall:.2f}x | {c / bare_cpu:.2f}x |")
PY
