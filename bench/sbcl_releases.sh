#!/usr/bin/env bash
# bench/sbcl.sh on each SBCL release Debian ships: 12's 2.2.9, 13's 2.5.2 and unstable's
# 2.6.4, each run inside its chroot (scripts/chroot.sh, made or reused; the repository
# bound at its own path) with the fragscope built here. Needs root.
#
#   bench/sbcl_releases.sh [SUITES] [ARGS OF bench/sbcl.sh...]
#   e.g. bench/sbcl_releases.sh "bookworm trixie sid" 3 15000 "" 4
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
chroots=${FRAGSCOPE_CHROOTS:-/var/tmp/fragscope-chroots}
suites=${1:-bookworm trixie sid}
shift || true
args=("$@")
# An empty FRAGSCOPE argument is the one built here.
((${#args[@]} >= 3)) && [[ -z ${args[2]} ]] && args[2]=$root/target/release/fragscope
cd "$root"
cargo build --release -q -p fragscope
for suite in $suites; do
  dir=$chroots/$suite
  scripts/chroot.sh "$suite" "$dir" sbcl python3 libunwind8
  echo "=== $suite: $(chroot "$dir" /usr/bin/sbcl --version)"
  FRAGSCOPE_CHROOT_BIND="$root $(realpath "${CARGO_TARGET_DIR:-$root/target}")" \
    scripts/chroot.sh run "$dir" bash "$root/bench/sbcl.sh" "${args[@]}"
done
