#!/usr/bin/env bash
# How long `fragscope snapshot` holds a process on Debian's tcmalloc (gperftools 2.10),
# and how its census compares with tcmalloc's own figures: tests/c/tcmalloc_keep_tenth.c
# (N blocks of 16-400 bytes, a tenth kept) is snapshotted ROUNDS times; each round prints
# the stop as fragscope reports it and the census's in-use and central-free-list bytes
# against the program's MallocExtension properties, and the program's state after it
# (running or sleeping, never left stopped).
#
# usage: bench/tcmalloc_snapshot.sh [N=4000000] [rounds=5]
# needs: a release build (cargo build --release), libgoogle-perftools-dev.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-4000000}
rounds=${2:-5}
out=bench/out/tcmalloc_snapshot
mkdir -p "$out"
cc -O2 -pthread -o "$out/tcmalloc_keep_tenth" tests/c/tcmalloc_keep_tenth.c -ltcmalloc
fs=$PWD/target/release/fragscope
coproc PROG { exec "$out/tcmalloc_keep_tenth" "$n"; }
declare -A own
while read -r line <&"${PROG[0]}"; do
  [[ $line == kept=* ]] && break
  own[${line%%=*}]=${line#*=}
done
pid=$PROG_PID
echo "## $n blocks, a tenth kept, pid $pid, $(grep VmRSS /proc/$pid/status)"
echo "tcmalloc: in use ${own[generic.current_allocated_bytes]}, central free ${own[tcmalloc.central_cache_free_bytes]}, heap ${own[generic.heap_size]}"
for _ in $(seq 1 "$rounds"); do
  line=$("$fs" snapshot "$pid" -o "$out/snap.fsc" --force 2>&1 | grep 'was stopped for')
  figures=$("$fs" report "$out/snap.fsc" --json | python3 -c '
import json, sys
t = json.load(sys.stdin)["snapshot"]["tcmalloc"]
print("census: in use %d, central free %d, read %d bytes"
      % (t["in_use_bytes"], t["central_bytes"], t["heap"]["bytes_read"]))')
  state=$(awk '{print $3}' "/proc/$pid/stat")
  echo "${line#fragscope: }; $figures; state after: $state"
done
exec {PROG[1]}>&-
wait "$pid" || true
