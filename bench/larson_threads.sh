#!/usr/bin/env bash
# The larson-style load (tests/c/larson.c: threads swap fresh blocks of 8..1007 bytes
# into a shared 4096-slot array and free what another thread put there) at 2, 4 and 8
# threads: operations per second and CPU time, bare and recorded, in interleaved rounds.
# Ratios are "x fewer operations per second" (wall) and "x the CPU time" (user + system
# of the whole process tree, fragscope's recorder included) against bare, medians.
#
# usage: bench/larson_threads.sh [operations per thread=5000000] [rounds=5] [threads...]
# needs: a release build, heaptrack (scripts/install-deps.sh --bench).
set -euo pipefail
cd "$(dirname "$0")/.."
ops=${1:-5000000}
rounds=${2:-5}
shift $(($# < 2 ? $# : 2))
out=bench/out/larson_threads
mkdir -p "$out"
cc -O2 -pthread -o "$out/larson" tests/c/larson.c
cd "$out"
python3 - "$PWD/../../../target/release/fragscope" "$ops" "$rounds" "$@" <<'PY'
import os, statistics, subprocess, sys, time
fs, ops, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
threads = [int(t) for t in sys.argv[4:]] or [2, 4, 8]
runs = {
    "bare": lambda t: ["./larson", str(t), str(ops)],
    "fragscope": lambda t: [fs, "record", "-o", "rec.fsc", "--", "./larson", str(t), str(ops)],
    "stacks-all": lambda t: [fs, "record", "--stacks", "all", "-o", "all.fsc", "--", "./larson", str(t), str(ops)],
    "heaptrack": lambda t: ["heaptrack", "-o", "ht", "./larson", str(t), str(ops)],
}
rows = {}
for t in threads:
    for _ in range(rounds):
        for name, cmd in runs.items():
            start = time.perf_counter()
            p = subprocess.Popen(cmd(t), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _, _, ru = os.wait4(p.pid, 0)
            wall = time.perf_counter() - start
            rows.setdefault((t, name), []).append((wall, ru.ru_utime + ru.ru_stime))
            for f in os.listdir("."):
                if f.startswith("ht."):
                    os.remove(f)
print("| threads | run | median ops/s | x fewer ops/s than bare | x the CPU time of bare |")
print("|---|---|---|---|---|")
for t in threads:
    bw = statistics.median(w for w, _ in rows[(t, "bare")])
    bc = statistics.median(c for _, c in rows[(t, "bare")])
    for name in runs:
        w = statistics.median(x for x, _ in rows[(t, name)])
        c = statistics.median(x for _, x in rows[(t, name)])
        print(f"| {t} | {name} | {t * ops / w:,.0f} | {w / bw:.2f}x | {c / bc:.2f}x |")
PY
