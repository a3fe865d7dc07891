//! A byte stream that knows its offset and tells a clean end from a short read.

use std::io::{self, BufRead, BufReader, Read};

use crate::Error;

pub(crate) struct Source<R: Read> {
    inner: BufReader<R>,
    offset: u64,
}

/// What a read of an exact number of bytes found.
pub(crate) enum Fill {
    Full,
    /// The stream ended before the buffer was full.
    Short,
}

impl<R: Read> Source<R> {
    pub(crate) fn new(reader: R) -> Self {
        Source {
            inner: BufReader::with_capacity(64 * 1024, reader),
            offset: 0,
        }
    }

    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// Reads until `buf` is full or the stream ends.
    pub(crate) fn fill(&mut self, buf: &mut [u8]) -> Result<Fill, Error> {
        // Most reads are a few bytes already buffered: copy them without a read call.
        let buffered = self.inner.buffer();
        if buffered.len() >= buf.len() {
            buf.copy_from_slice(&buffered[..buf.len()]);
            self.inner.consume(buf.len());
            self.offset += buf.len() as u64;
            return Ok(Fill::Full);
        }
        let mut done = 0;
        while done < buf.len() {
            match self.inner.read(&mut buf[done..]) {
                Ok(0) => break,
                Ok(n) => {
                    done += n;
                    self.offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(Error::Io {
                        offset: self.offset,
                        source,
                    })
                }
            }
        }
        Ok(if done == buf.len() {
            Fill::Full
        } else {
            Fill::Short
        })
    }

    /// Reads `N` bytes, or `None` when the stream ends first.
    pub(crate) fn array<const N: usize>(&mut self) -> Result<Option<[u8; N]>, Error> {
        let mut buf = [0u8; N];
        Ok(match self.fill(&mut buf)? {
            Fill::Full => Some(buf),
            Fill::Short => None,
        })
    }

    /// Skips `n` bytes without keeping them; `false` when the stream ends first.
    pub(crate) fn skip(&mut self, n: u64) -> Result<bool, Error> {
        let mut scratch = [0u8; 4096];
        let mut left = n;
        while left > 0 {
            let step = left.min(scratch.len() as u64) as usize;
            if let Fill::Short = self.fill(&mut scratch[..step])? {
                return Ok(false);
            }
            left -= step as u64;
        }
        Ok(true)
    }
}
