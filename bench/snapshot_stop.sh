#!/usr/bin/env bash
# How long `fragscope snapshot` holds a process, per GiB of glibc heap: the heap read from
# the process held stopped (--fork-copy never) against the heap read from a copy made by
# fork (--fork-copy always), in interleaved rounds, for heaps of 1 KiB and 100-byte blocks
# with every other block freed. Prints the stop each time as fragscope reports it.
#
# usage: bench/snapshot_stop.sh [MiB=1024] [rounds=5]
# needs: a release build (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
mib=${1:-1024}
rounds=${2:-5}
out=bench/out/snapshot_stop
mkdir -p "$out"
cc -O2 -o "$out/big_heap" bench/c/big_heap.c
fs=$PWD/target/release/fragscope
for size in 1024 100; do
  coproc HEAP { exec "$out/big_heap" "$mib" "$size"; }
  read -r ready <&"${HEAP[0]}"
  pid=$HEAP_PID
  echo "## $mib MiB in blocks of $size bytes (every other one freed), pid $pid, $(grep VmRSS /proc/$pid/status)"
  for _ in $(seq 1 "$rounds"); do
    for mode in never always; do
      line=$("$fs" snapshot "$pid" -o "$out/snap-$mode.fsc" --force --fork-copy "$mode" 2>&1 | grep 'was stopped for')
      echo "--fork-copy $mode: ${line#fragscope: }"
    done
  done
  exec {HEAP[1]}>&-
  wait "$pid" || true
done
