//! The output a PTY session keeps for replay: the newest `cap` bytes, addressed
//! by absolute offsets (bytes ever written), as chunks tagged with their stream
//! so live readers can still tell stdout from stderr in pipe mode.
use bytes::Bytes;
use std::collections::VecDeque;

/// 1 MiB, as execd keeps.
pub const CAPACITY: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

#[derive(Debug)]
pub struct Ring {
    cap: usize,
    /// (absolute offset of the first byte, stream, bytes), oldest first.
    chunks: VecDeque<(u64, Stream, Bytes)>,
    held: usize,
    total: u64,
}

impl Ring {
    pub fn new(cap: usize) -> Ring {
        Ring { cap, chunks: VecDeque::new(), held: 0, total: 0 }
    }

    /// Bytes ever written: the offset the next byte will have.
    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn push(&mut self, stream: Stream, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        // Only the newest `cap` bytes of an oversized write can be kept.
        let skip = data.len().saturating_sub(self.cap);
        self.total += skip as u64;
        let data = &data[skip..];
        self.chunks.push_back((self.total, stream, Bytes::copy_from_slice(data)));
        self.total += data.len() as u64;
        self.held += data.len();
        while self.held > self.cap {
            let Some((start, s, front)) = self.chunks.pop_front() else { break };
            let excess = self.held - self.cap;
            if excess < front.len() {
                // Keep the tail of the oldest chunk.
                self.chunks.push_front((start + excess as u64, s, front.slice(excess..)));
                self.held -= excess;
            } else {
                self.held -= front.len();
            }
        }
    }

    /// The chunks from `offset` on (clamped to the oldest byte kept) and the
    /// offset of the first byte returned. Caught up: nothing, and `total`.
    pub fn read_from(&self, offset: u64) -> (Vec<(Stream, Bytes)>, u64) {
        if offset >= self.total {
            return (Vec::new(), self.total);
        }
        let oldest = self.chunks.front().map_or(self.total, |c| c.0);
        let from = offset.max(oldest);
        let mut out = Vec::new();
        for (start, stream, data) in &self.chunks {
            let end = start + data.len() as u64;
            if end <= from {
                continue;
            }
            let cut = from.saturating_sub(*start) as usize;
            out.push((*stream, data.slice(cut..)));
        }
        (out, from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(chunks: &[(Stream, Bytes)]) -> Vec<u8> {
        chunks.iter().flat_map(|c| c.1.to_vec()).collect()
    }

    #[test]
    fn reads_from_any_offset_and_clamps_to_the_oldest_byte() {
        let mut r = Ring::new(8);
        r.push(Stream::Stdout, b"abcd");
        r.push(Stream::Stderr, b"efgh");
        let (c, at) = r.read_from(2);
        assert_eq!((flat(&c), at), (b"cdefgh".to_vec(), 2));
        assert_eq!(c[1].0, Stream::Stderr);
        r.push(Stream::Stdout, b"ijk");
        assert_eq!(r.total(), 11);
        let (c, at) = r.read_from(0);
        assert_eq!((flat(&c), at), (b"defghijk".to_vec(), 3), "evicted bytes are skipped");
        assert_eq!(r.read_from(11).0.len(), 0);
        assert_eq!(r.read_from(99).1, 11);
    }

    #[test]
    fn an_oversized_write_keeps_its_tail() {
        let mut r = Ring::new(4);
        r.push(Stream::Stdout, b"0123456789");
        assert_eq!(r.total(), 10);
        let (c, at) = r.read_from(0);
        assert_eq!((flat(&c), at), (b"6789".to_vec(), 6));
    }
}
