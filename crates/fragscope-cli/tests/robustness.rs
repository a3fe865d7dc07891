//! Recording real programs must never break them: exit statuses pass through, forked
//! children are their own processes with exact counts, static binaries are refused.

mod common;

use std::path::Path;
use std::process::Command;

use common::{build, calls_of, fragscope, info, record, Allocator, StreamCalls};
use fragscope_trace::Func;

/// Records `exe args` on `alloc`, checks fragscope's exit status, and returns the trace's
/// `info --json` and its replayed calls per stream.
fn record_and_read(
    alloc: Allocator,
    dir: &Path,
    exe: &Path,
    args: &[&str],
    status: i32,
) -> (serde_json::Value, Vec<StreamCalls>) {
    record_and_read_with(alloc, &[], dir, exe, args, status)
}

/// As [`record_and_read`], with `fragscope record` options.
fn record_and_read_with(
    alloc: Allocator,
    options: &[&str],
    dir: &Path,
    exe: &Path,
    args: &[&str],
    status: i32,
) -> (serde_json::Value, Vec<StreamCalls>) {
    let trace = dir.join("t.fsc");
    let out = common::record_command(alloc, &trace, options, exe, args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(status), "{}", common::stderr(&out));
    let j = info(&trace);
    assert_eq!(j["truncated"], false, "{j:#}");
    assert_eq!(j["damage"], serde_json::Value::Null, "{j:#}");
    for p in j["processes"].as_array().unwrap() {
        assert_eq!(p["lost_buffers"], 0, "{p:#}");
    }
    (j, common::stream_calls(&trace))
}

fn processes(j: &serde_json::Value) -> &Vec<serde_json::Value> {
    j["processes"].as_array().unwrap()
}

fn stream_of(p: &serde_json::Value) -> u64 {
    p["stream"].as_u64().unwrap()
}

fn exit_status_and_fork(alloc: Allocator) {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "fork_exit", &[]);
    let (j, calls) = record_and_read(alloc, dir.path(), &exe, &["7"], 7);
    let procs = processes(&j);
    assert_eq!(procs.len(), 2, "{j:#}");
    let (parent, child) = (&procs[0], &procs[1]);
    assert_eq!(child["forked"], true);
    assert_eq!(child["parent_stream"], parent["stream"]);
    assert_eq!(child["ppid"], parent["pid"]);
    assert_eq!(child["exit_code"], 3);
    assert_eq!(parent["exit_code"], 7);
    // 777-byte blocks: neither libc nor the allocator makes any of these itself.
    calls_of(&calls, stream_of(parent)).assert_pairs(777, 1000, "parent");
    calls_of(&calls, stream_of(child)).assert_pairs(777, 500, "child");
}

#[test]
fn exit_status_passes_through_and_a_forked_child_is_its_own_process_under_glibc() {
    exit_status_and_fork(Allocator::Glibc);
}

#[test]
fn exit_status_passes_through_and_a_forked_child_is_its_own_process_under_jemalloc() {
    exit_status_and_fork(Allocator::Jemalloc);
}

/// `fragscope record -o TRACE -- EXE`, with every default (sampled stacks).
fn record_as_a_user_would(trace: &Path, exe: &Path) -> std::process::Output {
    fragscope(&[
        "record".as_ref(),
        "-o".as_ref(),
        trace.as_os_str(),
        "--".as_ref(),
        exe.as_os_str(),
    ])
}

/// A thread's first sampled stack used to make the interposer ask the dynamic loader where
/// the unwinder's thread-local storage lies (dlinfo), and any dl* call that succeeds frees
/// the thread's pending dlerror message: the program's next dlerror() said nothing, and a
/// program inside dlerror() read freed memory (bash's `enable -f` of a missing library,
/// under load: 2 of 96 recorded runs of a pyenv shim crashed a bash process).
#[test]
fn a_programs_pending_dlerror_message_survives_its_threads_first_stack() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "dlerror_kept", &["-pthread"]);
    let trace = dir.path().join("t.fsc");
    let out = record_as_a_user_would(&trace, &exe);
    assert!(out.status.success(), "{}", common::stderr(&out));
    // The thread's large allocation had its stack taken (the case in question).
    let stacks = info(&trace)["processes"][0]["stacks"].as_u64();
    assert!(stacks.is_some_and(|n| n >= 1), "{:#}", info(&trace));
}

#[test]
fn a_statically_linked_program_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "fork_exit", &["-static"]);
    let trace = dir.path().join("t.fsc");
    let out = record_as_a_user_would(&trace, &exe);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("statically linked"), "{err}");
    assert!(!trace.exists(), "no empty trace is left behind");
}

