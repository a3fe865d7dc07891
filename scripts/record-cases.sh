#!/usr/bin/env bash
# Records a small set of programs, one per heap fragscope knows (glibc, tcmalloc and
# jemalloc linked in, forked workers, CPython, SBCL, GHC, Go), into DIR with FRAGSCOPE:
# the inputs scripts/same-output.sh reads. A runtime that is not installed is skipped,
# saying so. Usage: scripts/record-cases.sh FRAGSCOPE DIR
set -uo pipefail
fragscope=$(realpath "$1")
out=$(realpath -m "$2")
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out/bin"
cd "$out"

record() { # NAME ARGS... : one trace, NAME.fsc
    local name=$1
    shift
    "$fragscope" record --snapshot-ms 200 -o "$name.fsc" -- "$@" >"$name.log" 2>&1 ||
        echo "record $name failed (see $out/$name.log)" >&2
}
have() { command -v "$1" >/dev/null || { echo "skipped $2: no $1" >&2; false; }; }

cc -O2 -g -o bin/prefork "$repo/tests/c/prefork.c"
record prefork bin/prefork
cc -O2 -g -o bin/html_sites "$repo/tests/c/html_sites.c"
record html_sites bin/html_sites
cc -O2 -g -o bin/leaks "$repo/tests/c/leaks.c"
record leaks bin/leaks
cc -O2 -g -o bin/jemalloc_keep_tenth "$repo/tests/c/jemalloc_keep_tenth.c" -ljemalloc &&
    record jemalloc_keep_tenth bin/jemalloc_keep_tenth
cc -O2 -g -o bin/tcmalloc_keep_tenth "$repo/tests/c/tcmalloc_keep_tenth.c" -ltcmalloc &&
    record tcmalloc_keep_tenth bin/tcmalloc_keep_tenth

# A snapshot of a running process: glibc's own heap census (it waits for its stdin).
cc -O2 -g -pthread -o bin/glibc_heap "$repo/tests/c/glibc_heap.c" && {
    sleep 5 | bin/glibc_heap >glibc_heap.log 2>&1 &
    sleep 1
    "$fragscope" snapshot -o glibc_snapshot.fsc "$(pgrep -n -f "^bin/glibc_heap")" >>glibc_heap.log 2>&1 ||
        echo "snapshot of glibc_heap failed (see $out/glibc_heap.log)" >&2
    wait
}

# The shared cases beside the repository, when they are there.
cases=$repo/../shared/cases
if [ -d "$cases" ]; then
    cc -O2 -g -o bin/stripe "$cases/stripe.c" && record stripe_strip bin/stripe strip
    cc -O2 -g -o bin/churn "$cases/churn.c" && record churn bin/churn 200000
    cc -O2 -g -o bin/sizeclass_churn "$cases/sizeclass_churn.c" -ldl &&
        record sizeclass_churn bin/sizeclass_churn 32 1
fi

if have python3 python; then
    record python_keep_a_tenth python3 "$repo/tests/python/keep_a_tenth.py" 300000 1 scattered
    record python_pool_workers python3 "$repo/tests/python/pool_workers.py"
fi
have sbcl sbcl && record sbcl_import_job sbcl --script "$repo/tests/lisp/import_job.lisp" 600 2
if have ghc ghc && [ -f "$cases/ghc/Pinned.hs" ]; then
    mkdir -p ghc && cp "$cases/ghc/Pinned.hs" ghc/ &&
        (cd ghc && ghc -O -rtsopts -eventlog -o pinned Pinned.hs >/dev/null) &&
        record ghc_pinned ghc/pinned 300000 strip
fi
if have go go; then
    (cd "$repo/tests/go/keep_tenth" && go build -o "$out/bin/go_keep_tenth" .) &&
        record go_keep_tenth bin/go_keep_tenth go_stats.json 300000 1000000 1
fi
ls "$out"/*.fsc
