#!/usr/bin/env bash
# Server-shaped loads whose threads keep every core busy, bare and recorded, in
# interleaved rounds: what recording costs when there is no spare core for the recorder.
#   larson_handover      Larson's server load: threads free and allocate 8..1000-byte
#                        blocks in arrays of their own, each handing its array to a
#                        successor thread after ROUNDS operations (frees cross threads).
#   producer_consumer    one thread allocates, another frees what it handed over.
#   thread_per_request   a thread started per request (8 at once), a shared cache.
# Recorded by default, with --stacks all and with --aggregate (the calls summed between
# snapshots by the recorder). Each program prints its own throughput; the table gives the median, how many times
# fewer operations a second than bare, the CPU time of the whole process tree against
# bare (the recorder's included), and the trace's size.
#
# usage: bench/server_loads.sh [rounds=5] [scale=1]   (scale multiplies each load's work)
# needs: a release build, heaptrack (scripts/install-deps.sh --bench).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
scale=${2:-1}
out=bench/out/server_loads
mkdir -p "$out"
for p in larson_handover producer_consumer thread_per_request; do
  cc -O2 -pthread -o "$out/$p" "bench/c/$p.c"
done
cd "$out"
python3 - "$PWD/../../../target/release/fragscope" "$rounds" "$scale" <<'PY'
import os, re, statistics, subprocess, sys, time
fs, rounds, scale = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
loads = {
    "larson_handover": ["./larson_handover", "2", str(int(500000 * scale)), "8"],
    "producer_consumer": ["./producer_consumer", str(int(5000000 * scale))],
    "thread_per_request": ["./thread_per_request", str(int(100000 * scale)), "8"],
}
modes = {
    "bare": lambda cmd: cmd,
    "fragscope": lambda cmd: [fs, "record", "--force", "-o", "rec.fsc", "--"] + cmd,
    "fragscope --stacks all": lambda cmd: [fs, "record", "--force", "--stacks", "all", "-o", "all.fsc", "--"] + cmd,
    "fragscope --aggregate": lambda cmd: [fs, "record", "--force", "--aggregate", "-o", "agg.fsc", "--"] + cmd,
    "heaptrack": lambda cmd: ["heaptrack", "-o", "ht", "--"] + cmd,
}
rate = re.compile(rb"^(\d+) \S+/s$", re.M)
rows = {}
for _ in range(rounds):
    for load, cmd in loads.items():
        for mode, wrap in modes.items():
            p = subprocess.Popen(wrap(cmd), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            said = p.stdout.read()
            _, _, ru = os.wait4(p.pid, 0)
            m = rate.findall(said)
            size = 0
            for f in os.listdir("."):
                if f.startswith("ht") or f.endswith(".fsc"):
                    size += os.path.getsize(f)
                    os.remove(f)
            rows.setdefault((load, mode), []).append(
                (int(m[-1]) if m else 0, ru.ru_utime + ru.ru_stime, size))
print(f"{rounds} interleaved rounds, scale {scale}")
print("| load | run | median throughput | x fewer a second than bare | x the CPU time of bare | trace |")
print("|---|---|---|---|---|---|")
for load in loads:
    bare = statistics.median(r for r, _, _ in rows[(load, "bare")])
    bare_cpu = statistics.median(c for _, c, _ in rows[(load, "bare")])
    for mode in modes:
        rs = rows[(load, mode)]
        r = statistics.median(x for x, _, _ in rs)
        c = statistics.median(x for _, x, _ in rs)
        mb = statistics.median(x for _, _, x in rs) / 1e6
        print(f"| {load} | {mode} | {r:,.0f} | {bare / max(r, 1):.2f}x | {c / bare_cpu:.2f}x | "
              + (f"{mb:.1f} MB |" if mode != "bare" else "- |"))
PY
