#!/usr/bin/env bash
# Runs every test: unit tests, the trace reader's fuzz-style tests, the integration
# tests that record real programs under glibc and jemalloc, and (as root) the version
# matrix: CPython releases of other Debian suites recorded in chroots.
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
# The runtime releases other Debian suites ship, each in a chroot (needs root).
if [[ $(id -u) -eq 0 ]]; then
  scripts/version-matrix.sh 2>&1 | tee -a "$log"
  matrix=${PIPESTATUS[0]}
  ((matrix == 0)) || status=$matrix
else
  echo "version matrix skipped: it builds Debian chroots, which needs root" | tee -a "$log"
fi
set -e
# One closing line for the whole suite (cargo prints one per test binary).
awk '/^test result:/ { p += $4; f += $6; s += $8 }
     /^version matrix: [0-9]+ passed/ { p += $3; f += $5 }
     END { printf "fragscope tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
exit "$status"
