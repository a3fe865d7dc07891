#!/usr/bin/env bash
# Node.js: what recording a Node program costs (its malloc calls traced, its V8 heap's
# figures handed over by the module Node loads) against the bare program and heaptrack,
# and how the V8 figures fragscope takes compare with the program's own.
#
# 1. tests/node/keep_tenth.js N (N records, a tenth kept, idle 1.5 s): bare, `fragscope
#    record`, heaptrack, interleaved rounds.
# 2. The last recording: old space used and committed at its last snapshot against what
#    the program printed of itself, and how old the figures were.
# 3. `fragscope snapshot PID` of the program while idle: how long it took (the inspector
#    opened, asked, closed) and the program's own figures against the snapshot's.
#
# usage: bench/node_v8.sh [N=2000000] [rounds=5]
# needs: node, a release build (cargo build --release); heaptrack optional.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
n=${1:-2000000}
rounds=${2:-5}
out=bench/out/node_v8
mkdir -p "$out"
fs=$root/target/release/fragscope
prog=$root/tests/node/keep_tenth.js
cd "$out"
runs=("bare=node --expose-gc $prog $n 1500"
      "fragscope record=$fs record --force -o keep.fsc -- node --expose-gc $prog $n 1500")
command -v heaptrack >/dev/null &&
  runs+=("heaptrack=heaptrack -o keep.heaptrack node --expose-gc $prog $n 1500")
"$root/bench/interleaved.sh" "$rounds" "${runs[@]}"
"$fs" record --force -o keep.fsc -- node --expose-gc "$prog" "$n" 1500 >own.txt 2>/dev/null
"$fs" report keep.fsc --json | python3 -c '
import json, sys
own = json.loads(next(l for l in open("own.txt") if "\"ready\"" in l))
old = next(s for s in own["spaces"] if s["space_name"] == "old_space")
r = json.load(sys.stdin)
last = [s for s in r["snapshots"] if s.get("v8")][-1]
v = last["v8"]
mine = next(s for s in v["spaces"] if s["space"] == "old_space")
print("\nrecording: %d snapshots with V8 figures; at the last, old space used %.4f and committed %.4f of the program'"'"'s own, figures %d ms old; other anonymous %.1f%% of RSS" % (
    len([s for s in r["snapshots"] if s.get("v8")]), mine["used"] / old["space_used_size"],
    mine["size"] / old["space_size"], v["age_ms"], 100 * last["other_anon"] / last["rss"]))'
coproc PROG { exec node --expose-gc "$prog" "$n" 60000; }
read -r ready <&"${PROG[0]}"
start=$(date +%s%N)
"$fs" snapshot "$PROG_PID" -o snap.fsc --force 2>/dev/null
end=$(date +%s%N)
"$fs" report snap.fsc --json | python3 -c '
import json, sys
own = json.loads(sys.argv[1])
old = next(s for s in own["spaces"] if s["space_name"] == "old_space")
s = json.load(sys.stdin)["snapshots"][0]
mine = next(x for x in s["v8"]["spaces"] if x["space"] == "old_space")
print("snapshot: %.0f ms in all; old space used %.4f of the program'"'"'s own; other anonymous %.1f%% of RSS" % (
    float(sys.argv[2]), mine["used"] / old["space_used_size"], 100 * s["other_anon"] / s["rss"]))' \
  "$ready" "$(((end - start) / 1000000))"
kill "$PROG_PID"
wait "$PROG_PID" 2>/dev/null || true