#[test]
fn a_missing_program_and_a_bad_flag_get_clear_messages() {
    let out = fragscope(&[
        "record".as_ref(),
        "--".as_ref(),
        "/no/such/program".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such program"));
    let out = fragscope(&[
        "record".as_ref(),
        "--stacks".as_ref(),
        "some".as_ref(),
        "--".as_ref(),
        "true".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("possible values"));
}

#[test]
fn a_file_that_is_not_a_trace_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("bogus.fsc");
    std::fs::write(&bogus, b"hello, this is not a trace").unwrap();
    let out = fragscope(&["info".as_ref(), bogus.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a fragscope trace"));
}

/// Returns the process's buffers and how many were packed.
fn threads_freeing_each_others_blocks(alloc: Allocator, options: &[&str]) -> (u64, u64) {
    threads_freeing_each_others_blocks_for(alloc, options, 20_000)
}

/// The same, each thread making `rounds` rounds.
fn threads_freeing_each_others_blocks_for(
    alloc: Allocator,
    options: &[&str],
    rounds: u64,
) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "cross_free_threads", &[]);
    let threads = 8u64;
    let (j, calls) = record_and_read_with(
        alloc,
        options,
        dir.path(),
        &exe,
        &[&threads.to_string(), &rounds.to_string()],
        0,
    );
    let procs = processes(&j);
    assert_eq!(procs.len(), 1, "{j:#}");
    assert_eq!(procs[0]["threads"], threads + 1, "{j:#}");
    assert_eq!(procs[0]["lost_events"], 0, "{j:#}");
    let s = &calls[0];
    let blocks = threads * rounds;
    assert_eq!(s.allocated(Func::Malloc, 40), blocks, "{s:#?}");
    assert!(
        s.cross_thread_reuse > 100,
        "the program must make threads reuse each other's addresses: {s:#?}"
    );
    // As tests/ordering.rs: the order counter leaves nothing out of order.
    assert_eq!(s.disorder(), 0, "calls out of order: {s:#?}");
    assert_eq!(s.freed(40), blocks, "{s:#?}");
    assert_eq!(s.merge.lost_events, 0);
    let buffers = procs[0]["buffers"].as_u64().unwrap();
    (buffers, procs[0]["packed_buffers"].as_u64().unwrap())
}

#[test]
fn threads_freeing_each_others_blocks_are_counted_exactly_under_glibc() {
    let (_, packed) = threads_freeing_each_others_blocks(Allocator::Glibc, &["--pack=never"]);
    assert_eq!(packed, 0);
}

#[test]
fn threads_freeing_each_others_blocks_are_counted_exactly_under_jemalloc() {
    let (_, packed) = threads_freeing_each_others_blocks(Allocator::Jemalloc, &["--pack=never"]);
    assert_eq!(packed, 0);
}

/// By default a process is packed while fragscope keeps up: eight threads allocating
/// flat out outrun the packing, so some buffers are packed and others stored as they
/// came, in one stream that must read back exactly. (Long enough to fill half the
/// recorder's queue many times over: about 140 buffers.)
#[test]
fn a_stream_packed_until_the_program_outran_it_reads_back_exactly() {
    let (buffers, packed) = threads_freeing_each_others_blocks_for(Allocator::Glibc, &[], 200_000);
    assert!(
        packed > 0 && packed < buffers,
        "{packed} of {buffers} buffers packed"
    );
}

/// A program that allocates at a modest pace is packed throughout by default.
#[test]
fn a_program_allocating_at_a_modest_pace_is_packed_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "paced", &[]);
    let (j, calls) = record_and_read_with(
        Allocator::Glibc,
        &[],
        dir.path(),
        &exe,
        &["40", "2000", "3000"],
        0,
    );
    let p = &processes(&j)[0];
    let buffers = p["buffers"].as_u64().unwrap();
    assert!(buffers > 1, "{p:#}");
    assert_eq!(p["packed_buffers"], buffers, "{p:#}");
    assert_eq!(calls[0].disorder(), 0, "{:#?}", calls[0]);
    assert_eq!(p["calls"]["malloc"], 80_000, "{p:#}");
}

