#!/usr/bin/env bash
# The cost of recording an SBCL program beside the bare run and beside sb-sprof's
# allocation profiler alone, in interleaved rounds: with Lisp allocation sites (the
# default) and without (--stacks none: the censuses alone). Two programs:
# tests/lisp/import_job.lisp (octet buffers parsed into small strings and conses, a share
# kept) and tests/lisp/export_job.lisp (about 1 GiB consed in 1.5 s: the sites' sampling
# at its busiest). Then the censuses' pauses and the samples taken.
#
#   bench/sbcl.sh [ROUNDS] [JOB-ROUNDS] [FRAGSCOPE] [EXPORT-SCALE]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-5}
job_rounds=${2:-3000}
fragscope=${3:-$here/target/release/fragscope}
scale=${4:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
compare() { # NAME SCRIPT ARGS...
  local name=$1 script=$2
  shift 2
  echo "$name"
  "$here/bench/interleaved.sh" "$rounds" \
    "bare=sbcl --script $script $*" \
    "fragscope=$fragscope record -o $work/$name.fsc -- sbcl --script $script $*" \
    "fragscope-stacks-none=$fragscope record --stacks none -o $work/$name-none.fsc -- sbcl --script $script $*" \
    "sb-sprof-alloc=sbcl --script $here/bench/lisp/with_sprof.lisp $script $*"
  "$fragscope" report --json "$work/$name.fsc" | python3 -c '
import json, sys
r = json.load(sys.stdin)
pauses = [s["sbcl"]["pause_ms"] for s in r["snapshots"] if "sbcl" in s]
walks = [s["sbcl"]["pause_ms"] for s in r["snapshots"] if "sbcl" in s and s["sbcl"]["objects"]]
run = r["duration_ms"]
print(f"censuses {len(pauses)}, of which walked {len(walks)}; stopped {sum(pauses):.1f} ms "
      f"of a {run:.0f} ms run ({100 * sum(pauses) / run:.2f}%), longest {max(pauses, default=0):.1f} ms")
l = r.get("lisp_sites")
if l:
    n, mib = l["samples"], l["allocated_bytes"] / 2**20
    print(f"Lisp samples {n} for {mib:.0f} MiB allocated")
'
  echo
}
compare import "$here/tests/lisp/import_job.lisp" "$job_rounds" 0
compare export "$here/tests/lisp/export_job.lisp" "$scale" 1
