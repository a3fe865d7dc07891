#!/usr/bin/env bash
# A Node.js service under load: requests served a second by tests/node/session_service.js
# (a session kept per request, a tenth for good) under tests/node/load.js (CONCURRENCY
# keep-alive clients for SECONDS), bare, under `fragscope record` and under heaptrack,
# in interleaved rounds; and, for the last recording, how many of its snapshots taken
# while it served had V8's figures and how much of RSS was left as other anonymous.
#
# usage: bench/node_service.sh [SECONDS=5] [CONCURRENCY=8] [rounds=5]
# needs: node, a release build (cargo build --release); heaptrack optional.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
seconds=${1:-5}
concurrency=${2:-8}
rounds=${3:-5}
out=bench/out/node_service
mkdir -p "$out"
cd "$out"
fs=$root/target/release/fragscope
svc=$root/tests/node/session_service.js
modes=(bare fragscope)
command -v heaptrack >/dev/null && modes+=(heaptrack)

# One run of MODE: the service started under it, loaded, told to quit; prints req/s.
serve() {
  local mode=$1 cmd
  case $mode in
    bare) cmd=(node "$svc" 0) ;;
    fragscope) cmd=("$fs" record --force -o service.fsc -- node "$svc" 0) ;;
    heaptrack) cmd=(heaptrack -o service.heaptrack node "$svc" 0) ;;
  esac
  coproc SVC { exec "${cmd[@]}" 2>/dev/null; }
  local pid=$SVC_PID line port
  while read -r line <&"${SVC[0]}"; do
    port=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("port",""))' "$line" 2>/dev/null || true)
    [ -n "$port" ] && break
  done
  node "$root/tests/node/load.js" "$port" "$seconds" "$concurrency" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["per_s"])'
  cat <&"${SVC[0]}" >/dev/null || true
  wait "$pid" 2>/dev/null || true
}

: >rounds.txt
for ((r = 1; r <= rounds; r++)); do
  for m in "${modes[@]}"; do
    echo "$m $(serve "$m")" >>rounds.txt
  done
done
python3 - "$seconds" "$concurrency" <<'PY'
import statistics, sys
per = {}
for line in open("rounds.txt"):
    mode, rate = line.split()
    per.setdefault(mode, []).append(int(rate))
bare = per["bare"]
print(f"{len(bare)} interleaved rounds, {sys.argv[1]} s of load from {sys.argv[2]} clients")
print("| run | requests/s (median) | slowdown vs bare, median / worst |")
print("|---|---|---|")
for mode, rates in per.items():
    med = statistics.median(rates)
    print(f"| {mode} | {med:.0f} | {statistics.median(bare) / med:.2f}x / "
          f"{max(bare) / min(rates):.2f}x |")
PY
"$fs" report service.fsc --json 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin)
p = [s for s in r["snapshots"] if s["reason"] == "periodic" and s["t_ms"] > 500]
v = [s for s in p if s.get("v8")]
worst = max(100 * s["other_anon"] / s["rss"] for s in v)
print("last recording: %d of %d periodic snapshots with V8 figures; other anonymous at most %.1f%% of RSS there" % (len(v), len(p), worst))'
