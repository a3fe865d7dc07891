#!/usr/bin/env bash
# fragscope against memray on a CPython service-like load (bench/python/json_cache.py:
# JSON parsing and a dict cache with churn): wall time in interleaved rounds and trace
# sizes, bare / fragscope record / memray run / memray run --trace-python-allocators.
# memray comes from PyPI into target/pyenv (scripts/install-deps.sh makes that venv).
#
#   bench/python_memray.sh [ROUNDS] [REQUESTS] [FRAGSCOPE]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-3}
requests=${2:-300000}
fragscope=${3:-$here/target/release/fragscope}
python=${PYTHON:-/usr/bin/python3}
venv=$here/target/pyenv
[ -x "$venv/bin/memray" ] || "$venv/bin/pip" install -q --disable-pip-version-check memray
memray=$venv/bin/memray
# memray runs the script with the venv's interpreter: the same python3 as $python.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
script=$here/bench/python/json_cache.py
"$here/bench/interleaved.sh" "$rounds" \
  "bare=$venv/bin/python $script $requests" \
  "fragscope=$fragscope record -o $work/f.fsc -- $venv/bin/python $script $requests" \
  "memray=rm -f $work/m.bin; $memray run -q -o $work/m.bin $script $requests" \
  "memray-python-allocators=rm -f $work/p.bin; $memray run -q --trace-python-allocators -o $work/p.bin $script $requests"
echo
ls -l "$work" | awk 'NR > 1 { printf "%-8s %8.1f MiB\n", $9, $5 / 1048576 }'
