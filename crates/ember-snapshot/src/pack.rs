//! How a chunk is stored: a sequence of zstd frames, one per 256 KiB segment.
//! A segment whose first 4 KiB do not compress (random, already compressed
//! or encrypted data) is stored as a raw zstd frame, which costs a copy
//! instead of a compression attempt; the others are compressed at the chunking
//! level. Concatenated frames are valid zstd input, so readers decompress any
//! chunk with one call, whatever mix it holds.
use std::io;

use zstd::bulk::Compressor;

/// Bytes per frame; large enough that frame headers and restarting the match
/// window cost little (≪ 1 % on text).
const SEGMENT: usize = 256 << 10;
/// Bytes probed at level 1 to decide whether a segment is worth compressing.
const PROBE: usize = 4 << 10;
/// Largest block of a zstd frame.
const BLOCK: usize = 128 << 10;
const ZSTD_MAGIC: u32 = 0xFD2F_B528;
/// A raw frame's header: magic, descriptor, 4-byte content size; and an
/// empty segment's one empty block.
const RAW_OVERHEAD: usize = 4 + 1 + 4 + 3;

/// One worker's compression contexts, reused from chunk to chunk.
pub(crate) struct Packer {
    level: i32,
    main: Option<Compressor<'static>>,
    probe: Option<Compressor<'static>>,
}

impl Packer {
    pub(crate) fn new(level: i32) -> Self {
        Packer { level, main: None, probe: None }
    }

    /// The stored form of `data`.
    #[cfg(test)]
    pub(crate) fn pack(&mut self, data: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.pack_into(data, &mut out)?;
        Ok(out)
    }

    /// The stored form of `data`, in `out` (emptied first). Each frame is
    /// written in place at `out`'s end, and a worker passes the same `out`
    /// for every chunk: no copy of a frame, no fresh pages per chunk.
    pub(crate) fn pack_into(&mut self, data: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        out.clear();
        for seg in data.chunks(SEGMENT) {
            if self.incompressible(seg)? {
                out.reserve(seg.len() + RAW_OVERHEAD + 3 * seg.len().div_ceil(BLOCK));
                raw_frame(seg, out);
            } else {
                let main = match &mut self.main {
                    Some(c) => c,
                    none => none.insert(Compressor::new(self.level)?),
                };
                out.reserve(zstd::zstd_safe::compress_bound(seg.len()));
                let at = out.len();
                let mut end = io::Cursor::new(&mut *out);
                end.set_position(at as u64);
                main.compress_to_buffer(seg, &mut end)?;
            }
        }
        Ok(())
    }

    fn incompressible(&mut self, seg: &[u8]) -> io::Result<bool> {
        if seg.len() < 2 * PROBE {
            return Ok(false);
        }
        let probe = match &mut self.probe {
            Some(c) => c,
            none => none.insert(Compressor::new(1)?),
        };
        let packed = probe.compress(&seg[..PROBE])?;
        // Under 3 % saved on the sample: not worth the CPU on the whole segment.
        Ok(packed.len() * 100 >= PROBE * 97)
    }
}

/// A zstd frame holding `seg` in raw blocks: single segment, 4-byte content
/// size, no checksum (the chunk's sha256 covers it).
fn raw_frame(seg: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&ZSTD_MAGIC.to_le_bytes());
    out.push(0b1010_0000); // frame content size: 4 bytes; single segment
    out.extend_from_slice(&(seg.len() as u32).to_le_bytes());
    let blocks = seg.len().div_ceil(BLOCK).max(1);
    for (i, block) in seg.chunks(BLOCK).enumerate() {
        let last = u32::from(i + 1 == blocks);
        // 3 bytes: last flag, type 0 (raw), size.
        let header = ((block.len() as u32) << 3) | last;
        out.extend_from_slice(&header.to_le_bytes()[..3]);
        out.extend_from_slice(block);
    }
    if seg.is_empty() {
        out.extend_from_slice(&1u32.to_le_bytes()[..3]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(len: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// One worker's `out` reused for chunk after chunk, each frame appended
    /// in place: the same bytes as a fresh packer's, none of the last chunk's.
    #[test]
    fn a_reused_output_holds_the_same_bytes_as_a_fresh_one() {
        let text: Vec<u8> = b"the agent writes the workspace and the snapshot ".repeat(20_000);
        let mut mixed = text[..SEGMENT + 7].to_vec();
        mixed.extend_from_slice(&noise(SEGMENT));
        mixed.extend_from_slice(&text[..SEGMENT * 2]);
        let (mut packer, mut out) = (Packer::new(3), vec![0xAA; 3 * SEGMENT]);
        for data in [mixed.clone(), noise(10), text.clone(), Vec::new(), mixed] {
            packer.pack_into(&data, &mut out).unwrap();
            assert_eq!(out, Packer::new(3).pack(&data).unwrap(), "length {}", data.len());
            if !data.is_empty() {
                assert_eq!(zstd::bulk::decompress(&out, data.len()).unwrap(), data);
            }
        }
    }

    #[test]
    fn mixed_chunks_round_trip() {
        let text: Vec<u8> = b"the agent writes the workspace and the snapshot ".repeat(20_000);
        let mut mixed = noise(300_000);
        mixed.extend_from_slice(&text[..500_000]);
        mixed.extend_from_slice(&noise(5));
        for data in [mixed, noise(1), noise(BLOCK), noise(SEGMENT + 1), text.clone()] {
            let packed = Packer::new(3).pack(&data).unwrap();
            let back = zstd::bulk::decompress(&packed, data.len()).unwrap();
            assert_eq!(back, data, "length {}", data.len());
        }
        let packed = Packer::new(3).pack(&text).unwrap();
        assert!(packed.len() * 20 < text.len(), "text is compressed: {} of {}", packed.len(), text.len());
        let random = noise(SEGMENT * 2);
        let packed = Packer::new(3).pack(&random).unwrap();
        assert!(packed.len() < random.len() + 64, "random data is stored raw: {}", packed.len());
    }

    #[test]
    fn raw_frames_decode_alone() {
        let data = noise(BLOCK * 2 + 7);
        let mut frame = Vec::new();
        raw_frame(&data, &mut frame);
        assert_eq!(zstd::bulk::decompress(&frame, data.len()).unwrap(), data);
    }
}
