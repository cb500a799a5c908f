//! Reading a file's extent in windows and cutting it into chunks that share
//! them: the calling thread's half of [`crate::upload`].
//!
//! An extent is read in windows of four of the largest chunk (16 MiB by
//! default; a small file in one read of its size) and cut in memory; a chunk
//! is cut only when the window holds the largest chunk's worth of bytes from
//! its start (or the extent's end), so the cut points are the streaming
//! chunker's. What is left of a window starts the next one. Why not
//! fastcdc's `StreamCDC`: it zeroes a buffer of the largest chunk (4 MiB) for
//! every extent and moves the rest of its buffer after every chunk; for a
//! tree of small files that cost more than reading them.
use std::io::Read;
use std::sync::Arc;

use crate::cdc::Cdc;
use crate::manifest::Chunking;
use crate::SnapshotError;

/// A chunk's bytes: a range of the read window it was cut from, shared with
/// the window's other chunks (cutting copies nothing). A window lives until
/// its last chunk is handled, so at most the channel's batches' windows and
/// the one being read are held at once.
pub(crate) struct Chunk {
    window: Arc<Vec<u8>>,
    at: usize,
    len: usize,
}

/// Read windows taken back once no chunk holds them, so a window's pages are
/// faulted in once per upload rather than once per window (the page faults
/// of fresh 16 MiB windows were 5 % of a full snapshot's CPU).
#[derive(Default)]
pub(crate) struct Windows {
    lent: Vec<Arc<Vec<u8>>>,
}

/// Windows [`Windows`] tracks; one beyond them is freed when its chunks are.
const WINDOWS_KEPT: usize = 4;

impl Windows {
    /// An empty buffer of at least `capacity`: a window no chunk holds any
    /// more if there is one. Every window is asked for at the full window
    /// size, so any of them serves any file (only the pages read into are
    /// ever touched).
    fn take(&mut self, capacity: usize) -> Vec<u8> {
        // Only this thread clones the windows: one it alone holds stays so.
        if let Some(i) = self.lent.iter().position(|w| Arc::strong_count(w) == 1) {
            if let Ok(mut buf) = Arc::try_unwrap(self.lent.swap_remove(i)) {
                buf.clear();
                buf.reserve(capacity);
                return buf;
            }
        }
        Vec::with_capacity(capacity)
    }

    /// `buf`, shared with the chunks to be cut from it.
    fn share(&mut self, buf: Vec<u8>) -> Arc<Vec<u8>> {
        let window = Arc::new(buf);
        if self.lent.len() < WINDOWS_KEPT {
            self.lent.push(Arc::clone(&window));
        }
        window
    }
}

impl Chunk {
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.window[self.at..self.at + self.len]
    }
}

/// Why [`cut`] stopped.
pub(crate) enum Cut {
    Read(std::io::Error),
    Send(SnapshotError),
}

