#!/usr/bin/env bash
# How often the merge orders threads' calls without disorder: records
# tests/c/reuse_threads.c (8 threads freeing each other's blocks, addresses reused at once),
# or with PROGRAM=realloc_ring tests/c/realloc_ring.c (4 threads reallocating blocks they
# hand to each other: a realloc gives its old block back inside the call),
# `rounds` times, `parallel` recordings at once (more threads than cores: threads are
# preempted mid-buffer, which is what misleads a merge), half under glibc and half under
# jemalloc, and counts the recordings whose merge had to force a call, or had to take a call
# out of the order counter's order (examples/check_order).
#
# usage: bench/ordering.sh [rounds=15] [parallel=4]   (KEEP=1 keeps the traces in bench/out/ordering;
#        CHECK=path/to/check_order checks them with another build of the merge)
# needs: a release build, libjemalloc (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-15}
parallel=${2:-4}
out=bench/out/ordering
mkdir -p "$out"
rm -f "$out"/*.fsc
cargo build --release -q -p fragscope -p fragscope-trace --example check_order
fs=$PWD/target/release/fragscope
check=${CHECK:-$PWD/target/release/examples/check_order}
program=${PROGRAM:-reuse_threads}
case "$program" in
  reuse_threads) args=(8 40000) ;;
  realloc_ring) args=() ;;
  *) echo "PROGRAM is reuse_threads or realloc_ring" >&2; exit 2 ;;
esac
cc -O2 -pthread -o "$out/$program" "tests/c/$program.c"
jemalloc=$(ls /usr/lib/*/libjemalloc.so.2 2>/dev/null | head -1)
for r in $(seq 1 "$rounds"); do
  for k in $(seq 1 "$parallel"); do
    if [ $((k % 2)) -eq 0 ] && [ -n "$jemalloc" ]; then
      LD_PRELOAD=$jemalloc "$fs" record --stacks none -o "$out/jemalloc-$r-$k.fsc" -- "$out/$program" "${args[@]}" 2>/dev/null &
    else
      "$fs" record --stacks none -o "$out/glibc-$r-$k.fsc" -- "$out/$program" "${args[@]}" 2>/dev/null &
    fi
  done
  wait
done
for alloc in glibc jemalloc; do
  total=0 clean=0 late=0 reordered=0
  for f in "$out"/$alloc-*.fsc; do
    [ -e "$f" ] || continue
    stats=$("$check" "$f" | tail -1)
    total=$((total + 1))
    case "$stats" in *"forced_allocs: 0, unknown_frees: 0"*) clean=$((clean + 1)) ;; esac
    case "$stats" in *"late: 0,"*) ;; *) late=$((late + 1)) ;; esac
    case "$stats" in *"reordered: 0,"*) ;; *) reordered=$((reordered + 1)) ;; esac
  done
  echo "$alloc: $clean of $total recordings merged with nothing forced; $late with calls merged late;" \
    "$reordered with calls taken out of counter order for causality"
done
[ -n "${KEEP:-}" ] || rm -f "$out"/*.fsc
