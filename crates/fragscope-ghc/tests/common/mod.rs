//! Writes small eventlogs byte by byte, for events the local GHC does not emit (BLOCKS_SIZE,
//! MEM_RETURN) and for layouts of other RTS versions.

#![allow(dead_code)]

/// (tag, payload size; `None` for variable size)
pub type Declaration = (u16, Option<u16>);

/// The layouts GHC 9.2 declares for the events the tests use, plus a few types no RTS
/// defines, to check that unknown events are skipped by their declared size.
pub const GHC_9_2: &[Declaration] = &[
    (1, Some(4)),    // RUN_THREAD
    (9, Some(0)),    // GC_START
    (10, Some(0)),   // GC_END
    (18, Some(14)),  // BLOCK_MARKER
    (29, None),      // RTS_IDENTIFIER
    (30, None),      // PROGRAM_ARGS
    (49, Some(12)),  // HEAP_ALLOCATED
    (50, Some(12)),  // HEAP_SIZE
    (51, Some(12)),  // HEAP_LIVE
    (52, Some(38)),  // HEAP_INFO_GHC
    (53, Some(58)),  // GC_STATS_GHC
    (90, Some(16)),  // MEM_RETURN
    (91, Some(12)),  // BLOCKS_SIZE
    (160, None),     // HEAP_PROF_BEGIN
    (161, None),     // HEAP_PROF_COST_CENTRE
    (162, Some(8)),  // HEAP_PROF_SAMPLE_BEGIN
    (163, None),     // HEAP_PROF_SAMPLE_COST_CENTRE
    (164, None),     // HEAP_PROF_SAMPLE_STRING
    (165, Some(8)),  // HEAP_PROF_SAMPLE_END
    (1000, Some(5)), // unknown, fixed size
    (1001, None),    // unknown, variable size
];

pub struct LogBuilder {
    types: Vec<Declaration>,
    data: Vec<u8>,
    open_block: Option<usize>,
}

impl LogBuilder {
    pub fn new(types: &[Declaration]) -> Self {
        let mut data = Vec::new();
        data.extend_from_slice(b"hdrbhetb");
        for &(tag, size) in types {
            data.extend_from_slice(b"etb\0");
            data.extend_from_slice(&tag.to_be_bytes());
            data.extend_from_slice(&size.unwrap_or(0xffff).to_be_bytes());
            let description = format!("type {tag}");
            data.extend_from_slice(&(description.len() as u32).to_be_bytes());
            data.extend_from_slice(description.as_bytes());
            data.extend_from_slice(&0u32.to_be_bytes());
            data.extend_from_slice(b"ete\0");
        }
        data.extend_from_slice(b"hetehdredatb");
        LogBuilder {
            types: types.to_vec(),
            data,
            open_block: None,
        }
    }

    /// Bytes so far; the offset where the next item starts.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Starts a block for `capability` (0xffff: the RTS's global buffer).
    pub fn begin_block(&mut self, capability: u16) -> &mut Self {
        self.open_block = Some(self.data.len());
        let mut payload = Vec::new();
        payload.extend_from_slice(&0u32.to_be_bytes());
        payload.extend_from_slice(&0u64.to_be_bytes());
        payload.extend_from_slice(&capability.to_be_bytes());
        self.event(18, 0, &payload)
    }

    /// Writes the block's length into its marker, as the RTS does when it flushes.
    pub fn end_block(&mut self) -> &mut Self {
        let start = self.open_block.take().expect("a block is open");
        let size = (self.data.len() - start) as u32;
        self.data[start + 10..start + 14].copy_from_slice(&size.to_be_bytes());
        self
    }

    pub fn event(&mut self, tag: u16, time_ns: u64, payload: &[u8]) -> &mut Self {
        let size = self
            .types
            .iter()
            .find(|t| t.0 == tag)
            .map(|t| t.1)
            .expect("declared type");
        self.data.extend_from_slice(&tag.to_be_bytes());
        self.data.extend_from_slice(&time_ns.to_be_bytes());
        match size {
            Some(n) => assert_eq!(n as usize, payload.len(), "payload of type {tag}"),
            None => self
                .data
                .extend_from_slice(&(payload.len() as u16).to_be_bytes()),
        }
        self.data.extend_from_slice(payload);
        self
    }

    /// Ends the data with the terminator.
    pub fn finish(&mut self) -> Vec<u8> {
        let mut data = self.data.clone();
        data.extend_from_slice(&0xffffu16.to_be_bytes());
        data
    }

    /// The bytes without a terminator, as a killed program leaves them.
    pub fn unterminated(&self) -> Vec<u8> {
        self.data.clone()
    }
}

/// Concatenates big-endian fields: `fields![u32: 0, u64: 5]`.
#[macro_export]
macro_rules! fields {
    ($($ty:ident : $value:expr),* $(,)?) => {{
        let mut bytes: Vec<u8> = Vec::new();
        $( bytes.extend_from_slice(&($value as $ty).to_be_bytes()); )*
        bytes
    }};
}

pub fn nul_terminated(text: &str) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    bytes.push(0);
    bytes
}
