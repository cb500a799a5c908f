//! Sparse files: a file's data extents (`SEEK_DATA` / `SEEK_HOLE`), so a
//! `truncate -s 200G` in a 1 GiB workspace is read, stored, written and
//! copied as the few bytes it holds, its holes recreated as holes.
use std::fs::File;
use std::os::unix::fs::FileExt;

use rustix::fs::SeekFrom;
use rustix::io::Errno;

/// The `[offset, len]` data extents of `f` (which has `size` bytes), in
/// order. A file system without hole support reports one extent: the file.
pub(crate) fn data_extents(f: &File, size: u64) -> std::io::Result<Vec<[u64; 2]>> {
    let mut out = Vec::new();
    let mut off = 0;
    while off < size {
        let start = match rustix::fs::seek(f, SeekFrom::Data(off)) {
            Ok(p) => p,
            // No data at or after `off`: the rest is a hole.
            Err(Errno::NXIO) => break,
            Err(Errno::INVAL) if off == 0 => return Ok(vec![[0, size]]),
            Err(e) => return Err(e.into()),
        };
        if start >= size {
            break;
        }
        let end = rustix::fs::seek(f, SeekFrom::Hole(start))?.min(size);
        out.push([start, end - start]);
        off = end;
    }
    Ok(out)
}

/// `None` for a dense file (one extent from 0 to its end, or empty): the
/// manifest then carries no extents, as in older builds.
pub(crate) fn as_recorded(extents: Vec<[u64; 2]>, size: u64) -> Option<Vec<[u64; 2]>> {
    let dense = size == 0 || extents.as_slice() == [[0, size]];
    (!dense).then_some(extents)
}

/// The extents a manifest entry stands for (`[[0, size]]` when dense).
pub(crate) fn recorded(data: &Option<Vec<[u64; 2]>>, size: u64) -> Vec<[u64; 2]> {
    match data {
        Some(d) => d.clone(),
        None if size == 0 => Vec::new(),
        None => vec![[0, size]],
    }
}

/// Copies the extents of `src` into `dest` at the same offsets: with
/// `copy_file_range` (no bytes through user space), or, between two file
/// systems (each workspace is its own), through a buffer. Never reads a hole.
pub(crate) fn copy_extents(src: &File, dest: &File, extents: &[[u64; 2]]) -> std::io::Result<u64> {
    let mut buf = Vec::new();
    let mut copied = 0;
    for &[offset, len] in extents {
        let (mut off_in, mut off_out, mut left) = (offset, offset, len);
        while left > 0 {
            let want = usize::try_from(left.min(1 << 30)).unwrap_or(1 << 30);
            let n = match rustix::fs::copy_file_range(src, Some(&mut off_in), dest, Some(&mut off_out), want) {
                Ok(n) => n as u64,
                Err(Errno::XDEV | Errno::NOSYS | Errno::OPNOTSUPP | Errno::INVAL) => {
                    let n = left.min(1 << 20);
                    buf.resize(n as usize, 0);
                    src.read_exact_at(&mut buf, off_in)?;
                    dest.write_all_at(&buf, off_out)?;
                    (off_in, off_out) = (off_in + n, off_out + n);
                    n
                }
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            left -= n;
            copied += n;
        }
    }
    Ok(copied)
}