/// Cuts `len` bytes of `r` into chunks, in order, handing each to `send`
/// (see the module's doc).
pub(crate) fn cut(
    r: impl Read,
    len: u64,
    c: Chunking,
    windows: &mut Windows,
    send: &mut dyn FnMut(Chunk) -> Result<(), SnapshotError>,
) -> Result<(), Cut> {
    let (min, avg, max) = (c.min as usize, c.avg as usize, c.max as usize);
    let cdc = Cdc::new(min, avg, max);
    let window = 4 * max;
    let mut r = r.take(len);
    // A small file is one chunk, handed over as read in a buffer of its own.
    let pooled = len as usize > min;
    let mut buf = match pooled {
        true => windows.take(window),
        false => Vec::with_capacity(len as usize),
    };
    let mut eof = false;
    loop {
        while buf.len() < window && !eof {
            let want = (window - buf.len()) as u64;
            eof = (&mut r).take(want).read_to_end(&mut buf).map_err(Cut::Read)? == 0;
        }
        if eof && buf.len() <= min {
            // The rest is one chunk (a small file: all of it), sent as read.
            if !buf.is_empty() {
                let (len, buf) = (buf.len(), std::mem::take(&mut buf));
                let window = if pooled { windows.share(buf) } else { Arc::new(buf) };
                send(Chunk { window, at: 0, len }).map_err(Cut::Send)?;
            }
            return Ok(());
        }
        let full = windows.share(std::mem::take(&mut buf));
        let mut used = 0;
        while used < full.len() {
            if !eof && used + max > full.len() {
                break; // the next cut may depend on bytes not read yet
            }
            let len = cdc.cut(&full[used..]);
            send(Chunk { window: Arc::clone(&full), at: used, len }).map_err(Cut::Send)?;
            used += len;
        }
        // What was not cut yet starts the next window.
        let rest = &full[used..];
        if eof && rest.is_empty() {
            return Ok(());
        }
        buf = windows.take(window);
        buf.extend_from_slice(rest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::ChunkHash;
    use fastcdc::v2020::StreamCDC;

    fn data(len: usize) -> Vec<u8> {
        crate::cdc::tests::runs_and_noise(len, 0x2545_f491_4f6c_dd1d, 5000, 3)
    }

    /// A tree snapshotted by a build that streamed every extent (fastcdc's
    /// `StreamCDC`) must dedup against this one: the same cut points, over
    /// many windows and at any length.
    #[test]
    fn cutting_in_windows_cuts_where_streaming_does() {
        let small = Chunking { min: 256, avg: 1024, max: 4096, zstd_level: 3, hash: ChunkHash::Blake3 };
        for (c, len) in [(small, 300_000), (small, 4 * 4096), (small, 200), (small, 0), (Chunking::default(), 41 << 20)]
        {
            let data = data(len);
            let (min, avg, max) = (c.min as usize, c.avg as usize, c.max as usize);
            let streamed: Vec<Vec<u8>> = StreamCDC::new(&data[..], min, avg, max).map(|ch| ch.unwrap().data).collect();
            let mut got = Vec::new();
            let done = cut(&data[..], len as u64, c, &mut Windows::default(), &mut |d| {
                got.push(d.bytes().to_vec());
                Ok(())
            });
            assert!(done.is_ok(), "length {len}");
            assert_eq!(got.len(), streamed.len(), "length {len}");
            assert!(got == streamed, "length {len}: different cuts");
            assert!(len < 100_000 || got.len() > 8, "length {len}: {} chunks", got.len());
        }
    }

    /// A window is read into again only once no chunk holds it: chunks kept
    /// while the next files are cut keep their bytes, and windows whose
    /// chunks are gone are taken back (the workers' case).
    #[test]
    fn a_window_is_reused_only_when_its_chunks_are_gone() {
        let c = Chunking::default();
        let windows = &mut Windows::default();
        let files: Vec<Vec<u8>> = (0..3).map(|i| data((40 << 20) + i * 777)).collect();
        let mut held = Vec::new();
        for f in &files {
            let keep = &mut |d| {
                held.push(d);
                Ok(())
            };
            cut(&f[..], f.len() as u64, c, windows, keep).map_err(|_| "cut").unwrap();
            assert!(windows.lent.len() <= WINDOWS_KEPT);
        }
        let mut at = 0;
        for f in &files {
            let mut whole = Vec::new();
            while whole.len() < f.len() {
                whole.extend_from_slice(held[at].bytes());
                at += 1;
            }
            assert!(whole == *f, "a held chunk was overwritten");
        }
        drop(held);
        let lent: Vec<*const Vec<u8>> = windows.lent.iter().map(Arc::as_ptr).collect();
        assert_eq!(lent.len(), WINDOWS_KEPT);
        let mut reused = 0;
        cut(&files[0][..], files[0].len() as u64, c, windows, &mut |d| {
            reused += usize::from(lent.contains(&Arc::as_ptr(&d.window)));
            Ok(())
        })
        .map_err(|_| "cut")
        .unwrap();
        assert!(reused > 0, "no window was taken back");
    }
}