/// A program that allocates in bursts outruns the packing in each burst and waits
/// between them: packing stops, resumes from empty tables of blocks, and the stream,
/// packed and raw by turns, reads back exactly.
#[test]
fn packing_resumes_after_a_burst_and_the_stream_reads_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "paced", &[]);
    // Each burst is about 60 buffers: packing stops once half of the recorder's queue
    // waits, however fast the packer is against the program.
    let (rounds, pairs) = (4u64, 1_000_000u64);
    let (j, calls) = record_and_read_with(
        Allocator::Glibc,
        &[],
        dir.path(),
        &exe,
        &[&rounds.to_string(), &pairs.to_string(), "200000"],
        0,
    );
    let p = &processes(&j)[0];
    let (buffers, packed) = (
        p["buffers"].as_u64().unwrap(),
        p["packed_buffers"].as_u64().unwrap(),
    );
    assert!(packed > 0 && packed < buffers, "{p:#}");
    assert!(p["packing_resumed"].as_u64().unwrap() > 0, "{p:#}");
    let s = &calls[0];
    assert_eq!(s.disorder(), 0, "{s:#?}");
    assert_eq!(p["calls"]["malloc"], rounds * pairs, "{p:#}");
    assert_eq!(s.merge.lost_events, 0);
    // Every block the bursts allocated was freed (the last 256 at the end): a block the
    // packed form named wrongly would stay live, or be freed twice.
    assert_eq!(s.freed.values().sum::<u64>(), rounds * pairs, "{s:#?}");
    assert_eq!(s.first_thread_live_at_end, (0, 0), "{s:#?}");
}

/// The packed form names blocks by what the stream said before, across threads that
/// free each other's blocks and reuse each other's addresses: it must read back exactly.
#[test]
fn threads_freeing_each_others_blocks_read_back_exactly_from_a_packed_trace_under_glibc() {
    let (buffers, packed) = threads_freeing_each_others_blocks(Allocator::Glibc, &["--pack"]);
    assert_eq!(packed, buffers);
}

#[test]
fn threads_freeing_each_others_blocks_read_back_exactly_from_a_packed_trace_under_jemalloc() {
    let (buffers, packed) = threads_freeing_each_others_blocks(Allocator::Jemalloc, &["--pack"]);
    assert_eq!(packed, buffers);
}

fn fork_then_exec(alloc: Allocator) {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "fork_exec", &[]);
    let trace = dir.path().join("t.fsc");
    let out = record(alloc, &trace, &exe, &[]);
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        !err.contains("made no malloc-family call"),
        "a child that exec'd before allocating is not a program without malloc: {err}"
    );
    let j = info(&trace);
    assert_eq!(j["truncated"], false, "{j:#}");
    let calls = common::stream_calls(&trace);
    let procs = processes(&j);
    let parent = &procs[0];
    calls_of(&calls, stream_of(parent)).assert_pairs(611, 100, "parent");
    let methods = [
        "execv", "execvp", "execve", "execl", "execlp", "execle", "at-once",
    ];
    assert_eq!(procs.len(), 1 + 2 * methods.len(), "{j:#}");
    for method in methods {
        let image = procs
            .iter()
            .find(|p| p["argv"][2] == method)
            .unwrap_or_else(|| panic!("no image exec'd by {method}: {j:#}"));
        let forked = procs
            .iter()
            .find(|p| p["forked"] == true && p["pid"] == image["pid"])
            .unwrap_or_else(|| panic!("no forked stream before {method}: {j:#}"));
        assert_eq!(forked["parent_stream"], parent["stream"], "{method}: {j:#}");
        assert_eq!(forked["ppid"], parent["pid"], "{method}: {j:#}");
        assert_eq!(forked["end"], "exec'd a new image", "{method}: {j:#}");
        assert_eq!(image["forked"], false, "{method}: {j:#}");
        assert_eq!(image["parent_stream"], forked["stream"], "{method}: {j:#}");
        assert_eq!(image["exit_code"], 4, "{method}: {j:#}");
        let before_exec = if method == "at-once" { 0 } else { 50 };
        calls_of(&calls, stream_of(forked)).assert_pairs(611, before_exec, method);
        calls_of(&calls, stream_of(image)).assert_pairs(611, 25, method);
    }
}

#[test]
fn fork_then_exec_traces_the_child_and_its_new_image_as_processes_under_glibc() {
    fork_then_exec(Allocator::Glibc);
}

#[test]
fn fork_then_exec_traces_the_child_and_its_new_image_as_processes_under_jemalloc() {
    fork_then_exec(Allocator::Jemalloc);
}

fn posix_spawn_children(alloc: Allocator) {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "spawn", &[]);
    let (j, calls) = record_and_read(alloc, dir.path(), &exe, &[], 0);
    let procs = processes(&j);
    assert_eq!(procs.len(), 5, "{j:#}");
    let parent = &procs[0];
    calls_of(&calls, stream_of(parent)).assert_pairs(613, 100, "parent");
    // The interposer puts LD_PRELOAD back into a clean environment, so the children
    // spawned with one are traced like the others.
    for env in ["inherited", "clean"] {
        let children: Vec<_> = procs.iter().filter(|p| p["argv"][2] == env).collect();
        assert_eq!(children.len(), 2, "{env}: {j:#}");
        for child in children {
            assert_eq!(child["forked"], false, "{env}: {j:#}");
            assert_eq!(child["ppid"], parent["pid"], "{env}: {j:#}");
            assert_eq!(child["exit_code"], 6, "{env}: {j:#}");
            calls_of(&calls, stream_of(child)).assert_pairs(613, 25, env);
        }
    }
}

