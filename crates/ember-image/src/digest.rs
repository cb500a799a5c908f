//! sha256 digests in OCI form (`sha256:<hex>`), and a reader that hashes what
//! passes through it.
use sha2::{Digest, Sha256};
use std::io::Read;

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `sha256:<hex>` of `data`.
pub fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(data)))
}

/// Checks a digest string is `sha256:` + 64 lowercase hex digits, so it is safe
/// to use in a file name.
pub fn valid(d: &str) -> bool {
    d.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
}

/// The digest as a file name: `sha256-<hex>`.
pub fn file_name(d: &str) -> String {
    d.replace(':', "-")
}

pub struct HashingReader<R> {
    inner: R,
    hash: Sha256,
    pub count: u64,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        HashingReader { inner, hash: Sha256::new(), count: 0 }
    }

    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// `sha256:<hex>` of everything read so far.
    pub fn finish(self) -> String {
        format!("sha256:{}", hex(&self.hash.finalize()))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_digest() {
        assert_eq!(super::sha256(b""), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert!(super::valid(&super::sha256(b"x")));
        assert!(!super::valid("sha256:../../etc"));
    }
}
