//! Unpacks one layer tar (plain, gzip or zstd) into a directory that becomes an
//! overlay lower dir, safely:
//! - a `..` component anywhere refuses the layer; a leading `/` is dropped (it
//!   names the layer root, as tar does);
//! - nothing is ever written through a symlink: every parent of an entry (and of
//!   a hard link's target) is checked with `lstat` to be a real directory, and
//!   final components are created fresh (`O_CREAT|O_EXCL`, which never follows, `symlink`, `linkat` without
//!   follow). Symlinks themselves may point anywhere: they are resolved inside
//!   the sandbox's root at run time, never by the host;
//! - device nodes are skipped, with a warning, and counted
//!   ([`Unpacked::skipped_devices`]): the host never makes one, and the
//!   sandbox gets its own `/dev` (a `debootstrap` or `docker export` rootfs
//!   has `/dev` nodes; rootless unpackers skip them the same way);
//! - OCI whiteouts become overlayfs ones: `.wh.NAME` a 0/0 character device,
//!   `.wh..wh..opq` the `user.overlay.opaque` xattr (ember mounts overlay with
//!   `userxattr` inside the sandbox's user namespace);
//! - ownership is shifted by `uid_base`, the host id sandbox id 0 maps to, so
//!   overlay can copy files up inside the user namespace (ids ≥ 65536 become
//!   nobody, 65534).
//!
//! The caller unpacks into a fresh temp dir and renames it into place, so a
//! refused or interrupted layer is never visible.
use crate::bounds::CappedReader;
use crate::digest::HashingReader;
use crate::ImageError;
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{lchown, symlink, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// ids inside a sandbox: 0..65536.
const ID_RANGE: u64 = 65536;
const NOBODY: u64 = 65534;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unpacked {
    /// sha256 of the uncompressed tar (the OCI "diff id").
    pub diff_id: String,
    /// Sum of the regular files' sizes.
    pub bytes: u64,
    /// Size of the decompressed tar (what counts against the cap).
    pub tar_bytes: u64,
    /// Character and block devices left out.
    pub skipped_devices: u64,
}

/// Unpacks `src` into `dest` (created here; must not exist).
pub fn unpack_layer(digest: &str, src: impl Read, dest: &Path, uid_base: u32) -> Result<Unpacked, ImageError> {
    unpack_layer_capped(digest, src, dest, uid_base, u64::MAX)
}

/// [`unpack_layer`], refusing the layer ([`ImageError::TooLarge`]) once its
/// decompressed tar passes `max_bytes`. What was written stays in `dest`, for
/// the caller to remove with the rest of its temp dir.
pub fn unpack_layer_capped(
    digest: &str,
    src: impl Read,
    dest: &Path,
    uid_base: u32,
    max_bytes: u64,
) -> Result<Unpacked, ImageError> {
    let mut buf = BufReader::with_capacity(1 << 16, src);
    let magic = buf.fill_buf().map_err(|e| bad(digest, format!("read: {e}")))?.to_vec();
    let stream: Box<dyn Read> = if magic.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(buf))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(ruzstd::decoding::StreamingDecoder::new(buf).map_err(|e| bad(digest, format!("zstd: {e}")))?)
    } else {
        Box::new(buf)
    };
    fs::create_dir(dest).map_err(ImageError::io("create layer dir", dest))?;
    chown(dest, 0, 0, uid_base)?;
    let mut u = Unpacker { digest, dest, uid_base, dirs: Vec::new(), bytes: 0, skipped_devices: 0 };
    let mut archive = tar::Archive::new(HashingReader::new(CappedReader::new(stream, max_bytes)));
    let res = u.entries(&mut archive);
    let mut rest = archive.into_inner();
    let res = res
        .and_then(|()| std::io::copy(&mut rest, &mut std::io::sink()).map_err(|e| bad(digest, format!("read: {e}"))));
    // The tar reader turns the cap's io error into its own; say which cap it was.
    if rest.get_ref().exceeded {
        let why = "ember serve --max-image-bytes";
        return Err(ImageError::TooLarge { what: "decompressed layer", subject: digest.into(), limit: max_bytes, why });
    }
    res?;
    // Modes last, deepest first: a read-only dir must not stop its own entries.
    for (dir, mode) in u.dirs.iter().rev() {
        if fs::symlink_metadata(dir).map(|m| m.is_dir()).unwrap_or(false) {
            fs::set_permissions(dir, fs::Permissions::from_mode(*mode)).map_err(ImageError::io("chmod", dir))?;
        }
    }
    let tar_bytes = rest.get_ref().read;
    Ok(Unpacked { diff_id: rest.finish(), bytes: u.bytes, tar_bytes, skipped_devices: u.skipped_devices })
}

