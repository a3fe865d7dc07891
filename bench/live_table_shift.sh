#!/usr/bin/env bash
# A report's memory when the live blocks grow bigger mid-run: bench/c/small_then_big.c
# (N blocks of 40 bytes, then N of 1500) recorded once with --snapshot-ms 100, then
# `fragscope report --json` of it, ROUNDS interleaved rounds of FRAGSCOPE and BEFORE
# (wall time and peak RSS from GNU time), and whether their JSON is the same.
#
# usage: bench/live_table_shift.sh [N=1000000]
#   FRAGSCOPE=path/to/fragscope (default: the release build in $CARGO_TARGET_DIR or target/)
#   BEFORE=path/to/an/older/fragscope (optional); ROUNDS=3
# needs: cc, GNU time.
set -euo pipefail
before=${BEFORE:+$(realpath "$BEFORE")}
cd "$(dirname "$0")/.."
n=${1:-1000000}
rounds=${ROUNDS:-3}
fragscope=$(realpath "${FRAGSCOPE:-${CARGO_TARGET_DIR:-target}/release/fragscope}")
out=bench/out/live_table_shift
mkdir -p "$out"
cc -O2 -o "$out/small_then_big" bench/c/small_then_big.c
"$fragscope" record --snapshot-ms 100 -o "$out/shift.fsc" -- "$out/small_then_big" "$n"
builds=("fragscope=$fragscope")
[ -n "$before" ] && builds+=("before=$before")
for round in $(seq 1 "$rounds"); do
    for b in "${builds[@]}"; do
        name=${b%%=*}
        /usr/bin/time -f "$name round $round: %e s, %M KiB peak RSS" \
            "${b#*=}" report --json "$out/shift.fsc" > "$out/$name.json"
    done
done
if [ -n "$before" ]; then
    cmp -s "$out/fragscope.json" "$out/before.json" && echo "JSON: the same" || echo "JSON: differs"
fi
