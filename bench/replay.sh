#!/usr/bin/env bash
# Replay: accuracy of the allocator models against the real allocators, and their speed.
#
# 1. Records stripe (strip, take) and sizeclass_churn under glibc, jemalloc and tcmalloc,
#    replays each trace, and prints each model's predicted peak (and plateau) beside what
#    the real allocator measured in the same run: the heap's resident bytes (what a model
#    predicts) and VmRSS (the model's peak plus the memory outside the heap, against the
#    peak RSS). Pairs: glibc model vs glibc; sizeclass (jemalloc classes, purge at once
#    and after 10 s) vs jemalloc; sizeclass with tcmalloc's classes (never purging) vs
#    tcmalloc.
# 2. Replays a trace of churn.c (2*n calls) and the sizeclass_churn trace with one model
#    at a time and prints calls/s (one core; the models' own time, without reading).
#
# usage: bench/replay.sh [n=25000000] [budget_MiB=256]
# needs: libjemalloc2, libgoogle-perftools4 (libtcmalloc.so.4), a release build
#        (or FRAGSCOPE=path/to/fragscope to use another binary).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-25000000}
budget=${2:-256}
cases=${CASES:-../shared/cases}
out=bench/out/replay
mkdir -p "$out"
if [ -z "${FRAGSCOPE:-}" ]; then
  cargo build --release -q -p fragscope
  FRAGSCOPE=$PWD/target/release/fragscope
fi
fs=$FRAGSCOPE
JE=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
TC=/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4
cc -O2 -g -o "$out/stripe" "$cases/stripe.c"
cc -O2 -g -o "$out/sizeclass_churn" "$cases/sizeclass_churn.c" -ldl
cc -O2 -g -o "$out/churn" "$cases/churn.c"
cd "$out"

preload() { case $1 in glibc) echo "" ;; jemalloc) echo "$JE" ;; tcmalloc) echo "$TC" ;; esac; }
models='ideal,glibc,sizeclass,sizeclass[purge=decay:10000],sizeclass[classes=tcmalloc;purge=never],compacting,mesh'
for alloc in glibc jemalloc tcmalloc; do
  for c in "stripe strip" "stripe take" "sizeclass_churn $budget 3"; do
    tag="$(echo "$c" | cut -d' ' -f1-2 | tr ' ' '-' | sed "s/-$budget//")-$alloc"
    LD_PRELOAD=$(preload $alloc) "$fs" record --stacks none -o "$tag.fsc" -- ./$c >"$tag.log" 2>&1
    "$fs" replay --json --models "$models" "$tag.fsc" >"$tag.json"
  done
done

echo "## Accuracy: predicted vs measured (heap resident; RSS = model + memory outside the heap)"
python3 - <<'PY'
import json, glob
pairs = {"glibc": ["glibc"],
         "jemalloc": ["sizeclass", "sizeclass[purge=decay:10000]"],
         "tcmalloc": ["sizeclass[classes=tcmalloc;purge=never]", "sizeclass"]}
mib = lambda b: f"{b/2**20:.1f}" if b is not None else "-"
pct = lambda p: f"{p:+.1f}%" if p is not None else "-"
print("| trace | real allocator | model | peak: predicted | measured heap | error | predicted RSS | measured RSS | error | plateau: predicted | measured heap | error |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for case in ["stripe-strip", "stripe-take", "sizeclass_churn"]:
    for alloc in ["glibc", "jemalloc", "tcmalloc"]:
        d = json.load(open(f"{case}-{alloc}.json"))
        acc = {a["label"]: a for a in d["accuracy"]}
        for m in pairs[alloc]:
            a = acc[m]
            print(f"| {case} | {alloc} | {m} | {mib(a['predicted_peak_heap'])} MiB | {mib(a['measured_peak_heap'])} MiB | {pct(a['peak_heap_error_pct'])} "
                  f"| {mib(a['predicted_peak_rss'])} MiB | {mib(a['measured_peak_rss'])} MiB | {pct(a['peak_rss_error_pct'])} "
                  f"| {mib(a['predicted_held_heap'])} MiB | {mib(a['measured_held_heap'])} MiB | {pct(a['held_heap_error_pct'])} |")
PY

echo
echo "## Throughput: one model at a time, one core"
rm -f churn.fsc
"$fs" record --stacks none -o churn.fsc -- ./churn "$n" >/dev/null 2>&1
for t in churn sizeclass_churn-glibc; do
  for m in ideal sizeclass glibc compacting mesh; do
    /usr/bin/time -f "%e" -o time.txt "$fs" replay --json --no-measured --models "$m" "$t.fsc" >"speed-$t-$m.json"
    echo "$t $m $(cat time.txt)" >>speed.txt.new
  done
done
mv speed.txt.new speed.txt
python3 - <<'PY'
import json
print("| trace | calls | model | model time | calls/s (model) | whole replay wall time (read + merge + model) |")
print("|---|---|---|---|---|---|")
for line in open("speed.txt"):
    t, m, wall = line.split()
    d = json.load(open(f"speed-{t}-{m}.json"))
    r = d["models"][0]
    print(f"| {t} | {d['calls']/1e6:.1f} M | {m} | {r['seconds']:.2f} s | {r['calls_per_s']/1e6:.1f} M | {float(wall):.1f} s |")
PY
