#!/usr/bin/env bash
# Times commands in interleaved rounds (A B C A B C ...) instead of one after the other:
# on a machine whose speed drifts (shared hosts), every command then sees the same drift.
# Prints each command's minimum and median wall time and their ratios to the first one.
#
# usage: bench/interleaved.sh ROUNDS 'name=command' ['name=command' ...]
#   e.g. bench/interleaved.sh 15 'bare=./churn 5000000' 'fragscope=fragscope record -o t.fsc -- ./churn 5000000'
set -euo pipefail
rounds=$1
shift
samples=$(mktemp)
trap 'rm -f "$samples"' EXIT
for _ in $(seq 1 "$rounds"); do
  for spec in "$@"; do
    start=$(date +%s%N)
    bash -c "${spec#*=}" >/dev/null 2>&1
    end=$(date +%s%N)
    echo "${spec%%=*} $(((end - start) / 1000))" >>"$samples"
  done
done
python3 - "$rounds" "$samples" <<'PY'
import sys, statistics
rounds, path = sys.argv[1], sys.argv[2]
times = {}
for line in open(path):
    name, us = line.rsplit(" ", 1)
    times.setdefault(name, []).append(int(us) / 1000)
base = next(iter(times))
bmin, bmed = min(times[base]), statistics.median(times[base])
print(f"| run ({rounds} interleaved rounds) | min | median | min vs {base} | median vs {base} |")
print("|---|---|---|---|---|")
for name, t in times.items():
    mn, md = min(t), statistics.median(t)
    print(f"| {name} | {mn:.0f} ms | {md:.0f} ms | {mn / bmin:.2f}x | {md / bmed:.2f}x |")
PY
