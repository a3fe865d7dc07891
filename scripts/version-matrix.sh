#!/usr/bin/env bash
# The CPython releases README names, each recorded in a Debian chroot of its own: Debian
# 12's 3.11, Debian 13's 3.13, unstable's 3.14. Each records tests/python/keep_a_tenth.py
# (300000 dicts, a tenth kept scattered) and checks the report as the test suite checks
# pyenv's releases: a pymalloc census; the Python line that keeps the arenas
# (keep_a_tenth.py:11) named in python_sites and in the headline; the samples' estimate
# of live bytes near the census's; and, with the first tenth kept instead, that line
# holding a quarter of the free space or less.
#
#   scripts/version-matrix.sh [SUITE:PYTHON[:note]...]
#
# Then, on each suite's SBCL (Debian 12's 2.2.9, 13's 2.5.2, unstable's 2.6.4): the SBCL
# census tests (crates/fragscope-census/tests/sbcl.rs), the Lisp run chrooted and read
# from the host (FRAGSCOPE_SBCL_ROOT); and the SBCL tests of the command
# (crates/fragscope-cli/tests/sbcl.rs: census, mark, Lisp allocation sites against
# get-bytes-consed, threads, saved executables, --load, the headline), built on the host
# and run inside the chroot, the repository bound at its own path. $SBCL_SUITES (default
# "bookworm trixie sid") chooses them; empty skips them.
#
# Last, the GHC tests of the command (crates/fragscope-cli/tests/ghc.rs: block censuses,
# the eventlog's figures, seed 000's and 001's cases, stripped programs) on Debian 13's
# GHC 9.6 and unstable's 9.10, built on the host and run inside their chroots as the
# SBCL ones (the host runs them on Debian 12's 9.0 in the suite itself). $GHC_SUITES
# (default "trixie sid") chooses them; empty skips them.
#
# And the tcmalloc snapshot test of the command (crates/fragscope-cli/tests/allocators.rs:
# the census against MallocExtension's figures) on Debian 13's gperftools 2.16, its
# program built on the host (FRAGSCOPE_TEST_PROGRAMS) and run inside the chroot on the
# chroot's libtcmalloc. $TCMALLOC_SUITES (default "trixie") chooses them.
#
# And the mimalloc snapshot test of the command (crates/fragscope-cli/tests/allocators.rs:
# the census of Debian 13's stripped libmimalloc3 against mimalloc's own area visitor),
# its program built on the host and run inside the chroot on the chroot's library.
# $MIMALLOC_SUITES (default "trixie") chooses them.
#
# And the glibc snapshot tests of the command (crates/fragscope-cli/tests/snapshot.rs: the
# census against mallinfo2 to the byte, read from a copy and from the process stopped, a
# main arena grown by mmap, the arena found by its shape without debug symbols, a
# recording beside a snapshot, seccomp, --no-stop) on Debian 13's glibc 2.41 and
# unstable's (2.43), libc6-dbg installed there, their programs built on the host and run
# inside the chroot on its libc (the host runs them on Debian 12's 2.36 in the suite
# itself). $GLIBC_SUITES (default "trixie sid") chooses them.
#
# Default: bookworm:python3.11 trixie:python3.13 sid:python3.14. ":note" expects a
# release without Python lines: no python_sites, and python_sites_note saying why.
# Chroots are kept in $FRAGSCOPE_CHROOTS (default /var/tmp/fragscope-chroots) and reused.
# Needs root (scripts/chroot.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
chroots=${FRAGSCOPE_CHROOTS:-/var/tmp/fragscope-chroots}
entries=("$@")
((${#entries[@]})) || entries=(bookworm:python3.11 trixie:python3.13 sid:python3.14)

cargo build --release -q -p fragscope
target=${CARGO_TARGET_DIR:-$root/target}
bin=$target/release/fragscope

passed=0
failed=0
for entry in "${entries[@]}"; do
  IFS=: read -r suite python expect <<<"$entry"
  expect=${expect:-lines}
  dir=$chroots/$suite
  start=$SECONDS
  scripts/chroot.sh "$suite" "$dir" "$python" libunwind8
  # Not named fragscope-*: the recorder sweeps such directories from the temporary
  # directory as rendezvous a killed recorder left.
  work=$dir/tmp/version-matrix
  rm -rf "$work"
  mkdir -p "$work"
  install -m 755 "$bin" "$dir/usr/local/bin/fragscope"
  cp tests/python/keep_a_tenth.py "$work/"
  status=0
  scripts/chroot.sh run "$dir" sh -c "cd /tmp/version-matrix && for mode in scattered first; do
    fragscope record --snapshot-ms 300 -o \$mode.fsc -- $python keep_a_tenth.py 300000 1 \$mode \
      >>record.log 2>&1 && fragscope report --json \$mode.fsc >\$mode.json || exit 1; done" || status=$?
  if ((status)); then
    echo "FAIL $suite $python: the recording or its report failed ($status):" >&2
    tail -5 "$work/record.log" >&2 || true
    failed=$((failed + 1))
    continue
  fi
  # The check, on the host's python3: one line of figures, or why it failed.
  if python3 - "$work" "$suite" "$python" "$expect" "$((SECONDS - start))" <<'EOF'; then
import json, sys

work, suite, python, expect, secs = sys.argv[1:]
r = json.load(open(f"{work}/scattered.json"))
first = json.load(open(f"{work}/first.json"))
mib = lambda b: f"{b / 2**20:.1f} MiB"
problems = []
focus = r.get("pymalloc_snapshot")
census = r["snapshots"][focus]["pymalloc"] if focus is not None else None
if census is None:
    problems.append(f"no pymalloc census ({r.get('pymalloc_note')})")
sites = r.get("python_sites")
note = r.get("python_sites_note")
sentence = r["headline"]["sentence"]
if expect == "note":
    if sites is not None or not note or note not in sentence:
        problems.append(f"expected no lines and a note: python_sites {sites is not None}, note {note!r}")
    figures = f"no lines, as expected: {note}"
else:
    top = (sites or {}).get("sites", [{}])[0] if (sites or {}).get("sites") else {}
    where = top.get("location", "")
    if "keep_a_tenth.py:11 (" not in where:
        problems.append(f"top line {where!r}, not keep_a_tenth.py:11 (note: {note!r})")
    if "keep_a_tenth.py:11" not in sentence:
        problems.append(f"the headline names no line: {sentence}")
    # The samples' estimate of what lives at the census, against the census (which also
    # counts what the interpreter made before its allocators were wrapped).
    live = sum(s["live_bytes"] for s in (sites or {}).get("sites", []))
    if census and not 0.5 * census["in_use"] <= live <= 1.3 * census["in_use"]:
        problems.append(f"estimated {mib(live)} live, the census {mib(census['in_use'])}")
    # Kept first, the same line's survivors fill their arenas and hold little.
    first_sites = (first.get("python_sites") or {}).get("sites") or [{}]
    first_held = first_sites[0].get("held_bytes", 0)
    if first_held * 4 > top.get("held_bytes", 0):
        problems.append(f"the first tenth's line holds {mib(first_held)}, the scattered's {mib(top.get('held_bytes', 0))}")
    held = sum(s["held_bytes"] for s in (sites or {}).get("sites", [])) + (sites or {}).get("held_unattributed", 0)
    share = top.get("held_bytes", 0) / held if held else 0
    figures = (f"keep_a_tenth.py:11 holds {mib(top.get('held_bytes', 0))} of the {mib(held)} free in "
               f"arenas in use ({100 * share:.0f}%), in {top.get('arenas', 0)} of "
               f"{(sites or {}).get('arenas_in_use', 0)} arenas; {(sites or {}).get('samples', 0)} samples; "
               f"{mib(live)} live estimated, {mib(census['in_use']) if census else '?'} in the census; "
               f"kept first: {mib(first_held)}")
release = census["python"] if census else "?"
if problems:
    print(f"FAIL {suite} {python} (CPython {release}): " + "; ".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"ok   {suite} {python} (CPython {release}, {secs} s): {figures}")
EOF
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
done
# A test binary of the command, as cargo built it: tests_binary NAME.
tests_binary() {
  cargo test --release -q -p fragscope --test "$1" --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1"
}
# The shared cases sit beside the repository.
binds="$root $(realpath "$target")"
[[ -d $root/../shared ]] && binds+=" $(realpath "$root/../shared")"
# Runs a test binary of the command inside a chroot, the repository bound at its own
# path, and counts the outcome: run_in_chroot DIR LABEL COMMAND... (LABEL: "trixie GHC
# 9.6.6"; COMMAND: the binary, with its test filter, behind `env VAR=...` if need be). No
# test run is a failure: a filter that matched nothing.
run_in_chroot() {
  local dir=$1 label=$2 log ran start=$SECONDS
  shift 2
  if log=$(FRAGSCOPE_CHROOT_BIND="$binds" scripts/chroot.sh run "$dir" "$@" --test-threads 1 2>&1) &&
    ran=$(grep -c '^test .* ok$' <<<"$log"); then
    echo "ok   $label: $ran tests of the command passed ($((SECONDS - start)) s)"
    passed=$((passed + 1))
  else
    echo "FAIL $label: the tests of the command:" >&2
    # Indented: the suite's closing count reads "test result:" lines at the margin only.
    grep -E "panicked|^test .*FAILED" -A3 <<<"$log" | head -20 | sed 's/^/    /' >&2
    failed=$((failed + 1))
  fi
}
sbcl_suites=${SBCL_SUITES-bookworm trixie sid}
[[ -n $sbcl_suites ]] && sbcl_tests=$(tests_binary sbcl)
for suite in $sbcl_suites; do
  dir=$chroots/$suite
  scripts/chroot.sh "$suite" "$dir" sbcl libunwind8
  release=$(chroot "$dir" /usr/bin/sbcl --version 2>/dev/null || echo "?")
  run_in_chroot "$dir" "$suite $release" "$sbcl_tests"
  if log=$(FRAGSCOPE_SBCL_ROOT=$dir cargo test --release -p fragscope-census --test sbcl -- --nocapture 2>&1); then
    # No test skipped is no match: not a failure of the script.
    skipped=$(grep '^skipped' <<<"$log" | sed 's/^skipped //' | paste -sd';' - | sed 's/;/; /g' || true)
    echo "ok   $suite $release: $(grep -c '^test .* ok$' <<<"$log") census tests passed${skipped:+ (skipped: $skipped)}"
    passed=$((passed + 1))
  else
    echo "FAIL $suite $release: the SBCL census tests:" >&2
    grep -E "panicked|^test .*FAILED|assert" <<<"$log" | head -10 | sed "s/^/    /" >&2
    failed=$((failed + 1))
  fi
done
ghc_suites=${GHC_SUITES-trixie sid}
[[ -n $ghc_suites ]] && ghc_tests=$(tests_binary ghc)
for suite in $ghc_suites; do
  dir=$chroots/$suite
  scripts/chroot.sh "$suite" "$dir" ghc libunwind8
  release=$(scripts/chroot.sh run "$dir" ghc --numeric-version 2>/dev/null || echo "?")
  run_in_chroot "$dir" "$suite GHC $release" "$ghc_tests"
done
# gperftools' tcmalloc of Debian 13 (2.16; Debian 12's 2.10 is the host's): the test
# program is built here, as the suite builds it, and run inside the chroot on its
# libtcmalloc.so.4.
tcmalloc_suites=${TCMALLOC_SUITES-trixie}
if [[ -n $tcmalloc_suites ]]; then
  allocators_tests=$(tests_binary allocators)
  programs=$target/test-programs
  mkdir -p "$programs"
  cc -O1 -pthread -o "$programs/tcmalloc_keep_tenth" tests/c/tcmalloc_keep_tenth.c -ltcmalloc
fi
for suite in $tcmalloc_suites; do
  dir=$chroots/$suite
  scripts/chroot.sh "$suite" "$dir" libgoogle-perftools4t64
  release=$(chroot "$dir" dpkg-query -W -f='${Version}' libgoogle-perftools4t64 2>/dev/null || echo "?")
  run_in_chroot "$dir" "$suite gperftools $release" env FRAGSCOPE_TEST_PROGRAMS="$programs" \
    "$allocators_tests" a_snapshot_of_a_tcmalloc_program
done
# Debian 13's libmimalloc3 (mimalloc 3.0.1, stripped; Debian 12 ships none): the test
# program is built here and run inside the chroot, preloading the chroot's library.
mimalloc_suites=${MIMALLOC_SUITES-trixie}
if [[ -n $mimalloc_suites ]]; then
  allocators_tests=$(tests_binary allocators)
  programs=$target/test-programs
  mkdir -p "$programs"
  cc -O1 -pthread -o "$programs/mimalloc_keep_tenth" tests/c/mimalloc_keep_tenth.c -ldl
fi
for suite in $mimalloc_suites; do
  dir=$chroots/$suite
  scripts/chroot.sh "$suite" "$dir" libmimalloc3
  release=$(chroot "$dir" dpkg-query -W -f='${Version}' libmimalloc3 2>/dev/null || echo "?")
  run_in_chroot "$dir" "$suite mimalloc $release" env FRAGSCOPE_TEST_PROGRAMS="$programs" \
    "$allocators_tests" debians_mimalloc_3 --ignored
done
# glibc's malloc of Debian 13 and unstable: the snapshot tests' programs built here, as
# the suite builds them (tests/common's file names), and run inside each chroot on its
# libc, the census finding the arena by libc6-dbg's symbols or, in the test that hides
# them, by its shape.
glibc_suites=${GLIBC_SUITES-trixie sid}
if [[ -n $glibc_suites ]]; then
  snapshot_tests=$(tests_binary snapshot)
  programs=$target/test-programs
  mkdir -p "$programs"
  cc -O1 -pthread -pthread -o "$programs/glibc_heap-pthread" tests/c/glibc_heap.c
  cc -O1 -pthread -o "$programs/usable_sum" tests/c/usable_sum.c
  cc -O1 -o "$programs/chunk_decoy" tests/c/chunk_decoy.c
fi
for suite in $glibc_suites; do
  dir=$chroots/$suite
  scripts/chroot.sh "$suite" "$dir" libc6-dbg libunwind8
  release=$(chroot "$dir" dpkg-query -W -f='${Version}' libc6 2>/dev/null || echo "?")
  run_in_chroot "$dir" "$suite glibc $release" env FRAGSCOPE_TEST_PROGRAMS="$programs" \
    "$snapshot_tests" glibc_census a_main_arena without_debug_symbols \
    snapshot_and_recording a_process_under_seccomp no_stop_reads
done
echo "version matrix: $passed passed, $failed failed"
((failed == 0))
