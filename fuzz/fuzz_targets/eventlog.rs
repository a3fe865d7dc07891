//! Any bytes given to the eventlog reader give events and a reported end or an error,
//! never a panic, a hang or an unbounded allocation. Seed corpus: fuzz/corpus/eventlog
//! (real eventlogs).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(log) = fragscope_ghc::Eventlog::parse_intact(data) {
        let _ = log.heap_profile();
    }
});