#[test]
fn posix_spawned_children_are_traced_even_with_a_clean_environment_under_glibc() {
    posix_spawn_children(Allocator::Glibc);
}

#[test]
fn posix_spawned_children_are_traced_even_with_a_clean_environment_under_jemalloc() {
    posix_spawn_children(Allocator::Jemalloc);
}

fn dlopen_dlclose(alloc: Allocator) {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "dlopen", &["-ldl"]);
    let plugin = common::build_shared(dir.path(), "dlopen_plugin");
    let (j, calls) = record_and_read(alloc, dir.path(), &exe, &[plugin.to_str().unwrap()], 0);
    assert_eq!(processes(&j).len(), 1, "{j:#}");
    // Three rounds of 10 blocks kept by the constructor and 100 pairs.
    calls[0].assert_pairs(701, 330, "plugin");
}

#[test]
fn allocations_of_a_library_loaded_and_unloaded_three_times_are_all_recorded_under_glibc() {
    dlopen_dlclose(Allocator::Glibc);
}

#[test]
fn allocations_of_a_library_loaded_and_unloaded_three_times_are_all_recorded_under_jemalloc() {
    dlopen_dlclose(Allocator::Jemalloc);
}

/// The interposer starts at the program's first malloc, which may come from inside glibc's
/// bindtextdomain while it holds the locale lock for writing (libgpg-error's constructor
/// in PostgreSQL and gdb; tests/c/locale_first.c). Its start-up once called dlerror, whose
/// gettext left the lock corrupt, and the program's own bindtextdomain then waited forever.
#[test]
fn a_first_malloc_inside_bindtextdomain_leaves_the_program_running() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/c/locale_first.c");
    let cc = |flags: &[&str], libs: &[&str], out: &str| {
        let mut cmd = Command::new("cc");
        cmd.args(["-O1", "-pthread"]).args(flags);
        if !libs.is_empty() {
            // Needed even though no symbol of theirs is used.
            cmd.args(["-Wl,--no-as-needed", "-L"])
                .arg(d)
                .args(libs)
                .arg(format!("-Wl,-rpath,{}", d.display()));
        }
        let ok = cmd.arg("-o").arg(d.join(out)).arg(&src).status().unwrap();
        assert!(ok.success(), "cc {flags:?} failed");
    };
    cc(
        &["-shared", "-fPIC", "-DLOCALE_LIBRARY"],
        &[],
        "liblocale_first.so",
    );
    cc(
        &["-shared", "-fPIC", "-DMIDDLE_LIBRARY"],
        &["-llocale_first"],
        "libmiddle.so",
    );
    cc(&[], &["-lmiddle"], "locale_first");
    let exe = d.join("locale_first");
    let trace = d.join("t.fsc");
    // timeout ends a program that hangs, and with it the recording.
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--stacks", "none", "-o"])
        .arg(&trace)
        .args(["--", "timeout", "-s", "KILL", "30"])
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} (a program that hung was killed by timeout): {}",
        out.status,
        common::stderr(&out)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "translated: ok\n");
    let j = info(&trace);
    let program = processes(&j)
        .iter()
        .find(|p| p["exe"].as_str().unwrap_or("").ends_with("/locale_first"))
        .unwrap_or_else(|| panic!("no process of locale_first: {j:#}"));
    let calls = common::stream_calls(&trace);
    calls_of(&calls, stream_of(program)).assert_pairs(1000, 1, "locale_first");
}

/// `interrupt_allocator`: the handler may interrupt the allocator itself (main makes
/// malloc/free pairs), which only glibc survives reliably; else main calls free(NULL), and
/// the handler interrupts the recording of calls only.
fn malloc_in_a_signal_handler(alloc: Allocator, interrupt_allocator: bool) {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "signal_malloc", &[]);
    let trace = dir.path().join("t.fsc");
    let mode = if interrupt_allocator {
        "pairs"
    } else {
        "free-null"
    };
    let out = record(alloc, &trace, &exe, &["2000", mode]);
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    let numbers: Vec<u64> = said
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let [main_pairs, handler_pairs] = numbers[..] else {
        panic!("unexpected output {said:?}")
    };
    let j = info(&trace);
    assert_eq!(j["truncated"], false, "{j:#}");
    let s = &common::stream_calls(&trace)[0];
    if interrupt_allocator {
        assert_eq!(s.allocated(Func::Malloc, 32), main_pairs, "{s:#?}");
        assert_eq!(s.freed(32), main_pairs, "{s:#?}");
    } else {
        assert_eq!(s.free_null, main_pairs, "{s:#?}");
    }
    // A handler that interrupts the recording of a call queues its own calls; while the
    // thread is stuck sending a buffer to a busy recorder, a full queue (256 calls) drops
    // calls, and counts them: every handler call is recorded or counted as lost. A lost
    // malloc leaves its free unknown (or a lost free its block live twice), one each.
    let lost = s.merge.lost_events;
    assert!(s.disorder() <= lost, "{s:#?}");
    let recorded = s.allocated(Func::Malloc, 500) + s.freed(500);
    assert_eq!(recorded + lost, 2 * handler_pairs, "{s:#?}");
    assert!(lost <= handler_pairs / 20, "{lost} lost: {s:#?}");
}

