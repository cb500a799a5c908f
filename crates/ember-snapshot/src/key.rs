//! [`ManifestKey`]: the secret that authenticates manifests.
//!
//! A manifest's sha256 catches corruption, not tampering: whoever can write
//! the store (a shared bucket, a local store's directory) can recompute it
//! after adding a `tmp -> /` symlink or pointing a file at another chunk. So
//! every manifest also carries an HMAC-SHA256 over its canonical bytes, keyed
//! by a secret that lives outside the store (per node, or shared by a cluster),
//! and a manifest whose MAC does not verify is refused
//! ([`SnapshotError::Tampered`]) before anything is restored from it.
//!
//! The key file holds 32 random bytes as 64 hex digits. It is created once,
//! `O_EXCL`, mode 0600, fsynced (file and directory); it is read without
//! following a symlink, and refused when group or others can read it.
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ring::hmac;

use crate::SnapshotError;

/// Key bytes a file must hold at least (hex doubles it).
const KEY_BYTES: usize = 32;
/// Bound on what is read from a key file.
const MAX_FILE: u64 = 4096;
/// What the MAC covers before the manifest's bytes: binds it to this use.
const DOMAIN: &[u8] = b"ember-snapshot manifest v1\0";
/// The prefix of the envelope's `mac` field.
const SCHEME: &str = "hmac-sha256:";

/// The manifest MAC key, and whether manifests without a MAC are accepted.
#[derive(Clone)]
pub struct ManifestKey {
    key: hmac::Key,
    accept_unsigned: bool,
}

impl std::fmt::Debug for ManifestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key itself.
        f.debug_struct("ManifestKey").field("accept_unsigned", &self.accept_unsigned).finish_non_exhaustive()
    }
}

fn key_err(path: &Path, reason: impl Into<String>) -> SnapshotError {
    SnapshotError::Key { path: path.to_path_buf(), reason: reason.into() }
}

impl ManifestKey {
    /// A key from raw secret bytes (at least 32).
    pub fn from_bytes(secret: &[u8]) -> Result<ManifestKey, SnapshotError> {
        if secret.len() < KEY_BYTES {
            return Err(key_err(Path::new("-"), format!("a key needs at least {KEY_BYTES} bytes")));
        }
        Ok(ManifestKey { key: hmac::Key::new(hmac::HMAC_SHA256, secret), accept_unsigned: false })
    }

    /// A fresh random key held only in memory (benchmarks, tests, throwaway stores).
    pub fn ephemeral() -> ManifestKey {
        ManifestKey::from_bytes(&random_secret()).expect("32 bytes")
    }

    /// Also accept manifests that carry no MAC (written before manifests were
    /// authenticated). A migration aid: a MAC that is present must still verify.
    pub fn accept_unsigned(mut self, yes: bool) -> Self {
        self.accept_unsigned = yes;
        self
    }

    /// Reads the key file at `path`; it must exist.
    pub fn load(path: &Path) -> Result<ManifestKey, SnapshotError> {
        let mut f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(path)
            .map_err(|e| key_err(path, format!("cannot open (a symlink is refused): {e}")))?;
        let meta = f.metadata().map_err(|e| key_err(path, e.to_string()))?;
        if !meta.is_file() {
            return Err(key_err(path, "not a regular file"));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(key_err(path, format!("mode {:o}: group or others can access it; chmod 600", meta.mode())));
        }
        let mut text = String::new();
        (&mut f).take(MAX_FILE).read_to_string(&mut text).map_err(|e| key_err(path, e.to_string()))?;
        let secret = hex::decode(text.trim()).map_err(|e| key_err(path, format!("not hex: {e}")))?;
        if secret.len() < KEY_BYTES {
            return Err(key_err(path, format!("holds {} bytes; at least {KEY_BYTES} are needed", secret.len())));
        }
        ManifestKey::from_bytes(&secret)
    }

    /// Reads the key file at `path`, creating it with a random key first if
    /// it does not exist (a node's first start).
    pub fn load_or_create(path: &Path) -> Result<ManifestKey, SnapshotError> {
        match create(path) {
            Ok(()) => {}
            // Made earlier (or by a racing start): read what is there.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(key_err(path, format!("cannot create: {e}"))),
        }
        ManifestKey::load(path)
    }

    /// The envelope's `mac` value for the canonical manifest bytes.
    pub(crate) fn sign(&self, manifest: &[u8]) -> String {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(DOMAIN);
        ctx.update(manifest);
        format!("{SCHEME}{}", hex::encode(ctx.sign().as_ref()))
    }

    /// Checks the envelope's `mac` (constant time); the reason when it does not verify.
    pub(crate) fn verify(&self, manifest: &[u8], mac: Option<&str>) -> Result<(), &'static str> {
        let Some(mac) = mac else {
            return if self.accept_unsigned {
                Ok(())
            } else {
                Err("it carries no MAC (written before manifests were authenticated, or stripped)")
            };
        };
        let tag = mac.strip_prefix(SCHEME).and_then(|h| hex::decode(h).ok()).ok_or("its MAC is malformed")?;
        let mut msg = Vec::with_capacity(DOMAIN.len() + manifest.len());
        msg.extend_from_slice(DOMAIN);
        msg.extend_from_slice(manifest);
        hmac::verify(&self.key, &msg, &tag).map_err(|_| "its MAC does not verify with this node's snapshot key")
    }
}

fn random_secret() -> [u8; KEY_BYTES] {
    use ring::rand::SecureRandom;
    let mut secret = [0u8; KEY_BYTES];
    // The OS random source failing is not something to carry on from.
    ring::rand::SystemRandom::new().fill(&mut secret).expect("the OS random source failed");
    secret
}

/// Creates the key file `O_EXCL` with mode 0600 and fsyncs it and its directory.
fn create(path: &Path) -> std::io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    let written = f.write_all(format!("{}\n", hex::encode(random_secret())).as_bytes()).and_then(|()| f.sync_all());
    if let Err(e) = written {
        // A half-written key would be refused at every later start: remove it.
        let _ = fs::remove_file(path);
        return Err(e);
    }
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).map_or(PathBuf::from("."), Path::to_path_buf);
    fs::File::open(&dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn key_file_is_created_once_private_and_refused_when_readable() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("snapshot.key");
        let a = ManifestKey::load_or_create(&path).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        let b = ManifestKey::load_or_create(&path).unwrap();
        let mac = a.sign(b"m");
        assert_eq!(b.verify(b"m", Some(&mac)), Ok(()), "the second start reads the same key");
        assert!(ManifestKey::ephemeral().verify(b"m", Some(&mac)).is_err());
        assert!(a.verify(b"n", Some(&mac)).is_err());
        assert!(a.verify(b"m", None).is_err());
        assert!(a.clone().accept_unsigned(true).verify(b"m", None).is_ok());
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(ManifestKey::load(&path), Err(SnapshotError::Key { .. })));
        let link = tmp.path().join("link.key");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(ManifestKey::load(&link).is_err(), "a symlink is not followed");
        assert!(ManifestKey::load(&tmp.path().join("absent")).is_err());
    }
}
