#!/usr/bin/env bash
# `fragscope report` on a --stacks all trace with many distinct stacks (tests/c/many_stacks.c:
# 8192 stacks reached in turn, two calls per iteration), beside heaptrack_print on
# heaptrack's trace of the same run: wall time, calls per second, CPU time (user +
# system: `report` decodes on a second thread) and peak RSS, in interleaved rounds.
#
# usage: bench/report_stacks.sh [iterations=30000000] [--no-heaptrack] [rounds=1]
#   BEFORE=path/to/an/older/fragscope adds its report of the same trace, side by side.
# needs: a release build; heaptrack (scripts/install-deps.sh --bench) unless --no-heaptrack.
set -euo pipefail
# Resolved before the cd below, so that a path relative to the caller works.
before=${BEFORE:+$(realpath "$BEFORE")}
cd "$(dirname "$0")/.."
n=${1:-30000000}
heaptrack=yes
[[ "${2:-}" == "--no-heaptrack" ]] && heaptrack=no
rounds=${3:-1}
out=bench/out/report_stacks
mkdir -p "$out"
cc -O1 -fno-omit-frame-pointer -o "$out/many_stacks" tests/c/many_stacks.c
fs=$PWD/target/release/fragscope
cd "$out"
"$fs" record --stacks all -o all.fsc -- ./many_stacks "$n"
"$fs" info all.fsc | grep -E 'size|events|stacks|buffers'
if [[ $heaptrack == yes ]]; then
  rm -f ht.*
  # heaptrack 1.4 aborts (std::bad_alloc) on this program: its trace then holds only the
  # calls before the abort, and heaptrack_print's time says nothing about the whole run.
  if ! heaptrack -o ht ./many_stacks "$n" >/dev/null 2>ht.err; then
    echo "heaptrack's run failed ($(grep -m1 -E 'terminate|error|abort' ht.err || tail -n 1 ht.err)):" \
      "heaptrack_print is left out" >&2
    heaptrack=no
  fi
fi
calls=$((2 * n))
measure() {
  local name=$1
  shift
  /usr/bin/time -f '%e %U %S %M' -o time.txt "$@" >/dev/null
  read -r secs user sys kib <time.txt
  python3 -c "s = $secs; print(f'| $name | {s:.2f} s | {$calls / s / 1e6:.1f} M/s | {$user + $sys:.2f} s | {$kib / 1024:.0f} MiB |')"
}
echo "| analysis | wall time | calls/s | CPU time | peak RSS |"
echo "|---|---|---|---|---|"
for ((r = 0; r < rounds; r++)); do
  measure "fragscope report" "$fs" report all.fsc
  if [[ -n "$before" ]]; then
    measure "fragscope report, before" "$before" report all.fsc
  fi
  if [[ $heaptrack == yes ]]; then
    measure "heaptrack_print" heaptrack_print ht.zst
  fi
done