#[test]
fn malloc_in_a_signal_handler_interrupting_malloc_is_recorded_under_glibc() {
    malloc_in_a_signal_handler(Allocator::Glibc, true);
}

#[test]
fn malloc_in_a_signal_handler_interrupting_the_recording_is_recorded_under_glibc() {
    malloc_in_a_signal_handler(Allocator::Glibc, false);
}

#[test]
fn malloc_in_a_signal_handler_interrupting_the_recording_is_recorded_under_jemalloc() {
    malloc_in_a_signal_handler(Allocator::Jemalloc, false);
}

fn closing_every_descriptor(alloc: Allocator) {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "close_fds", &[]);
    let (j, calls) = record_and_read(alloc, dir.path(), &exe, &[], 0);
    // A connection lost to a raw close_range resumes the same process's stream.
    assert_eq!(processes(&j).len(), 1, "{j:#}");
    calls[0].assert_pairs(617, 500, "after each way of closing");
}

#[test]
fn a_program_that_closes_every_descriptor_is_still_recorded_under_glibc() {
    closing_every_descriptor(Allocator::Glibc);
}

#[test]
fn a_program_that_closes_every_descriptor_is_still_recorded_under_jemalloc() {
    closing_every_descriptor(Allocator::Jemalloc);
}

fn exit_from_a_second_thread(alloc: Allocator, main_thread: &str) {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "thread_exit", &[]);
    let (j, calls) = record_and_read(alloc, dir.path(), &exe, &[main_thread], 9);
    let procs = processes(&j);
    assert_eq!(procs.len(), 1, "{j:#}");
    assert_eq!(procs[0]["exit_code"], 9, "{j:#}");
    calls[0].assert_pairs(619, 200, "the exiting thread");
}

#[test]
fn exit_from_a_second_thread_while_main_waits_under_glibc() {
    exit_from_a_second_thread(Allocator::Glibc, "idle");
}

#[test]
fn exit_from_a_second_thread_while_main_waits_under_jemalloc() {
    exit_from_a_second_thread(Allocator::Jemalloc, "idle");
}

#[test]
fn exit_from_a_second_thread_while_main_allocates_under_glibc() {
    exit_from_a_second_thread(Allocator::Glibc, "busy");
}

#[test]
fn exit_from_a_second_thread_while_main_allocates_under_jemalloc() {
    exit_from_a_second_thread(Allocator::Jemalloc, "busy");
}

fn leaving_without_exit_handlers(alloc: Allocator) {
    for how in ["_exit", "_Exit", "quick_exit"] {
        let dir = tempfile::tempdir().unwrap();
        let exe = build(dir.path(), "quick_exit", &[]);
        let (j, calls) = record_and_read(alloc, dir.path(), &exe, &[how], 11);
        let procs = processes(&j);
        assert_eq!(procs.len(), 1, "{how}: {j:#}");
        assert_eq!(procs[0]["threads"], 3, "{how}: {j:#}");
        assert_eq!(procs[0]["exit_code"], 11, "{how}: {j:#}");
        calls_of(&calls, 0).assert_pairs(621, 900, how);
    }
}

#[test]
fn underscore_exit_sends_every_threads_pending_calls_under_glibc() {
    leaving_without_exit_handlers(Allocator::Glibc);
}

#[test]
fn underscore_exit_sends_every_threads_pending_calls_under_jemalloc() {
    leaving_without_exit_handlers(Allocator::Jemalloc);
}

