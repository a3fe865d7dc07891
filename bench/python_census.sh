#!/usr/bin/env bash
# What the pymalloc census costs a CPython program: the same script bare, recorded with
# the census and recorded without it (--no-census turns every runtime census off), in
# interleaved rounds; then each census's pause as the trace records it.
#
#   bench/python_census.sh [ROUNDS] [N] [FRAGSCOPE]
#     (defaults: 5 rounds, N = 1000000 dicts built, a tenth kept; target/release/fragscope)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-5}
n=${2:-1000000}
fragscope=${3:-$here/target/release/fragscope}
python=${PYTHON:-/usr/bin/python3}
script=$here/tests/python/keep_a_tenth.py
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$here/bench/interleaved.sh" "$rounds" \
  "bare=$python $script $n 1" \
  "census=$fragscope record -o $work/census.fsc -- $python $script $n 1" \
  "no-census=$fragscope record --no-census -o $work/none.fsc -- $python $script $n 1"
"$fragscope" report "$work/census.fsc" --json | python3 -c "$(cat <<'PY'
import json, sys
r = json.load(sys.stdin)
c = [s["pymalloc"] for s in r["snapshots"] if s.get("pymalloc")]
pauses = [p["pause_ms"] for p in c]
big = max(c, key=lambda p: p["resident"])
run_s = r["duration_ms"] / 1000
print(f"\n{len(c)} censuses in {run_s:.2f} s: pauses {min(pauses):.1f}-{max(pauses):.1f} ms, "
      f"sum {sum(pauses):.0f} ms ({100 * sum(pauses) / r['duration_ms']:.1f}% of the run); "
      f"largest: {big['resident'] / 2**20:.0f} MiB of arenas in {big['pools']} pools")
PY
)"
