#!/usr/bin/env bash
# The JVM heap census: how long `fragscope snapshot` holds a JVM per GiB of Java heap, and
# how its figures compare with the JVM's own (`jcmd GC.heap_info`, read just before);
# then what recording a Java program costs against the bare program and heaptrack.
#
# 1. tests/java/KeepTenth (N records, a tenth kept, System.gc(), then held still) at each
#    N under G1 (-Xmx4g), snapshotted ROUNDS times: the stop as fragscope reports it,
#    committed and used as the census counts them against jcmd's.
# 2. KeepTenth 4000000 run to its end: bare, `fragscope record` (the JVM's malloc calls
#    traced, a census at every snapshot) and heaptrack, interleaved rounds.
#
# usage: bench/jvm_census.sh ["2000000 8000000 16000000"] [rounds=3] [record rounds=5]
# needs: a JDK (javac, jcmd), a release build (cargo build --release); heaptrack optional.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
sizes=${1:-2000000 8000000 16000000}
rounds=${2:-3}
record_rounds=${3:-5}
out=bench/out/jvm_census
mkdir -p "$out"
fs=$root/target/release/fragscope
javac -d "$out" tests/java/KeepTenth.java
cd "$out"
echo "| records | committed | stop | stop per GiB | committed census / jcmd | used census / jcmd |"
echo "|---|---|---|---|---|---|"
for n in $sizes; do
  coproc PROG { exec java -XX:+UseG1GC -Xmx4g -cp . KeepTenth "$n"; }
  while read -r line <&"${PROG[0]}"; do
    [[ $line == ready* ]] && break
  done
  pid=$PROG_PID
  for _ in $(seq 1 "$rounds"); do
    jcmd "$pid" GC.heap_info >jcmd.txt
    "$fs" snapshot "$pid" -o snap.fsc --force 2>stop.txt
    "$fs" report snap.fsc --json | python3 -c '
import json, re, sys
heap = re.search(r"total (\d+)K, used (\d+)K", open("jcmd.txt").read())
committed, used = int(heap.group(1)) * 1024, int(heap.group(2)) * 1024
j = json.load(sys.stdin)["snapshots"][0]["jvm"]
stop = float(re.search(r"stopped for ([0-9.]+) ms", open("stop.txt").read()).group(1))
print("| %s | %.0f MiB | %.1f ms | %.1f ms | %.4f | %.4f |" % (sys.argv[1], committed / 2**20, stop,
      stop / (committed / 2**30), j["committed"] / committed, j["used"] / used))' "$n"
    state=$(awk '{print $3}' "/proc/$pid/stat")
    [[ $state == T ]] && { echo "process $pid left stopped" >&2; exit 1; }
  done
  kill "$pid"
  wait "$pid" 2>/dev/null || true
done
echo
runs=("bare=java -cp . KeepTenth 4000000 </dev/null"
      "fragscope record=$fs record --force -o keep.fsc -- java -cp . KeepTenth 4000000 </dev/null")
command -v heaptrack >/dev/null &&
  runs+=("heaptrack=heaptrack -o keep.heaptrack java -cp . KeepTenth 4000000 </dev/null")
"$root/bench/interleaved.sh" "$record_rounds" "${runs[@]}"
"$fs" report keep.fsc --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
js = [s["jvm"] for s in r["snapshots"] if s.get("jvm")]
print("\nlast recording: %d malloc calls, %d snapshots with a JVM census, pause %.1f-%.1f ms" % (
    r["calls"], len(js), min(j["pause_ms"] for j in js), max(j["pause_ms"] for j in js)))'
