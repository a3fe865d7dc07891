#!/usr/bin/env bash
# The cost of recording an SBCL program (tests/lisp/import_job.lisp: octet buffers parsed
# into small strings and conses, a share kept) beside the bare run and beside sb-sprof's
# allocation profiler alone, in interleaved rounds; and the censuses' pauses.
#
#   bench/sbcl.sh [ROUNDS] [JOB-ROUNDS] [FRAGSCOPE]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-5}
job_rounds=${2:-3000}
fragscope=${3:-$here/target/release/fragscope}
job=$here/tests/lisp/import_job.lisp
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$here/bench/interleaved.sh" "$rounds" \
  "bare=sbcl --script $job $job_rounds 0" \
  "fragscope=$fragscope record -o $work/f.fsc -- sbcl --script $job $job_rounds 0" \
  "sb-sprof-alloc=sbcl --script $here/bench/lisp/with_sprof.lisp $job $job_rounds 0"
echo
"$fragscope" report --json "$work/f.fsc" | python3 -c '
import json, sys
r = json.load(sys.stdin)
pauses = [s["sbcl"]["pause_ms"] for s in r["snapshots"] if "sbcl" in s]
walks = [s["sbcl"]["pause_ms"] for s in r["snapshots"] if "sbcl" in s and s["sbcl"]["objects"]]
run = r["duration_ms"]
print(f"censuses {len(pauses)}, of which walked {len(walks)}; stopped {sum(pauses):.1f} ms "
      f"of a {run:.0f} ms run ({100 * sum(pauses) / run:.2f}%), longest {max(pauses):.1f} ms")
'
