#!/usr/bin/env bash
# Report cost against the size of the heap held: the same malloc/free calls
# (bench/c/held_churn.c, 2*N calls) over a heap of BIG live blocks and one of SMALL,
# recorded with --snapshot-ms 100, then `fragscope report --json` of each (wall time,
# peak RSS) and heaptrack_print of heaptrack's recording of the same runs, side by side,
# with the ratio big/small. perf's top symbols of the big report when perf is installed.
#
# usage: bench/report_scaling.sh [N=10000000] [BIG=1000000] [SMALL=4096]
#   FRAGSCOPE=path/to/fragscope (default: the release build in $CARGO_TARGET_DIR or target/)
#   BEFORE=path/to/an/older/fragscope adds its reports of the same traces.
#   ROUNDS=5: each analysis runs that many times in a row; the table gives the median
#   wall time and the highest peak RSS (one run alone swings with the machine).
# needs: GNU time; heaptrack and perf optional.
set -euo pipefail
before=${BEFORE:+$(realpath "$BEFORE")}
cd "$(dirname "$0")/.."
n=${1:-10000000}
big=${2:-1000000}
small=${3:-4096}
rounds=${ROUNDS:-5}
fs=${FRAGSCOPE:-${CARGO_TARGET_DIR:-$PWD/target}/release/fragscope}
fs=$(realpath "$fs")
out=bench/out/scaling
mkdir -p "$out"
cc -O2 -g -pthread -o "$out/held_churn" bench/c/held_churn.c
cd "$out"
measure() { # label, command...: "label wall_s peak_rss_kib", a line per round
  local label=$1; shift
  for _ in $(seq 1 "$rounds"); do
    /usr/bin/time -f "%e %M" -o time.txt "$@" >/dev/null 2>&1
    echo "$label $(cat time.txt)"
  done
}
rows=()
for live in "$big" "$small"; do
  rm -f "heap$live.fsc" heaptrack.heap$live.*
  "$fs" record --snapshot-ms 100 -o "heap$live.fsc" -- ./held_churn "$live" "$n" >/dev/null
  calls=$("$fs" info --json "heap$live.fsc" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["events"])')
  snaps=$("$fs" report --json "heap$live.fsc" |
    python3 -c 'import json,sys; print(len(json.load(sys.stdin)["snapshots"]))')
  echo "heap of $live blocks: $calls calls, $snaps snapshots"
  rows+=("$(measure "report-$live" "$fs" report --json "heap$live.fsc")")
  if [[ -n "$before" ]]; then
    rows+=("$(measure "before-$live" "$before" report --json "heap$live.fsc")")
  fi
  if command -v heaptrack >/dev/null; then
    heaptrack -o "heaptrack.heap$live" ./held_churn "$live" "$n" >/dev/null 2>&1
    rows+=("$(measure "heaptrack_print-$live" heaptrack_print "$(ls heaptrack.heap$live.* | head -1)")")
  fi
done
printf '%s\n' "${rows[@]}" > scaling.txt
python3 - "$big" "$small" <<'PY'
import statistics, sys
big, small = sys.argv[1], sys.argv[2]
runs = {}
for line in open("scaling.txt"):
    label, wall, rss = line.split()
    tool, live = label.rsplit("-", 1)
    runs.setdefault(tool, {}).setdefault(live, []).append((float(wall), int(rss) / 1024))
rows = {tool: {live: (statistics.median(w for w, _ in r), max(m for _, m in r))
               for live, r in by_live.items()}
        for tool, by_live in runs.items()}
print(f"\n| analysis | {big} blocks | {small} blocks | time big/small | RSS big/small |")
print("|---|---|---|---|---|")
for tool, r in rows.items():
    (wb, mb), (ws, ms) = r[big], r[small]
    print(f"| {tool} | {wb:.2f} s, {mb:.0f} MiB | {ws:.2f} s, {ms:.0f} MiB "
          f"| {wb/ws:.1f}x | {mb/ms:.1f}x |")
PY
if command -v perf >/dev/null; then
  perf record -q -g -o perf.data "$fs" report --json "heap$big.fsc" >/dev/null 2>&1 || true
  perf report -i perf.data --no-children --percent-limit 2 --stdio 2>/dev/null |
    grep -E '^ +[0-9.]+%' | head -15 || true
fi
