#!/usr/bin/env bash
# A long server recording's report: redis-server recorded for DURATION seconds under
# redis-benchmark's load (its default tests one after the other, 500 000 requests each, over
# and over; 50 clients, keys drawn from a million, 100-byte values: the heap grows to about
# 150 MiB as MSET fills the keys), then `fragscope report --json` of it (wall time,
# CPU time, calls a second, peak RSS), side by side with heaptrack_print of heaptrack's
# recording of the same load for the same time (each recording has its own calls: the
# load runs as fast as the recorded server answers).
#
# usage: bench/redis_report.sh [DURATION=180]
#   FRAGSCOPE=path/to/fragscope (default: the release build in $CARGO_TARGET_DIR or target/)
#   BEFORE=path/to/an/older/fragscope adds its report of the same trace.
#   HEAPTRACK=0 leaves heaptrack out.
# needs: redis-server and redis-benchmark (apt-get install redis-server redis-tools), GNU
# time; heaptrack optional.
set -euo pipefail
before=${BEFORE:+$(realpath "$BEFORE")}
cd "$(dirname "$0")/.."
duration=${1:-180}
fs=${FRAGSCOPE:-${CARGO_TARGET_DIR:-$PWD/target}/release/fragscope}
fs=$(realpath "$fs")
out=bench/out/redis
mkdir -p "$out"
cd "$out"
port=$((20000 + RANDOM % 20000))

# Runs the load against the server that COMMAND... starts, for $duration seconds, then
# shuts the server down and waits for COMMAND to end.
serve_under_load() {
  "$@" redis-server --port "$port" --save '' --appendonly no >server.log 2>&1 &
  local server=$!
  for _ in $(seq 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.2
  done
  timeout "$duration" bash -c "while :; do
    redis-benchmark -p $port -q -c 50 -r 1000000 -d 100 -n 500000; done" >benchmark.log 2>&1 ||
    true
  redis-cli -p "$port" info memory | grep -E '^used_memory:' || true
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$server" || true
}

measure() { # label, command...: "label wall_s cpu_s peak_rss_kib"
  local label=$1
  shift
  /usr/bin/time -f "%e %U %S %M" -o time.txt "$@" >/dev/null 2>&1
  read -r wall user sys rss <time.txt
  echo "$label $wall $(python3 -c "print($user + $sys)") $rss"
}

rm -f redis.fsc
serve_under_load "$fs" record -o redis.fsc --
calls=$("$fs" info --json redis.fsc | python3 -c 'import json,sys; print(json.load(sys.stdin)["events"])')
snaps=$("$fs" report --json redis.fsc | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["snapshots"]))')
echo "fragscope's recording: $calls calls, $snaps snapshots, $(du -m redis.fsc | cut -f1) MB"
rows=("$(measure fragscope "$fs" report --json redis.fsc) $calls")
if [[ -n "$before" ]]; then
  rows+=("$(measure before "$before" report --json redis.fsc) $calls")
fi
if [[ ${HEAPTRACK:-1} != 0 ]] && command -v heaptrack >/dev/null; then
  rm -f heaptrack.redis.*
  serve_under_load heaptrack -o heaptrack.redis
  ht=$(ls heaptrack.redis.* | head -1)
  heaptrack_print "$ht" >heaptrack_print.txt 2>&1
  ht_calls=$(grep -E '^calls to allocation functions:' heaptrack_print.txt | grep -oE '[0-9]+' | head -1)
  # heaptrack counts allocations; its frees are about as many: the calls are twice.
  rows+=("$(measure heaptrack_print heaptrack_print "$ht") $((2 * ht_calls))")
  echo "heaptrack's recording: $ht_calls allocations, $(du -m "$ht" | cut -f1) MB"
fi
printf '%s\n' "${rows[@]}" >redis.txt
python3 - <<'PY'
print("\n| analysis | wall time | CPU time | calls/s (wall) | peak RSS |")
print("|---|---|---|---|---|")
for line in open("redis.txt"):
    label, wall, cpu, rss, calls = line.split()
    wall, cpu = float(wall), float(cpu)
    print(f"| {label} | {wall:.2f} s | {cpu:.2f} s | {int(calls) / wall / 1e6:.1f} M/s "
          f"| {int(rss) / 1024:.0f} MiB |")
PY
