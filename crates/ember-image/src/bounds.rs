//! Caps on what a pull or import may make the host read, write or hold: the
//! registry and the uploaded tar are untrusted, and a small gzip or zstd blob
//! can decompress to far more than the disk holds.
//!
//! Both wrappers fail the stream with an io error once the cap is passed and
//! remember that they did, so the caller reports [`ImageError::TooLarge`]
//! (code `IMAGE::TOO_LARGE`) rather than whatever the reader or writer above
//! them made of the io error.
use std::io::Read;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::AsyncWrite;

/// Default cap on the bytes an image's layers decompress to, summed
/// (`ember serve --max-image-bytes`).
pub const DEFAULT_MAX_UNPACKED_BYTES: u64 = 8 << 30;
/// Default cap on an image config blob, and on each JSON file of an imported
/// OCI layout (`ember serve --max-image-config-bytes`).
pub const DEFAULT_MAX_CONFIG_BYTES: u64 = 4 << 20;

fn over(limit: u64) -> std::io::Error {
    std::io::Error::other(format!("over the cap of {limit} bytes"))
}

/// A reader that yields at most `limit` bytes and fails past them.
pub(crate) struct CappedReader<R> {
    inner: R,
    limit: u64,
    pub read: u64,
    pub exceeded: bool,
}

impl<R: Read> CappedReader<R> {
    pub fn new(inner: R, limit: u64) -> Self {
        CappedReader { inner, limit, read: 0, exceeded: false }
    }
}

impl<R: Read> Read for CappedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // One byte past the cap is read to tell "exactly the cap" from "more".
        let room = (self.limit - self.read.min(self.limit)).saturating_add(1);
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.read += n as u64;
        if self.read > self.limit {
            self.exceeded = true;
            return Err(over(self.limit));
        }
        Ok(n)
    }
}

/// A writer that accepts at most `limit` bytes and fails past them.
pub(crate) struct CappedWriter<W> {
    inner: W,
    limit: u64,
    written: u64,
    pub exceeded: bool,
}

impl<W> CappedWriter<W> {
    pub fn new(inner: W, limit: u64) -> Self {
        CappedWriter { inner, limit, written: 0, exceeded: false }
    }

    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for CappedWriter<W> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.written.saturating_add(buf.len() as u64) > this.limit {
            this.exceeded = true;
            return Poll::Ready(Err(over(this.limit)));
        }
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            this.written += n as u64;
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_stops_one_byte_past_its_cap() {
        let mut r = CappedReader::new(&[7u8; 10][..], 10);
        assert_eq!(std::io::copy(&mut r, &mut std::io::sink()).unwrap(), 10);
        assert!(!r.exceeded);
        let mut r = CappedReader::new(&[7u8; 11][..], 10);
        assert!(std::io::copy(&mut r, &mut std::io::sink()).is_err());
        assert!(r.exceeded);
    }

    #[tokio::test]
    async fn a_writer_refuses_past_its_cap() {
        use tokio::io::AsyncWriteExt;
        let mut w = CappedWriter::new(Vec::new(), 4);
        w.write_all(b"abcd").await.unwrap();
        assert!(w.write_all(b"e").await.is_err());
        assert!(w.exceeded);
        assert_eq!(w.into_inner(), b"abcd");
    }
}