fn edge_cases_of_the_malloc_family(alloc: Allocator) {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "alloc_edges", &["-ldl"]);
    // The program's answers with and without fragscope must be the same.
    let mut plain = Command::new(&exe);
    alloc.apply(&mut plain);
    let plain = plain.output().unwrap();
    assert_eq!(plain.status.code(), Some(0), "{}", common::stderr(&plain));
    let trace = dir.path().join("t.fsc");
    let traced = record(alloc, &trace, &exe, &[]);
    assert_eq!(traced.status.code(), Some(0), "{}", common::stderr(&traced));
    assert_eq!(
        String::from_utf8_lossy(&traced.stdout),
        String::from_utf8_lossy(&plain.stdout)
    );
    let j = info(&trace);
    assert_eq!(j["truncated"], false, "{j:#}");
    let s = &common::stream_calls(&trace)[0];
    let failed = |f: Func, size: u64| s.failed.get(&(f, size)).copied().unwrap_or(0);
    let unservable = u64::MAX - 4096;
    assert_eq!(s.allocated(Func::Realloc, 1001), 1, "{s:#?}");
    assert_eq!(s.freed(1001), 1, "realloc(p, 0) ends p: {s:#?}");
    // An overflowing count * size is recorded as the largest size, and as failed.
    assert_eq!(failed(Func::Calloc, u64::MAX), 1, "{s:#?}");
    assert_eq!(failed(Func::Reallocarray, u64::MAX), 1, "{s:#?}");
    assert_eq!(failed(Func::Malloc, unservable), 1, "{s:#?}");
    assert_eq!(failed(Func::Realloc, unservable), 1, "{s:#?}");
    assert_eq!(
        s.freed(1002),
        1,
        "a failed reallocarray keeps its block: {s:#?}"
    );
    assert_eq!(s.allocated(Func::PosixMemalign, 1003), 1, "{s:#?}");
    assert_eq!(failed(Func::PosixMemalign, 1003), 1, "{s:#?}");
    assert_eq!(s.allocated(Func::AlignedAlloc, 1024), 1, "{s:#?}");
    assert_eq!(s.allocated(Func::Memalign, 1005), 1, "{s:#?}");
    assert_eq!(s.allocated(Func::Valloc, 1006), 1, "{s:#?}");
    assert_eq!(s.allocated(Func::Pvalloc, 1007), 1, "{s:#?}");
    for size in [1003, 1024, 1005, 1006, 1008] {
        assert_eq!(s.freed(size), 1, "{size}: {s:#?}");
    }
    assert_eq!(s.misaligned, 0, "{s:#?}");
    assert_eq!(s.disorder(), 0, "{s:#?}");
}

#[test]
fn edge_cases_of_the_malloc_family_behave_as_without_fragscope_under_glibc() {
    edge_cases_of_the_malloc_family(Allocator::Glibc);
}

#[test]
fn edge_cases_of_the_malloc_family_behave_as_without_fragscope_under_jemalloc() {
    edge_cases_of_the_malloc_family(Allocator::Jemalloc);
}

fn cxx_new_and_delete(alloc: Allocator) {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::build_cxx(dir.path(), "cxx_new_delete");
    let (j, calls) = record_and_read(alloc, dir.path(), &exe, &["100"], 0);
    assert_eq!(processes(&j).len(), 1, "{j:#}");
    let s = &calls[0];
    // new and delete are recorded as malloc and free (new of an over-aligned type as
    // aligned_alloc), whether operator new is libstdc++'s or the allocator's own.
    s.assert_pairs(72, 101, "new/delete");
    s.assert_pairs(1000, 100, "new[]/delete[]");
    s.assert_pairs(88, 100, "nothrow new/delete");
    assert_eq!(s.allocated(Func::AlignedAlloc, 128), 100, "{s:#?}");
    assert_eq!(s.allocated(Func::AlignedAlloc, 256), 100, "{s:#?}");
    assert_eq!(s.freed(128) + s.freed(256), 200, "{s:#?}");
    assert_eq!(s.misaligned, 0, "{s:#?}");
    // libstdc++'s new records the malloc that failed before it throws; an allocator's
    // own new throws before anything is recorded.
    let threw = u64::from(alloc == Allocator::Glibc);
    let too_many = u64::MAX / 4;
    assert_eq!(
        s.failed
            .get(&(Func::Malloc, too_many))
            .copied()
            .unwrap_or(0),
        threw,
        "the new that threw: {s:#?}"
    );
}

#[test]
fn cxx_new_and_delete_in_all_forms_are_recorded_under_glibc() {
    cxx_new_and_delete(Allocator::Glibc);
}

#[test]
fn cxx_new_and_delete_in_all_forms_are_recorded_under_jemalloc() {
    cxx_new_and_delete(Allocator::Jemalloc);
}

