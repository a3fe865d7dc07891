#!/usr/bin/env bash
# record -p: what recording a running program costs it, measured from inside (operations
# per second of tests/c/attach_target.c's workers, 1-second windows), and how long the
# attach holds it: before, while fragscope records it, and after it detached.
#
# usage: bench/attach.sh [threads=4] [rounds=3]
# needs: a release build (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-4}
rounds=${2:-3}
out=bench/out/attach
mkdir -p "$out"
cc -O2 -pthread -o "$out/attach_target" tests/c/attach_target.c
fs=$PWD/target/release/fragscope
python3 - "$out/attach_target" "$fs" "$threads" "$rounds" "$out" <<'PY'
import subprocess, sys, time, statistics
exe, fs, threads, rounds, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
def ops(p):
    p.stdin.write("count\n"); p.stdin.flush()
    return int(p.stdout.readline().split()[1])
def rate(p, seconds=1.0):
    a, t = ops(p), time.time()
    time.sleep(seconds)
    return (ops(p) - a) / (time.time() - t)
rows = []
for r in range(rounds):
    p = subprocess.Popen([exe, threads], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    before = rate(p)
    t0 = time.time()
    rec = subprocess.Popen([fs, "record", "-p", str(p.pid), "--duration", "3", "-o", f"{out}/run{r}.fsc"],
                           stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    during = rate(p)
    rec.wait()
    attach_total = time.time() - t0
    after = rate(p)
    p.stdin.write("quit\n"); p.stdin.flush(); p.wait()
    rows.append((before, during, after, attach_total))
print(f"| round | before (ops/s) | while recorded | after detach | recorded / before | record -p wall (3 s asked) |")
print("|---|---|---|---|---|---|")
for i, (b, d, a, w) in enumerate(rows):
    print(f"| {i+1} | {b:,.0f} | {d:,.0f} | {a:,.0f} | {b/d:.2f}x fewer | {w:.2f} s |")
PY
