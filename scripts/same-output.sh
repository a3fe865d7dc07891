#!/usr/bin/env bash
# Whether two fragscope binaries say the same of the same traces, byte for byte: `info`,
# `report` (text, --json, --html) of each trace's default process and, in a trace of at
# most 4 processes, of each process, and every `export` format (collapsed with each
# value). Traces: the arguments after the binaries (files or directories searched for
# *.fsc), by default every .fsc in the repository outside target/.
# Usage: scripts/same-output.sh BEFORE AFTER [TRACE|DIR]...
# Prints one line per difference and exits 1 if there is one. A figure that differs
# between two runs of the same binary is not a regression: rerun BEFORE against itself.
set -uo pipefail
before=$(realpath "$1")
after=$(realpath "$2")
shift 2
repo=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] || set -- "$repo"
mapfile -t traces < <(find "$@" -name '*.fsc' -not -path '*/target*' | sort)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Runs one command with both binaries (BIN stands for the binary, OUT for a fresh output
# path) and compares stdout, stderr and the output file or directory, with the binary's
# name and the output path taken out, the exit status, and an HTML page's nonce (random
# on every run) taken out.
differences=0
same() {
    local what=$1
    shift
    local side
    for side in before after; do
        local bin=${!side} out=$work/$side.out
        rm -rf "$out" "$work/$side.stdout" "$work/$side.stderr"
        local args=("${@//BIN/$bin}")
        args=("${args[@]//OUT/$out}")
        "${args[@]}" >"$work/$side.stdout" 2>"$work/$side.stderr"
        local status=$?
        sed -i "s|$bin|fragscope|g; s|$(basename "$bin")|fragscope|g; s|$out|OUT|g" \
            "$work/$side.stdout" "$work/$side.stderr"
        [ -f "$out" ] && sed -i "s/nonce\([-=\"]*\)[0-9a-f]\{32\}/nonce\1X/g" "$out"
        if [ "$2" = replay ]; then
            sed -Ei 's/ +[0-9.]+( [kMG])?$//' "$work/$side.stdout"
        fi
        echo "status $status" >>"$work/$side.stdout"
    done
    local part
    for part in stdout stderr; do
        cmp -s "$work/before.$part" "$work/after.$part" ||
            { echo "DIFFERENT $part: $what"; differences=$((differences + 1)); }
    done
    if [ -e "$work/before.out" ] || [ -e "$work/after.out" ]; then
        diff -r "$work/before.out" "$work/after.out" >/dev/null ||
            { echo "DIFFERENT output: $what"; differences=$((differences + 1)); }
    fi
}

pids() { # the pids of a trace's processes, when it has at most 4
    "$before" info --json "$1" 2>/dev/null | python3 -c '
import json, sys
procs = json.load(sys.stdin).get("processes", [])
if len(procs) <= 4:
    print(" ".join(str(p["pid"]) for p in procs))' 2>/dev/null
}

for trace in "${traces[@]}"; do
    same "info $trace" BIN info "$trace"
    same "info --json $trace" BIN info --json "$trace"
    same "report $trace" BIN report "$trace"
    same "report --json $trace" BIN report --json "$trace"
    same "report --html $trace" BIN report --html OUT "$trace"
    for pid in $(pids "$trace"); do
        same "report --pid $pid $trace" BIN report --pid "$pid" "$trace"
        same "report --json --pid $pid $trace" BIN report --json --pid "$pid" "$trace"
        same "report --html --pid $pid $trace" BIN report --html OUT --pid "$pid" "$trace"
    done
    same "replay $trace" BIN replay "$trace"
    for format in pprof parquet json; do
        same "export $format $trace" BIN export "$trace" --format "$format" -o OUT
    done
    for value in alloc_space alloc_objects inuse_space inuse_objects pinned_waste \
        leaked_space temporary_objects; do
        same "export collapsed $value $trace" BIN export "$trace" --format collapsed \
            --value "$value" -o OUT
    done
done
echo "${#traces[@]} traces, $differences differences"
[ "$differences" -eq 0 ]
