#!/usr/bin/env bash
# Installs what fragscope and its tests need on Debian/Ubuntu: a C compiler, libunwind
# (stacks), the allocators the tests and `compare` run programs under, GHC (the tests
# build a Haskell program and record its eventlog), Chromium (the tests load the HTML
# report in a headless browser), Go (the tests read pprof exports with `go tool pprof`),
# a Python virtualenv with DuckDB in target/pyenv (the tests read the Parquet exports),
# glibc's debug symbols (`fragscope snapshot` finds malloc's arenas by name) and setpriv
# (util-linux: the snapshot tests read a process as another user), redis-server (a real
# server on jemalloc, snapshot while it runs), SBCL (the tests read a running Lisp's
# dynamic space), CPython's debug build (a CPython whose Python lines are not sampled),
# PostgreSQL (a real forking server recorded under pgbench; postgresql-15 holds initdb,
# postgres and pgbench), OpenJDK (the tests read a running JVM's heap and compare it with
# jcmd; the JDK brings javac and jcmd), Node.js when none is installed (the tests read a
# Node program's V8 heap).
# With --bench, also heaptrack and hyperfine (the benchmark's reference points).
set -euo pipefail
pkgs=(build-essential pkg-config libunwind8 libunwind-dev libjemalloc2 libjemalloc-dev
      libgoogle-perftools-dev libmimalloc-dev ghc chromium python3-venv libc6-dbg util-linux
      redis-server sbcl python3-dbg postgresql openjdk-17-jdk-headless)
command -v go >/dev/null || [[ -x /usr/local/go/bin/go ]] || pkgs+=(golang-go)
# Node.js: the tests record a Node program and snapshot a running one (its V8 heap).
command -v node >/dev/null || pkgs+=(nodejs)
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
pyenv="$(dirname "$0")/../target/pyenv"
if ! "$pyenv/bin/python" -c 'import duckdb' 2>/dev/null; then
  echo "installing duckdb (PyPI) into target/pyenv" >&2
  python3 -m venv "$pyenv"
  "$pyenv/bin/pip" install -q --disable-pip-version-check duckdb
fi
if ! command -v cargo >/dev/null; then
  echo "fragscope needs Rust 1.80 or newer (cargo): https://rustup.rs" >&2
  exit 1
fi
