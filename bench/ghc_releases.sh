#!/usr/bin/env bash
# bench/ghc_observer.sh on each GHC release Debian ships: 12's 9.0.2, 13's 9.6.6 and
# unstable's 9.10.3, each run inside its chroot (scripts/chroot.sh, made or reused; the
# repository and the shared cases bound at their own paths) with the fragscope built
# here. Needs root.
#
#   bench/ghc_releases.sh [SUITES]      (default: "bookworm trixie sid")
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
chroots=${FRAGSCOPE_CHROOTS:-/var/tmp/fragscope-chroots}
cd "$root"
cargo build --release -q -p fragscope
binds="$root $(realpath "${CARGO_TARGET_DIR:-$root/target}")"
[[ -d $root/../shared ]] && binds+=" $(realpath "$root/../shared")"
for suite in ${1:-bookworm trixie sid}; do
  dir=$chroots/$suite
  scripts/chroot.sh "$suite" "$dir" ghc libunwind8
  echo "=== $suite: GHC $(scripts/chroot.sh run "$dir" ghc --numeric-version)"
  FRAGSCOPE_CHROOT_BIND="$binds" scripts/chroot.sh run "$dir" \
    bash "$root/bench/ghc_observer.sh" "${CARGO_TARGET_DIR:-$root/target}/release/fragscope"
done
