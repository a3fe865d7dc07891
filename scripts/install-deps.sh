#!/usr/bin/env bash
# Installs what fragscope and its tests need on Debian/Ubuntu: a C compiler, libunwind
# (stacks), the allocators the tests and `compare` run programs under, GHC (the tests
# build a Haskell program and record its eventlog) and Chromium (the tests load the HTML
# report in a headless browser).
# With --bench, also heaptrack and hyperfine (the benchmark's reference points).
set -euo pipefail
pkgs=(build-essential pkg-config libunwind8 libunwind-dev libjemalloc2 libjemalloc-dev
      libgoogle-perftools-dev libmimalloc-dev ghc chromium)
[[ "${1:-}" == "--bench" ]] && pkgs+=(heaptrack hyperfine time)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
  echo "installing: ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null; then
  echo "fragscope needs Rust 1.80 or newer (cargo): https://rustup.rs" >&2
  exit 1
fi
