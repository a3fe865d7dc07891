//! Any bytes as one thread buffer's event records, raw or packed, give records or an
//! error, never a panic or a hang; the merge takes whatever decoded. (Through
//! read_trace, mutated chunks mostly stop at their checksum, so the record decoders are
//! fuzzed here directly.) The first byte picks the form and the thread; two buffers
//! of two threads are merged, so the packed form's tables carry over between them.
#![no_main]
use fragscope_trace::merge::Merger;
use fragscope_trace::EventsHeader;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let packed = selector & 1 == 1;
    let half = rest.len() / 2;
    let mut merger = Merger::new();
    for (n, records) in [&rest[..half], &rest[half..]].into_iter().enumerate() {
        let h = EventsHeader {
            stream: 0,
            tid: 1 + (n as u32 & u32::from(selector >> 1 & 1)),
            seq: n as u32,
            first_tick: u64::from(selector >> 2),
            last_tick: u64::from(selector >> 2) + 1,
            thread_exited: selector & 0x80 != 0,
            // The first buffer may be an idle thread's (not waited for by the merge).
            thread_idle: n == 0 && selector & 0x40 != 0,
            packed,
            // The second packed buffer may start from empty tables (packing resumed).
            tables_reset: n == 1 && selector & 0x20 != 0,
        };
        let _ = merger.push_chunk(&h, records);
        while merger.pop().is_some() {}
    }
    merger.finish();
    while merger.pop().is_some() {}
});
