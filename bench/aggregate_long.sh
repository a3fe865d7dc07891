#!/usr/bin/env bash
# A long run of a busy program, recorded in full and with --aggregate: trace size per
# minute, wall time against the bare run, the recorder's peak RSS, and whether the
# aggregated report's snapshots split RSS as the full one's do (live, rounding, free in
# used pages, free pages: each run's median over its snapshots, which differ between
# runs only by the program's own timing).
#   held_churn LIVE N: a heap of LIVE blocks, N times a random one freed and allocated
#   again (bench/c/held_churn.c): a block lives about LIVE replacements. Bare, on this
#   machine: 250 M calls a second with 4096 blocks, 34 M with 262144 (BENCHMARKS.md).
#   With RATE, at most RATE calls a second: a steady load, whose cost is the CPU time it
#   and fragscope take (user + system, the program and the recorder) rather than its
#   wall time, which the rate sets.
#
# usage: bench/aggregate_long.sh [N=300000000] [LIVE=4096] [rounds=3] [RATE]
# needs: a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-300000000}
live=${2:-4096}
rounds=${3:-3}
rate=${4:-0}
out=bench/out/aggregate_long
mkdir -p "$out"
cc -O2 -g -pthread -o "$out/held_churn" bench/c/held_churn.c
cd "$out"
python3 - "$PWD/../../../target/release/fragscope" "$n" "$live" "$rounds" "$rate" <<'PY'
import json, os, statistics, subprocess, sys, time
fs, n, live, rounds, rate = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
cmd = ["./held_churn", live, n, "1", rate]
modes = {
    "bare": lambda: cmd,
    "fragscope": lambda: [fs, "record", "--force", "-o", "full.fsc", "--"] + cmd,
    "fragscope --aggregate": lambda: [fs, "record", "--force", "--aggregate", "-o", "agg.fsc", "--"] + cmd,
}
rows = {}
parts = ("live", "rounding", "free_in_used_pages", "free_resident_pages")
for _ in range(rounds):
    for mode, argv in modes.items():
        t = time.monotonic()
        p = subprocess.Popen(argv(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t
        trace = {"fragscope": "full.fsc", "fragscope --aggregate": "agg.fsc"}.get(mode)
        size, split = 0, None
        if trace:
            size = os.path.getsize(trace)
            r = json.loads(subprocess.run([fs, "report", "--json", trace], capture_output=True, check=True).stdout)
            snaps = [s for s in r["snapshots"] if s["reason"] == "periodic"]
            split = {k: statistics.median(s[k] for s in snaps) for k in parts}
            os.remove(trace)
        cpu = ru.ru_utime + ru.ru_stime
        rows.setdefault(mode, []).append((wall, size, ru.ru_maxrss, split, cpu))
bare = statistics.median(w for w, *_ in rows["bare"])
bare_cpu = statistics.median(x[4] for x in rows["bare"])
paced = f", at most {rate} calls a second" if float(rate) > 0 else ""
print(f"held_churn {live} {n}{paced}, {rounds} interleaved rounds; bare {bare:.1f} s, {bare_cpu:.1f} s of CPU")
print("| run | wall time | x bare | CPU time | x bare | trace | trace per minute | peak RSS (recorder or program) | median snapshot: live / rounding / free in used pages / free pages |")
print("|---|---|---|---|---|---|---|---|---|")
for mode, rs in rows.items():
    w = statistics.median(x[0] for x in rs)
    cpu = statistics.median(x[4] for x in rs)
    size = statistics.median(x[1] for x in rs)
    rss = statistics.median(x[2] for x in rs) / 1024
    split = rs[len(rs) // 2][3]
    per_min = size / w * 60 / 1e6
    cells = " / ".join(f"{split[k] / 2**20:.2f}" for k in parts) + " MiB" if split else "-"
    print(f"| {mode} | {w:.1f} s | {w / bare:.2f}x | {cpu:.1f} s | {cpu / bare_cpu:.2f}x | {size / 1e6:.1f} MB | {per_min:.1f} MB | {rss:.0f} MiB | {cells} |")
PY
