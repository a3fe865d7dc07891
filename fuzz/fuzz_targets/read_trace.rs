//! Any bytes given to the trace reader give chunks or a reported stop, never a panic,
//! a hang or an unbounded allocation. Seed corpus: fuzz/corpus/read_trace (real traces).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fragscope_trace::merge::read_all_from_bytes(data);
});
