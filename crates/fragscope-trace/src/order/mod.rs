//! The upper layer: one process's threads' calls ordered into one stream. Thread buffers
//! decoded into calls ([`stream_decoder`], [`call`]), merged by time, place and causality
//! ([`merge`], holding back past its memory budget in [`spill`]), with the live blocks
//! after each call ([`live`], their table by address in [`blocks`], its buckets in
//! [`buckets`]); read and decoded
//! ahead on a thread of its own ([`ahead`]). Built on `crate::format` alone; nothing there depends on this layer.

pub mod aggregate;
pub mod ahead;
mod blocks;
mod buckets;
pub mod call;
pub mod live;
pub mod merge;
mod spill;
pub mod stream_decoder;
