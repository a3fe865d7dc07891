#!/usr/bin/env bash
# Whether recording a pre-fork program changes what its workers share: the same Python
# parent (N small dicts) forks a worker that reads them all and one that touches none
# (tests/python/prefork_readers.py); each prints its pid, then waits while this script
# reads every process's smaps_rollup. Run bare and under `fragscope record` (census on,
# snapshots every 300 ms); a profiler that copies the pages it reads would show up as
# private bytes in the idle worker and dirty private bytes in the parent.
#
#   bench/prefork_observer.sh [N] [FRAGSCOPE]
#     (defaults: N = 300000, target/release/fragscope)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-300000}
fragscope=${2:-$here/target/release/fragscope}
python=${PYTHON:-/usr/bin/python3}
script=$here/tests/python/prefork_readers.py
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

field() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/smaps_rollup"; }
row() { # label pid
  local pid=$2
  printf '  %-22s RSS %7d KiB  PSS %7d KiB  private %7d KiB (dirty %7d KiB)\n' "$1" \
    "$(field "$pid" Rss)" "$(field "$pid" Pss)" \
    $(($(field "$pid" Private_Clean) + $(field "$pid" Private_Dirty))) \
    "$(field "$pid" Private_Dirty)"
}

run() { # label command...
  local label=$1
  shift
  mkfifo "$work/in"
  "$@" <"$work/in" >"$work/out" 2>/dev/null &
  local runner=$!
  exec 3>"$work/in"
  while [[ $(wc -l <"$work/out") -lt 2 ]]; do sleep 0.05; done
  sleep 1.5 # a few snapshots and censuses of every process
  local reader idle parent
  reader=$(awk '$1 == "reader" { print $2 }' "$work/out")
  idle=$(awk '$1 == "idle" { print $2 }' "$work/out")
  parent=$(awk '/^PPid:/ { print $2 }' "/proc/$idle/status")
  echo "$label"
  row parent "$parent"
  row "reader worker" "$reader"
  row "idle worker" "$idle"
  exec 3>&-
  wait "$runner" || true
  rm -f "$work/in" "$work/out"
}

run "bare" "$python" "$script" --wait "$n"
run "fragscope record" "$fragscope" record --snapshot-ms 300 -o "$work/t.fsc" -- \
  "$python" "$script" --wait "$n"
