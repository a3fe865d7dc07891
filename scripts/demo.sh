#!/usr/bin/env bash
# Builds and installs fragscope, then records a shipped example program (survivors
# scattered over every page) and explains its RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo install --quiet --locked --path crates/fragscope-cli
export PATH="$HOME/.cargo/bin:$PATH"
out=$(mktemp -d)
cc -O2 -g -o "$out/scatter" examples/scatter.c
fragscope record -o "$out/run.fsc" -- "$out/scatter"
fragscope info "$out/run.fsc"
fragscope report "$out/run.fsc"
echo "trace kept at $out/run.fsc"
