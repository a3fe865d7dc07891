#!/usr/bin/env bash
# Recording overhead (wall time and CPU time, both as ratios to the bare run) and trace
# size on churn.c (10 M malloc/free calls), side by side in one run: the bare program, fragscope record (default: sampled stacks), fragscope record
# --stacks all, fragscope record --stacks none, fragscope record --pack, and heaptrack.
#
# usage: bench/record_overhead.sh [path/to/churn.c] [n=5000000] [runs=10]
#        (ROUNDS=15: rounds of the interleaved timing of the default modes at the end)
# needs: hyperfine, heaptrack (scripts/install-deps.sh --bench), a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
src=${1:-../shared/cases/churn.c}
n=${2:-5000000}
runs=${3:-10}
out=bench/out
mkdir -p "$out"
cargo build --release -q -p fragscope
fs=$PWD/target/release/fragscope
cc -O2 -g -o "$out/churn" "$src"
cd "$out"
hyperfine -N -w 2 -r "$runs" --export-json overhead.json --export-markdown overhead.md \
  -n bare "./churn $n" \
  -n "fragscope (sampled stacks)" "$fs record -o sampled.fsc -- ./churn $n" \
  -n "fragscope --stacks none" "$fs record --stacks none -o none.fsc -- ./churn $n" \
  -n "fragscope --stacks all" "$fs record --stacks all -o all.fsc -- ./churn $n" \
  -n "fragscope --pack" "$fs record --pack -o packed.fsc -- ./churn $n" \
  -n "heaptrack" "heaptrack -o heaptrack.churn ./churn $n"
python3 - "$n" <<'PY'
import json, subprocess, sys, glob, os
n = int(sys.argv[1])
res = {r["command"]: r for r in json.load(open("overhead.json"))["results"]}
bare = res["bare"]["mean"]
# hyperfine's user and system times are the whole process tree's (the recorder's too).
cpu = lambda r: r["user"] + r["system"]
bare_cpu = cpu(res["bare"])
print(f"\n| run | mean wall time | wall vs bare | CPU time (user + system) | CPU vs bare | trace bytes/event |")
print("|---|---|---|---|---|---|")
sizes = {}
for name, f in [("fragscope (sampled stacks)", "sampled.fsc"), ("fragscope --stacks none", "none.fsc"), ("fragscope --stacks all", "all.fsc"), ("fragscope --pack", "packed.fsc")]:
    info = json.loads(subprocess.check_output(["../../target/release/fragscope", "info", f, "--json"]))
    sizes[name] = info["file_bytes"] / info["events"]
ht = [p for p in glob.glob("heaptrack.churn*") if os.path.isfile(p)]
if ht:
    sizes["heaptrack"] = os.path.getsize(ht[0]) / (2 * n)
for name, r in res.items():
    b = f"{sizes[name]:.2f}" if name in sizes else "-"
    print(f"| {name} | {r['mean']*1000:.0f} ms ± {r['stddev']*1000:.0f} | {r['mean']/bare:.2f}x | {cpu(r)*1000:.0f} ms | {cpu(r)/bare_cpu:.2f}x | {b} |")
PY

# The default modes again in interleaved rounds (bare, default, --stacks none, bare, ...),
# so that a drift in the machine's speed hits all three alike.
echo
"$root/bench/interleaved.sh" "${ROUNDS:-15}" \
  "bare=./churn $n" \
  "fragscope (sampled stacks)=$fs record -o sampled.fsc -- ./churn $n" \
  "fragscope --stacks none=$fs record --stacks none -o none.fsc -- ./churn $n"