/// The lines "MS PAIRS" that tests/c/killed.c wrote, after its pid.
fn progress(file: &Path) -> (i32, Vec<(u64, u64)>) {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut lines = text.lines();
    let pid = lines.next().and_then(|l| l.parse().ok()).unwrap_or(0);
    let points = lines
        .filter_map(|l| {
            let (ms, pairs) = l.split_once(' ')?;
            Some((ms.parse().ok()?, pairs.parse().ok()?))
        })
        .collect();
    (pid, points)
}

/// Starts tests/c/killed.c under fragscope and waits until it has run `run_ms`.
// The recorder is handed to the caller, who waits for it.
#[allow(clippy::zombie_processes)]
fn start_killed(
    alloc: Allocator,
    dir: &Path,
    flush_ms: u64,
    run_ms: u64,
) -> (std::process::Child, i32, std::path::PathBuf) {
    let exe = build(dir, "killed", &[]);
    let trace = dir.join("t.fsc");
    let progress_file = dir.join("progress");
    let mut recorder = common::record_command(
        alloc,
        &trace,
        &["--flush-ms", &flush_ms.to_string()],
        &exe,
        &[progress_file.to_str().unwrap()],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let started = std::time::Instant::now();
    loop {
        let (pid, points) = progress(&progress_file);
        if pid > 0 && points.last().is_some_and(|&(ms, _)| ms >= run_ms) {
            return (recorder, pid, trace);
        }
        if started.elapsed().as_secs() >= 30 {
            let _ = recorder.kill();
            let _ = recorder.wait();
            panic!("killed.c made no progress");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn sigkill(pid: i32) {
    let ok = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -KILL {pid} failed");
}

fn program_killed_mid_run(alloc: Allocator) {
    let dir = tempfile::tempdir().unwrap();
    let flush_ms = 100;
    let (recorder, pid, trace) = start_killed(alloc, dir.path(), flush_ms, 500);
    sigkill(pid);
    let out = recorder.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + 9), "{}", common::stderr(&out));
    let (_, points) = progress(&dir.path().join("progress"));
    let &(last_ms, last_pairs) = points.last().unwrap();
    let j = info(&trace);
    assert_eq!(j["truncated"], false, "{j:#}");
    let procs = processes(&j);
    assert_eq!(procs.len(), 1, "{j:#}");
    assert_eq!(procs[0]["signal"], 9, "{j:#}");
    let s = &common::stream_calls(&trace)[0];
    let recorded = s.allocated(Func::Malloc, 623);
    // At most what was made (the file lags by up to 1000 pairs), and at least what was
    // made one flush interval (plus scheduling slack) before the last progress line.
    assert!(recorded <= last_pairs + 1000, "{recorded} > {last_pairs}");
    let cutoff = last_ms.saturating_sub(flush_ms + 150);
    let sent_by_then = points
        .iter()
        .rev()
        .find(|&&(ms, _)| ms <= cutoff)
        .map_or(0, |&(_, pairs)| pairs);
    assert!(
        recorded >= sent_by_then,
        "{recorded} recorded, but {sent_by_then} were made by {cutoff} ms (killed after {last_ms} ms)"
    );
    assert_eq!(s.disorder(), 0, "{s:#?}");
}

#[test]
fn a_program_killed_mid_run_loses_at_most_one_flush_interval_under_glibc() {
    program_killed_mid_run(Allocator::Glibc);
}

#[test]
fn a_program_killed_mid_run_loses_at_most_one_flush_interval_under_jemalloc() {
    program_killed_mid_run(Allocator::Jemalloc);
}

fn recorder_killed_mid_run(alloc: Allocator) {
    let dir = tempfile::tempdir().unwrap();
    let (recorder, pid, trace) = start_killed(alloc, dir.path(), 100, 1000);
    // The recorder's rendezvous directory, from the program's environment.
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let rendezvous = environ
        .split(|&b| b == 0)
        .find_map(|v| v.strip_prefix(b"FRAGSCOPE_SOCK="))
        .map(|p| {
            Path::new(std::str::from_utf8(p).unwrap())
                .parent()
                .unwrap()
                .to_owned()
        })
        .expect("the program knows the recorder's socket");
    sigkill(recorder.id() as i32);
    // The program goes on untraced (and holds the recorder's stderr); it is ours to stop.
    sigkill(pid);
    let out = recorder.wait_with_output().unwrap();
    assert_eq!(out.status.code(), None, "killed by a signal");
    // The killed recorder's directory stays until the next recording sweeps it.
    assert!(rendezvous.exists(), "{}", rendezvous.display());
    let next = fragscope(&[
        "record".as_ref(),
        "-o".as_ref(),
        dir.path().join("next.fsc").as_os_str(),
        "--".as_ref(),
        "true".as_ref(),
    ]);
    assert!(next.status.success(), "{}", common::stderr(&next));
    assert!(
        !rendezvous.exists(),
        "{} was not swept",
        rendezvous.display()
    );
    let (_, points) = progress(&dir.path().join("progress"));
    let &(last_ms, last_pairs) = points.last().unwrap();
    // What reached the file reads back, and says it was cut short.
    let j = info(&trace);
    assert_eq!(j["truncated"], true, "{j:#}");
    let recorded: u64 = common::stream_calls(&trace)
        .iter()
        .map(|s| s.allocated(Func::Malloc, 623))
        .sum();
    assert!(recorded <= last_pairs + 1000, "{recorded} > {last_pairs}");
    // The recorder writes to disk at least every 100 ms even while calls pour in; what
    // it had half a second before it was killed is in the file.
    let sent_by_then = points
        .iter()
        .rev()
        .find(|&&(ms, _)| ms + 500 <= last_ms)
        .map_or(0, |&(_, pairs)| pairs);
    assert!(
        recorded >= sent_by_then,
        "{recorded} recorded, but {sent_by_then} were made half a second before the kill"
    );
}

#[test]
fn a_trace_whose_recorder_was_killed_reads_back_as_truncated_under_glibc() {
    recorder_killed_mid_run(Allocator::Glibc);
}

#[test]
fn a_trace_whose_recorder_was_killed_reads_back_as_truncated_under_jemalloc() {
    recorder_killed_mid_run(Allocator::Jemalloc);
}

/// A program whose only calls the compiler removed is told apart from a Go program: the
/// warning says no call was seen and lists the likely causes, naming Go only for Go.
#[test]
fn a_program_whose_calls_were_optimized_away_is_not_called_a_go_program() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::build(dir.path(), "no_calls", &["-O2"]);
    let trace = dir.path().join("t.fsc");
    let out = common::record(Allocator::Glibc, &trace, &exe, &[]);
    let err = common::stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("no malloc-family call was seen"), "{err}");
    assert!(err.contains("optimized away"), "{err}");
    assert!(!err.contains("Go program"), "{err}");
}

