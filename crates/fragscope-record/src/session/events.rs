//! Storing one connection's event buffers: packed while the recorder keeps up with the
//! process, raw while it does not (`packing`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fragscope_trace::{ChunkKind, EventsHeader, PackedBuffer};

use super::options::PackMode;
use super::packing::{
    BEHIND_BYTES, BEHIND_STREAK, FIRST_RESUME_AFTER, KEPT_UP_BUFFERS, MOST_RESUME_AFTER,
};
use super::shared::Shared;

/// Stores one connection's event buffers (packed while its stream is packing).
pub(super) struct EventStore<'a> {
    pub(super) shared: &'a Arc<Shared>,
    pub(super) packed: PackedBuffer,
    pub(super) pack_failed: bool,
    /// Packed buffers in a row after which the connection had a backlog.
    pub(super) behind: u32,
}

impl EventStore<'_> {
    /// Stores one buffer (`has_usable`: it defines usable sizes); says whether it was
    /// packed.
    pub(super) fn events(&mut self, h: EventsHeader, payload: &[u8], has_usable: bool) -> bool {
        let shared = self.shared;
        shared
            .event_bytes
            .fetch_add(payload.len() as u64, Ordering::Relaxed);
        let (packer, packing, pid) = {
            let mut procs = shared.procs.lock().unwrap();
            match procs.streams.get_mut(h.stream as usize) {
                Some(st) => {
                    st.event_bytes += payload.len() as u64;
                    (Some(st.packer.clone()), st.packing, st.pid)
                }
                None => (None, false, 0),
            }
        };
        match packer {
            Some(packer) if packing => {
                let mut p = packer.lock().unwrap();
                if let Err(e) = p.pack(h.tid, h.first_tick, payload, &mut self.packed) {
                    // Our own interposer wrote it: say so once, keep what decoded.
                    if !self.pack_failed {
                        eprintln!("fragscope: a buffer of pid {pid} ends early: {e}");
                        self.pack_failed = true;
                    }
                }
                let h = EventsHeader {
                    packed: true,
                    tables_reset: self.packed.tables_reset,
                    ..h
                };
                let payload = h.encode_with(&self.packed.bytes);
                // The header joins the first section (the planes' directory).
                let header_len = payload.len() - self.packed.bytes.len();
                let ends = self.packed.section_ends.iter().map(|e| e + header_len);
                shared.send_sections(ChunkKind::PackedEvents, payload, ends.collect());
                true
            }
            packer => {
                // Held while the buffer is sent, as a packed one is: a packed buffer that
                // relies on the sizes this one defines must not reach the file first.
                let learner = packer.filter(|_| has_usable && shared.pack == PackMode::Auto);
                let _learnt = learner.as_ref().map(|packer| {
                    let mut p = packer.lock().unwrap();
                    p.learn_usable(h.tid, h.first_tick, payload);
                    p
                });
                shared.send(ChunkKind::Events, h.encode_with(payload));
                false
            }
        }
    }

    /// Auto packing: `backlog` bytes waited on the connection once a buffer of `stream`
    /// was stored (`packed` or not). A stream that stays behind is stored raw until it
    /// has kept up for a while.
    pub(super) fn stored_with_backlog(&mut self, stream: u32, packed: bool, backlog: usize) {
        let resume = {
            let mut procs = self.shared.procs.lock().unwrap();
            let Some(st) = procs.streams.get_mut(stream as usize) else {
                return;
            };
            if packed {
                st.packed_run = st.packed_run.saturating_add(1);
                self.behind = if backlog >= BEHIND_BYTES {
                    self.behind + 1
                } else {
                    0
                };
                if self.behind >= BEHIND_STREAK && st.packing {
                    st.packing = false;
                    st.quiet_raw = 0;
                    self.behind = 0;
                    if st.packed_run >= KEPT_UP_BUFFERS {
                        st.resume_after = FIRST_RESUME_AFTER;
                    }
                }
                return;
            }
            st.quiet_raw = if backlog == 0 { st.quiet_raw + 1 } else { 0 };
            if st.packing || st.quiet_raw < st.resume_after {
                return;
            }
            st.resume_after = (st.resume_after * 2).min(MOST_RESUME_AFTER);
            st.packed_run = 0;
            st.packer.clone()
        };
        // Tables emptied before any buffer is packed again.
        resume.lock().unwrap().resume();
        if let Some(st) = self
            .shared
            .procs
            .lock()
            .unwrap()
            .streams
            .get_mut(stream as usize)
        {
            st.packing = true;
        }
    }
}
