#!/usr/bin/env bash
# Runs every test: unit tests, the trace reader's fuzz-style tests, and the integration
# tests that record real programs under glibc and jemalloc.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --release --all-targets -- -D warnings
cargo test --workspace --release
