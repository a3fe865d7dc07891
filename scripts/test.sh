#!/usr/bin/env bash
# Runs every test: unit tests, the trace reader's fuzz-style tests, and the integration
# tests that record real programs under glibc and jemalloc.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --release --all-targets -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace --release --no-fail-fast --lib --bins --tests 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# One closing line for the whole suite (cargo prints one per test binary).
awk '/^test result:/ { p += $4; f += $6; s += $8 } END { printf "fragscope tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
exit "$status"