fn bad(digest: &str, message: String) -> ImageError {
    ImageError::BadLayer { digest: digest.to_string(), message }
}

fn chown(p: &Path, uid: u64, gid: u64, base: u32) -> Result<(), ImageError> {
    let shift = |id: u64| base + if id < ID_RANGE { id } else { NOBODY } as u32;
    lchown(p, Some(shift(uid)), Some(shift(gid))).map_err(ImageError::io("chown", p))
}

/// `..` refused, `/` and `.` dropped; `None` for the layer root itself.
pub(crate) fn clean(digest: &str, raw: &Path) -> Result<Option<PathBuf>, ImageError> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(unsafe_entry(digest, raw, "path has a '..' component".into()));
            }
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

fn unsafe_entry(digest: &str, entry: &Path, message: String) -> ImageError {
    ImageError::UnsafeEntry { digest: digest.to_string(), entry: entry.display().to_string(), message }
}

struct Unpacker<'a> {
    digest: &'a str,
    dest: &'a Path,
    uid_base: u32,
    dirs: Vec<(PathBuf, u32)>,
    bytes: u64,
    skipped_devices: u64,
}

impl Unpacker<'_> {
    fn entries<R: Read>(&mut self, archive: &mut tar::Archive<R>) -> Result<(), ImageError> {
        for entry in archive.entries().map_err(|e| bad(self.digest, format!("tar: {e}")))? {
            let entry = entry.map_err(|e| bad(self.digest, format!("tar: {e}")))?;
            self.entry(entry)?;
        }
        Ok(())
    }

    fn entry<R: Read>(&mut self, mut e: tar::Entry<R>) -> Result<(), ImageError> {
        let raw = e.path().map_err(|err| bad(self.digest, format!("entry path: {err}")))?.into_owned();
        let Some(rel) = clean(self.digest, &raw)? else { return Ok(()) };
        let h = e.header();
        // No setuid/setgid (the sticky bit stays): layer files are owned by
        // the sandboxes' id range on the host, and a set-id file there would
        // let any host user run it as that uid, the sandboxes' root.
        let (mode, uid, gid) = (h.mode().unwrap_or(0o644) & 0o1777, h.uid().unwrap_or(0), h.gid().unwrap_or(0));
        let kind = h.entry_type();
        let parent = self.parents(&raw, rel.parent().unwrap_or(Path::new("")))?;
        let name = rel.file_name().unwrap_or_default().to_string_lossy().into_owned();
        if name == ".wh..wh..opq" {
            ember_sys::fs::lsetxattr(&parent, "user.overlay.opaque", b"y")?;
            return Ok(());
        }
        if let Some(hidden) = name.strip_prefix(".wh.") {
            let p = parent.join(hidden);
            self.replace(&p)?;
            ember_sys::fs::mknod_whiteout(&p)?;
            return chown(&p, 0, 0, self.uid_base);
        }
        let path = parent.join(&name);
        use tar::EntryType as T;
        match kind {
            T::Directory => {
                match fs::symlink_metadata(&path) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        self.replace(&path)?;
                        fs::create_dir(&path).map_err(ImageError::io("mkdir", &path))?;
                    }
                    Err(_) => fs::create_dir(&path).map_err(ImageError::io("mkdir", &path))?,
                }
                chown(&path, uid, gid, self.uid_base)?;
                self.dirs.push((path, mode));
            }
            T::Regular | T::Continuous | T::GNUSparse => {
                self.replace(&path)?;
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .map_err(ImageError::io("create", &path))?;
                self.bytes +=
                    std::io::copy(&mut e, &mut f).map_err(|err| bad(self.digest, format!("{raw:?}: {err}")))?;
                chown(&path, uid, gid, self.uid_base)?;
                // After chown, which clears set-id bits.
                f.set_permissions(fs::Permissions::from_mode(mode)).map_err(ImageError::io("chmod", &path))?;
                if let Ok(t) = e.header().mtime() {
                    let _ = f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(t));
                }
            }
            T::Symlink => {
                let target =
                    e.link_name().ok().flatten().ok_or_else(|| bad(self.digest, format!("{raw:?}: no target")))?;
                self.replace(&path)?;
                symlink(&target, &path).map_err(ImageError::io("symlink", &path))?;
                chown(&path, uid, gid, self.uid_base)?;
            }
            T::Link => {
                let target =
                    e.link_name().ok().flatten().ok_or_else(|| bad(self.digest, format!("{raw:?}: no target")))?;
                let trel = clean(self.digest, &target)?
                    .ok_or_else(|| unsafe_entry(self.digest, &raw, "hard link to the layer root".into()))?;
                let tparent = self.parents(&raw, trel.parent().unwrap_or(Path::new("")))?;
                let src = tparent.join(trel.file_name().unwrap_or_default());
                match fs::symlink_metadata(&src) {
                    Ok(m) if !m.is_dir() => {}
                    _ => {
                        return Err(unsafe_entry(
                            self.digest,
                            &raw,
                            format!("hard link target {target:?} is not a file in this layer"),
                        ))
                    }
                }
                self.replace(&path)?;
                fs::hard_link(&src, &path).map_err(ImageError::io("hard link", &path))?;
            }
            T::Char | T::Block => {
                tracing::warn!(digest = self.digest, entry = %raw.display(), "skipping a device node in a layer");
                self.skipped_devices += 1;
            }
            T::Fifo => tracing::warn!(digest = self.digest, entry = %raw.display(), "skipping a fifo in a layer"),
            other => tracing::debug!(digest = self.digest, entry = %raw.display(), ?other, "skipping tar entry"),
        }
        Ok(())
    }

    /// The host path of `rel` (a parent dir), created as needed, with every
    /// component checked to be a real directory, never a symlink.
    fn parents(&mut self, entry: &Path, rel: &Path) -> Result<PathBuf, ImageError> {
        let mut cur = self.dest.to_path_buf();
        for c in rel.components() {
            cur.push(c);
            match fs::symlink_metadata(&cur) {
                Ok(m) if m.is_dir() => {}
                Ok(m) if m.file_type().is_symlink() => {
                    let msg = format!("goes through the symlink {:?}", cur.strip_prefix(self.dest).unwrap_or(&cur));
                    return Err(unsafe_entry(self.digest, entry, msg));
                }
                Ok(_) => {
                    let msg = format!("{:?} is not a directory", cur.strip_prefix(self.dest).unwrap_or(&cur));
                    return Err(unsafe_entry(self.digest, entry, msg));
                }
                Err(_) => {
                    fs::create_dir(&cur).map_err(ImageError::io("mkdir", &cur))?;
                    chown(&cur, 0, 0, self.uid_base)?;
                }
            }
        }
        Ok(cur)
    }

    /// Removes whatever is at `p` (a later entry replaces an earlier one).
    fn replace(&self, p: &Path) -> Result<(), ImageError> {
        match fs::symlink_metadata(p) {
            Ok(m) if m.is_dir() => fs::remove_dir_all(p).map_err(ImageError::io("replace", p)),
            Ok(_) => fs::remove_file(p).map_err(ImageError::io("replace", p)),
            Err(_) => Ok(()),
        }
    }
}
