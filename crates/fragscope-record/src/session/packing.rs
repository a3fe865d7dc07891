//! When a stream's event buffers are stored packed: the figures of the policy that
//! `shared` starts each stream with and `events` applies.

/// Auto packing stops for a process once this many bytes wait on its connection after
/// each of `BEHIND_STREAK` packed buffers in a row: its buffers arrive faster than they
/// are packed, and the queue is half full (an interposer buffer holds at most 128 KiB).
/// A burst of a few buffers is packed: stopping at the first buffer that waited made
/// how much of a bursty program got packed depend on the scheduler (many_stacks.c's
/// trace varied by 126% of its median over 5 runs; 58% since).
pub(super) const BEHIND_BYTES: usize = (QUEUED_MESSAGES / 2) * (128 << 10);
pub(super) const BEHIND_STREAK: u32 = 2;
/// Packing resumes after this many buffers in a row were stored raw with nothing waiting
/// behind them, doubled each time it resumes (up to the most), so a program that
/// allocates flat out is tried again less often; back to the first once packing kept up
/// for `KEPT_UP_BUFFERS` buffers in a row (a program busy only in bursts). A try costs
/// the recorder's CPU, not the program's time (it stops at half a queue), so the most is
/// low: with 256, a flat-out program (churn.c, 371 buffers) had 40 to 250 buffers packed
/// from run to run (2.5 to 3.7 bytes a call); with 16, 124 to 161 (3.0 to 3.2).
pub(super) const FIRST_RESUME_AFTER: u32 = 1;
pub(super) const MOST_RESUME_AFTER: u32 = 16;
pub(super) const KEPT_UP_BUFFERS: u32 = 16;

/// Messages a connection's reader may hold for its handler (each at most an interposer
/// buffer): enough that the program goes on while a few buffers are packed, few enough
/// that a recorder that falls behind makes the program wait rather than piling up its
/// buffers.
pub(super) const QUEUED_MESSAGES: usize = 16;
