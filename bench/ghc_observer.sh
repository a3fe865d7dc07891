#!/usr/bin/env bash
# Does recording a GHC program change its garbage collection? Runs each case bare with
# `+RTS -s`, under `fragscope record` (default: eventlog and block census, no heap
# profile) and under `fragscope record --ghc-heap-profile` (-hT -i0.1), and prints the
# major collections and bytes copied the RTS itself reports, as a Markdown table.
#
#   bench/ghc_observer.sh [FRAGSCOPE]     (default: target/release/fragscope)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
fragscope=${1:-$here/target/release/fragscope}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cases=/work/shared/cases/ghc
[ -f "$cases/Pinned.hs" ] || cases=$here/../shared/cases/ghc

build() { # source output
  ghc -O -rtsopts -eventlog -outputdir "$work/build-$2" -o "$work/$2" "$1" >/dev/null
}
build "$cases/Pinned.hs" pinned
build "$here/tests/ghc/Compact.hs" compact

# "major collections|bytes copied" from an RTS -s summary on stdin.
figures() {
  awk '/bytes copied during GC/ { gsub(",", "", $1); copied = $1 }
       /Gen  1/ { major = $3 }
       END { print major "|" copied }'
}

run_bare() { "$work/$1" "${@:2}" +RTS -s -RTS 2>&1 >/dev/null | figures; }
run_rec() { # flags... -- prog args
  local flags=() ; while [ "$1" != -- ]; do flags+=("$1"); shift; done; shift
  (cd "$work" && "$fragscope" record "${flags[@]}" -o "$work/run.fsc" -- "$work/$1" "${@:2}" +RTS -s -RTS 2>&1 >/dev/null) | figures
}

pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print "-"; else printf "%+.1f%%", 100 * (a - b) / b }'; }

echo "| program | run | major GCs | bytes copied | copied vs bare |"
echo "|---|---|---:|---:|---:|"
row() { # label args...
  local label=$1; shift
  local bare rec hT
  bare=$(run_bare "$@")
  rec=$(run_rec -- "$@")
  hT=$(run_rec --ghc-heap-profile -- "$@")
  for r in "bare +RTS -s|$bare" "fragscope record|$rec" "fragscope record --ghc-heap-profile|$hT"; do
    IFS='|' read -r name major copied <<<"$r"
    echo "| $label | $name | $major | $copied | $(pct "$copied" "${bare#*|}") |"
  done
}
row "Pinned.hs 2000000 strip" pinned 2000000 strip
row "Pinned.hs 10000000 strip" pinned 10000000 strip
row "Compact.hs 200000 200000 plain" compact 200000 200000 plain
row "Compact.hs 200000 200000 compact" compact 200000 200000 compact