/// `record -o` replaces only a trace: a file of another kind is refused and left as it
/// is, a symbolic link is never written through (refused, or replaced with --force), and
/// an earlier trace is replaced.
#[test]
fn record_never_clobbers_what_is_not_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes.txt");
    let link = dir.path().join("link.fsc");
    std::fs::write(&notes, "keep me\n").unwrap();
    std::os::unix::fs::symlink(&notes, &link).unwrap();
    let record_into = |path: &Path, force: bool| {
        let mut args: Vec<&std::ffi::OsStr> = vec!["record".as_ref(), "-o".as_ref()];
        args.push(path.as_os_str());
        if force {
            args.push("--force".as_ref());
        }
        args.extend::<[&std::ffi::OsStr; 2]>(["--".as_ref(), "true".as_ref()]);
        fragscope(&args)
    };
    let out = record_into(&notes, false);
    assert!(!out.status.success());
    assert!(
        common::stderr(&out).contains("not a fragscope trace"),
        "{}",
        common::stderr(&out)
    );
    let out = record_into(&link, false);
    assert!(!out.status.success());
    assert!(
        common::stderr(&out).contains("symbolic link"),
        "{}",
        common::stderr(&out)
    );
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "keep me\n");
    let out = record_into(&link, true);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(!std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "keep me\n");
    // An earlier trace is replaced without being asked.
    let out = record_into(&link, false);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(info(&link)["truncated"], false);
}

/// `report` decodes on a thread of its own; where no thread can be started (a user at
/// the limit of their processes) it reads inline and says the same.
#[test]
fn a_report_that_cannot_start_a_thread_reads_in_its_own() {
    let tools = ["setpriv", "prlimit"];
    if unsafe { libc::getuid() } != 0
        || tools
            .iter()
            .any(|t| Command::new(t).arg("--help").output().is_err())
    {
        eprintln!("skipped: it needs root, setpriv and prlimit");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = build(dir.path(), "reuse_threads", &["-pthread"]);
    let trace = dir.path().join("t.fsc");
    let out = record(Allocator::Glibc, &trace, &exe, &["3", "2000"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    std::fs::set_permissions(&trace, std::fs::Permissions::from_mode(0o644)).unwrap();
    let report = |limited: bool| {
        let mut cmd = if limited {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
                .args(["prlimit", "--nproc=1", env!("CARGO_BIN_EXE_fragscope")]);
            c
        } else {
            Command::new(env!("CARGO_BIN_EXE_fragscope"))
        };
        let out = cmd.arg("report").arg(&trace).output().unwrap();
        assert!(out.status.success(), "{}", common::stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let inline = report(true);
    assert!(inline.contains("fragscope report"), "{inline}");
    assert_eq!(inline, report(false));
}
