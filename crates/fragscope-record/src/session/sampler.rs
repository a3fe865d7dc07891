//! The clock's ticker, and the sampler: RSS every 10 ms, smaps_rollup every 100 ms,
//! snapshots, and the census thread it asks for GHC block censuses.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use fragscope_trace::{ChunkKind, Rollup, SnapshotReason};

use super::shared::{CensusRequest, Shared};
use crate::procfs;

pub(super) const RSS_INTERVAL: Duration = Duration::from_millis(10);
pub(super) const ROLLUP_EVERY: u32 = 10; // RSS intervals
pub(super) const NEAR_PEAK_GROWTH: f64 = 1.10;
pub(super) const NEAR_PEAK_MIN_GAP: Duration = Duration::from_millis(250);

/// Tells the ticker and the sampler to stop, and wakes them at once: they would otherwise
/// finish their sleep first, and every recording would end that much later.
#[derive(Default)]
pub(super) struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    pub(super) fn stop(&self) {
        *self.stopped.lock().unwrap() = true;
        self.wake.notify_all();
    }

    /// Sleeps for `d` unless stopped meanwhile; true once stopped.
    pub(super) fn sleep(&self, d: Duration) -> bool {
        let stopped = self.stopped.lock().unwrap();
        let (stopped, _) = self
            .wake
            .wait_timeout_while(stopped, d, |stopped| !*stopped)
            .unwrap();
        *stopped
    }
}

/// Takes the censuses the sampler asks for, one at a time, on its own thread: a census
/// with its reference scan can read hundreds of MiB, and the sampler must go on taking
/// RSS every 10 ms meanwhile (else the timeline has a hole of that length, a phase of
/// its own hidden in it). The census's time is when it stops the program.
pub(super) fn census_worker(shared: &Shared, requests: Receiver<CensusRequest>) {
    for r in requests {
        // Asked before the process exec'd another image, which the census would read.
        if !shared.runs_its_image(r.stream, r.pid) {
            continue;
        }
        if let Some(census) = shared
            .censuses
            .take(r.stream, r.pid, || shared.tick(), r.reason)
        {
            // The exec came while the census was taken.
            if shared.runs_its_image(r.stream, r.pid) {
                shared.send(ChunkKind::GhcCensus, census.encode());
            }
        }
    }
}

/// The sampler: RSS of every live stream every 10 ms, smaps_rollup every 100 ms,
/// page-residency snapshots every `snapshot_ms` and near RSS peaks.
pub(super) fn sample(shared: Arc<Shared>, snapshot_every: Duration, stop: Arc<Stop>) {
    let (census, requests) = sync_channel::<CensusRequest>(1);
    let worker = {
        let shared = shared.clone();
        thread::Builder::new()
            .name("fragscope-census".into())
            .spawn(move || census_worker(&shared, requests))
    };
    sample_until_stopped(&shared, snapshot_every, &stop, &census);
    drop(census);
    if let Ok(w) = worker {
        let _ = w.join();
    }
}

pub(super) fn sample_until_stopped(
    shared: &Shared,
    snapshot_every: Duration,
    stop: &Stop,
    census: &SyncSender<CensusRequest>,
) {
    let mut round = 0u32;
    let mut last_periodic = Instant::now();
    while !stop.sleep(RSS_INTERVAL) {
        round = round.wrapping_add(1);
        let tick = shared.tick();
        let live: Vec<(u32, u32)> = {
            let procs = shared.procs.lock().unwrap();
            procs
                .streams
                .iter()
                .enumerate()
                .filter(|(_, s)| s.sampled())
                .map(|(i, s)| (i as u32, s.pid))
                .collect()
        };
        let periodic = last_periodic.elapsed() >= snapshot_every;
        if periodic {
            last_periodic = Instant::now();
            shared.clock.request_stats_and_flush();
        }
        for (stream, pid) in live {
            let Some(rss) = procfs::read_rss(pid, tick) else {
                let disconnected =
                    shared.procs.lock().unwrap().streams[stream as usize].connections == 0;
                if disconnected {
                    shared.end_stream(stream);
                }
                continue;
            };
            let near_peak = {
                let mut procs = shared.procs.lock().unwrap();
                let st = &mut procs.streams[stream as usize];
                st.rss.push(rss);
                if st.rss.len() >= 100 {
                    shared.flush_rss(stream, st);
                }
                rss.vm_rss_kib as f64 > st.peak_rss_at_snapshot as f64 * NEAR_PEAK_GROWTH
                    && st
                        .last_snapshot
                        .is_none_or(|t| t.elapsed() >= NEAR_PEAK_MIN_GAP)
            };
            if periodic || near_peak {
                let reason = if periodic {
                    SnapshotReason::Periodic
                } else {
                    // The allocator's view near the peak too (answered at the threads'
                    // next calls, within a few ms).
                    shared.clock.request_stats_and_flush();
                    SnapshotReason::NearPeak
                };
                shared.snapshot(stream, pid, reason, Some(census));
            } else if round.is_multiple_of(ROLLUP_EVERY) {
                if let Some(fields) = procfs::read_rollup(pid) {
                    shared.send(
                        ChunkKind::Rollup,
                        Rollup {
                            stream,
                            tick,
                            fields,
                        }
                        .encode(),
                    );
                }
            }
        }
    }
}

/// Starts the ticker: the shared clock page advanced every millisecond until `stop`.
pub(super) fn spawn_ticker(
    shared: &Arc<Shared>,
    stop: &Arc<Stop>,
) -> std::io::Result<JoinHandle<()>> {
    let shared = shared.clone();
    let stop = stop.clone();
    let t0 = Instant::now();
    thread::Builder::new()
        .name("fragscope-ticker".into())
        .spawn(move || loop {
            shared.clock.advance_tick(t0.elapsed().as_millis() as u64);
            if stop.sleep(Duration::from_millis(1)) {
                break;
            }
        })
}

/// Starts the sampler, with a snapshot every `snapshot_ms` (10 at the least).
pub(super) fn spawn_sampler(
    shared: &Arc<Shared>,
    stop: &Arc<Stop>,
    snapshot_ms: u32,
) -> std::io::Result<JoinHandle<()>> {
    let shared = shared.clone();
    let stop = stop.clone();
    let every = Duration::from_millis(snapshot_ms.max(10).into());
    thread::Builder::new()
        .name("fragscope-sampler".into())
        .spawn(move || sample(shared, every, stop))
}
