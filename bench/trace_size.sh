#!/usr/bin/env bash
# Trace size, its spread from run to run, and what it costs, per packing mode, beside
# heaptrack, on the workloads of bench/ and tests/c/: each command runs ROUNDS times in
# interleaved rounds (bare, fragscope default, --pack=never, --pack=always, heaptrack,
# bare, ...). Prints, per workload and mode, the median trace size, bytes per call, the
# spread of the size ((max - min) / median), the size against heaptrack's, and the median
# wall and CPU time (user + system of the whole process tree) against the bare run.
#
# usage: bench/trace_size.sh [rounds=5] [workload...]
#   workloads: churn larson paced reuse stacks compile (default: all)
#   BEFORE=path/to/an/older/fragscope adds its default mode, side by side.
# needs: a release build (cargo build --release -p fragscope), heaptrack
#        (scripts/install-deps.sh --bench), ../shared/cases/churn.c.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=${1:-5}
shift $(($# < 1 ? $# : 1))
out=bench/out/trace_size
mkdir -p "$out"
cc -O2 -o "$out/churn" ../shared/cases/churn.c
cc -O2 -pthread -o "$out/larson" tests/c/larson.c
cc -O2 -o "$out/paced" tests/c/paced.c
cc -O2 -pthread -o "$out/reuse_threads" tests/c/reuse_threads.c
cc -O1 -fno-omit-frame-pointer -o "$out/many_stacks" tests/c/many_stacks.c
# A real program nobody here wrote: GCC's compiler proper (one process) on the
# interposer's preprocessed source.
cc -E -o "$out/preload.i" crates/fragscope-record/preload/fragscope_preload.c
cc1=$(cc -print-prog-name=cc1)
cd "$out"
python3 - "$root/target/release/fragscope" "$rounds" "$cc1" "$@" <<'PY'
import glob, json, os, statistics, subprocess, sys, time
fs, rounds, cc1 = sys.argv[1], int(sys.argv[2]), sys.argv[3]
workloads = {
    "churn": ["./churn", "5000000"],
    "larson": ["./larson", "2", "1000000"],
    "paced": ["./paced", "40", "30000", "5000"],
    "reuse": ["./reuse_threads", "8", "200000"],
    "stacks": ["./many_stacks", "3000000"],
    "compile": [cc1, "-quiet", "-O2", "-fpreprocessed", "preload.i", "-o", "/dev/null"],
}
chosen = sys.argv[4:] or list(workloads)
modes = {
    "bare": lambda w: w,
    "default": lambda w: [fs, "record", "-o", "t.fsc", "--"] + w,
    "--pack=never": lambda w: [fs, "record", "--pack=never", "-o", "t.fsc", "--"] + w,
    "--pack=always": lambda w: [fs, "record", "--pack=always", "-o", "t.fsc", "--"] + w,
    "heaptrack": lambda w: ["heaptrack", "-o", "ht"] + w,
}
if os.environ.get("BEFORE"):
    modes["default, before"] = lambda w: [os.environ["BEFORE"], "record", "-o", "t.fsc", "--"] + w

def run(cmd):
    for f in glob.glob("ht.*") + ["t.fsc"]:
        if os.path.exists(f):
            os.remove(f)
    start = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - start
    cpu = ru.ru_utime + ru.ru_stime
    size, calls = None, None
    if os.path.exists("t.fsc"):
        info = json.loads(subprocess.check_output([fs, "info", "t.fsc", "--json"]))
        size, calls = info["file_bytes"], info["events"]
    elif cmd[0] == "heaptrack":
        # heaptrack writes one file per process (ht.PID.zst, or ht.zst).
        size = sum(os.path.getsize(f) for f in glob.glob("ht.*") if os.path.isfile(f))
    return wall, cpu, size, calls

print(f"| workload | mode | trace (median) | bytes/call | size spread | vs heaptrack | wall vs bare | CPU vs bare |")
print("|---|---|---|---|---|---|---|---|")
for name in chosen:
    w = workloads[name]
    rows = {m: [] for m in modes}
    for _ in range(rounds):
        for m, cmd in modes.items():
            rows[m].append(run(cmd(w)))
    med = lambda xs: statistics.median(xs)
    bare_wall = med([r[0] for r in rows["bare"]])
    bare_cpu = med([r[1] for r in rows["bare"]])
    calls = med([r[3] for r in rows["default"] if r[3]])
    ht = med([r[2] for r in rows["heaptrack"]])
    for m in modes:
        if m == "bare":
            continue
        sizes = [r[2] for r in rows[m] if r[2] is not None]
        s = med(sizes)
        spread = (max(sizes) - min(sizes)) / s * 100 if s else 0
        wall = med([r[0] for r in rows[m]]) / bare_wall
        cpu = med([r[1] for r in rows[m]]) / bare_cpu
        vs = f"{s / ht:.2f}x" if ht else "-"
        print(f"| {name} | {m} | {s / 2**20:.2f} MiB | {s / calls:.2f} | {spread:.0f}% | {vs} | {wall:.2f}x | {cpu:.2f}x |")
PY
