//! The benchmark's tree: many small files and some large ones, about half of
//! the bytes compressible text and half random.
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::{io, BenchError, Rng};

pub(super) struct Tree {
    pub bytes: u64,
    /// (path, size, is large)
    pub files: Vec<(PathBuf, u64, bool)>,
}

const WORDS: &[&str] = &[
    "agent",
    "sandbox",
    "workspace",
    "snapshot",
    "chunk",
    "manifest",
    "lease",
    "epoch",
    "the",
    "of",
    "and",
    "fn",
    "let",
    "return",
    "error",
    "context",
    "store",
    "object",
    "tree",
    "file",
    "bytes",
    "hash",
    "zstd",
    "restore",
];

/// `len` bytes: random, or text built from a small vocabulary (compresses ~4x).
fn content(rng: &mut Rng, len: usize, text: bool) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    if !text {
        rng.fill(&mut buf);
        return buf;
    }
    let mut i = 0;
    while i < len {
        let w = WORDS[rng.below(WORDS.len() as u64) as usize].as_bytes();
        let sep: &[u8] = if rng.below(12) == 0 { b"\n" } else { b" " };
        for &b in w.iter().chain(sep) {
            if i < len {
                buf[i] = b;
                i += 1;
            }
        }
    }
    buf
}

fn write(path: &Path, data: &[u8]) -> Result<(), BenchError> {
    fs::write(path, data).map_err(io("write", path))
}

/// Builds ~`target` bytes under `root`: 30 % in files of 1–64 KiB (100 per
/// directory), 70 % in files of 8–48 MiB written in 1 MiB blocks alternating
/// text and random at random.
pub(super) fn build(root: &Path, target: u64, rng: &mut Rng) -> Result<Tree, BenchError> {
    let mut t = Tree { bytes: 0, files: Vec::new() };
    let small_budget = target * 3 / 10;
    let mut dir = PathBuf::new();
    while t.bytes < small_budget {
        let n = t.files.len();
        if n.checked_rem(100) == Some(0) {
            dir = root.join(format!("small/d{:04}", n / 100));
            fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        }
        let len = 1024 + rng.below(63 * 1024) as usize;
        let p = dir.join(format!("f{n:06}.txt"));
        let text = rng.below(2) == 0;
        write(&p, &content(rng, len, text))?;
        t.bytes += len as u64;
        t.files.push((p, len as u64, false));
    }
    let large = root.join("large");
    fs::create_dir_all(&large).map_err(io("create", &large))?;
    while t.bytes < target {
        let len = ((8 + rng.below(41)) << 20).min(target - t.bytes + (1 << 20));
        let p = large.join(format!("blob{:03}.bin", t.files.len()));
        let mut f = fs::File::create(&p).map_err(io("create", &p))?;
        let mut left = len;
        while left > 0 {
            let n = left.min(1 << 20);
            let text = rng.below(2) == 0;
            f.write_all(&content(rng, n as usize, text)).map_err(io("write", &p))?;
            left -= n;
        }
        t.bytes += len;
        t.files.push((p, len, true));
    }
    Ok(t)
}

/// Changes about `budget` bytes: four in-place overwrites in large files (80 %)
/// and rewrites of small files (20 %). Returns the bytes changed.
pub(super) fn change(t: &Tree, budget: u64, rng: &mut Rng) -> Result<u64, BenchError> {
    let large: Vec<_> = t.files.iter().filter(|f| f.2).collect();
    let small: Vec<_> = t.files.iter().filter(|f| !f.2).collect();
    let mut changed = 0;
    if !large.is_empty() {
        let region = budget * 8 / 10 / 4;
        for _ in 0..4 {
            let (p, size, _) = large[rng.below(large.len() as u64) as usize];
            let region = region.min(*size);
            let at = rng.below(size - region + 1);
            let mut f = fs::OpenOptions::new().write(true).open(p).map_err(io("open", p))?;
            f.seek(SeekFrom::Start(at)).map_err(io("seek", p))?;
            f.write_all(&content(rng, region as usize, false)).map_err(io("write", p))?;
            changed += region;
        }
    }
    while changed < budget && !small.is_empty() {
        let (p, size, _) = small[rng.below(small.len() as u64) as usize];
        write(p, &content(rng, *size as usize, true))?;
        changed += size;
    }
    Ok(changed)
}
