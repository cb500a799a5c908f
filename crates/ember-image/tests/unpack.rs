//! The layer unpacker against hand-crafted tars: malicious ones are refused with
//! a clear error and nothing is written outside the layer dir; legitimate ones
//! (whiteouts, opaque dirs, hard links, symlinks, gzip, zstd) come out as
//! overlay expects. Runs as root (mknod, chown), as the whole suite does.
use ember_image::unpack::unpack_layer;
use ember_image::ImageError;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

const BASE: u32 = 1_000_000_000;

/// One raw tar entry; names and link names are written as bytes, unvalidated,
/// as an attacker would.
struct E<'a> {
    name: &'a str,
    kind: tar::EntryType,
    link: &'a str,
    data: &'a [u8],
    uid: u64,
    /// 0: 0755 for a dir, 0644 otherwise.
    mode: u32,
}

fn e<'a>(name: &'a str, kind: tar::EntryType) -> E<'a> {
    E { name, kind, link: "", data: b"", uid: 0, mode: 0 }
}

fn file<'a>(name: &'a str, data: &'a [u8]) -> E<'a> {
    E { data, ..e(name, tar::EntryType::Regular) }
}

fn link<'a>(name: &'a str, kind: tar::EntryType, target: &'a str) -> E<'a> {
    E { link: target, ..e(name, kind) }
}

fn tar_of(entries: &[E]) -> Vec<u8> {
    let mut out = Vec::new();
    for en in entries {
        let mut h = tar::Header::new_ustar();
        let b = h.as_mut_bytes();
        b[..en.name.len()].copy_from_slice(en.name.as_bytes());
        b[157..157 + en.link.len()].copy_from_slice(en.link.as_bytes());
        h.set_entry_type(en.kind);
        h.set_size(en.data.len() as u64);
        h.set_mode(match en.mode {
            0 if en.kind == tar::EntryType::Directory => 0o755,
            0 => 0o644,
            m => m,
        });
        h.set_uid(en.uid);
        h.set_gid(en.uid);
        h.set_mtime(1_700_000_000);
        if matches!(en.kind, tar::EntryType::Char | tar::EntryType::Block) {
            h.set_device_major(1).unwrap();
            h.set_device_minor(3).unwrap();
        }
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(en.data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

/// A scratch dir with `layer` (the unpack target, not yet created) and
/// `outside` (must stay empty).
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("ember-unpack-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("outside")).unwrap();
        Scratch(d)
    }
    fn layer(&self) -> PathBuf {
        self.0.join("sub/layer")
    }
    fn unpack(&self, tar: &[u8]) -> Result<ember_image::unpack::Unpacked, ImageError> {
        std::fs::create_dir_all(self.0.join("sub")).unwrap();
        unpack_layer("sha256:test", tar, &self.layer(), BASE)
    }
    fn outside_is_empty(&self) -> bool {
        std::fs::read_dir(self.0.join("outside")).unwrap().next().is_none()
            && std::fs::read_dir(self.0.join("sub")).unwrap().count() == 1
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn refused(r: Result<ember_image::unpack::Unpacked, ImageError>, needle: &str) -> String {
    let msg = match r {
        Err(e @ ImageError::UnsafeEntry { .. }) => e.to_string(),
        other => panic!("expected an unsafe-entry error, got {other:?}"),
    };
    assert!(msg.contains(needle), "{msg:?} does not mention {needle:?}");
    msg
}

#[test]
fn dot_dot_paths_are_refused() {
    let s = Scratch::new("dotdot");
    let msg = refused(s.unpack(&tar_of(&[file("ok", b"1"), file("../../outside/pwned", b"x")])), "..");
    assert!(msg.contains("../../outside/pwned"), "the error names the entry: {msg}");
    assert!(s.outside_is_empty());
    let s = Scratch::new("dotdot2");
    refused(s.unpack(&tar_of(&[file("a/../../../outside/p", b"x")])), "..");
    assert!(s.outside_is_empty());
}

#[test]
fn writes_through_symlinks_are_refused() {
    // Absolute symlink escape: evil -> <scratch>/outside, then evil/pwned.
    let s = Scratch::new("abs");
    let target = s.0.join("outside").display().to_string();
    let tar = tar_of(&[link("evil", tar::EntryType::Symlink, &target), file("evil/pwned", b"x")]);
    refused(s.unpack(&tar), "symlink");
    assert!(s.outside_is_empty());
    // Relative escape through nested dirs.
    let s = Scratch::new("rel");
    let tar = tar_of(&[
        e("d/", tar::EntryType::Directory),
        link("d/up", tar::EntryType::Symlink, "../../../outside"),
        file("d/up/pwned", b"x"),
    ]);
    refused(s.unpack(&tar), "symlink");
    assert!(s.outside_is_empty());
    // A dir replaced by a symlink later in the same layer cannot redirect the
    // final chmod pass either.
    let s = Scratch::new("swap");
    let target = s.0.join("outside").display().to_string();
    std::fs::set_permissions(s.0.join("outside"), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let before = std::fs::metadata(s.0.join("outside")).unwrap().mode();
    let tar = tar_of(&[e("d/", tar::EntryType::Directory), link("d", tar::EntryType::Symlink, &target)]);
    s.unpack(&tar).expect("a symlink replacing a dir is legal");
    assert_eq!(std::fs::metadata(s.0.join("outside")).unwrap().mode(), before);
    assert!(s.outside_is_empty());
}

#[test]
fn hard_links_out_of_the_layer_are_refused() {
    let s = Scratch::new("hard");
    refused(s.unpack(&tar_of(&[link("h", tar::EntryType::Link, "../../outside/x")])), "..");
    let s = Scratch::new("hard2");
    let target = s.0.join("outside").display().to_string();
    let tar = tar_of(&[link("l", tar::EntryType::Symlink, &target), link("h", tar::EntryType::Link, "l/../x")]);
    refused(s.unpack(&tar), "..");
    let s = Scratch::new("hard3");
    std::fs::write(s.0.join("outside/secret"), "s").unwrap();
    let tar = tar_of(&[
        link("l", tar::EntryType::Symlink, &s.0.join("outside").display().to_string()),
        link("h", tar::EntryType::Link, "l/secret"),
    ]);
    refused(s.unpack(&tar), "symlink");
    assert_eq!(std::fs::metadata(s.0.join("outside/secret")).unwrap().nlink(), 1);
}

/// A rootfs from `debootstrap` or `docker export` has `/dev` nodes: they
/// are skipped and counted, never made on the host; the rest is unpacked.
#[test]
fn device_nodes_are_skipped_and_counted() {
    let s = Scratch::new("dev");
    let tar = tar_of(&[
        e("dev/", tar::EntryType::Directory),
        e("dev/null2", tar::EntryType::Char),
        e("dev/sda9", tar::EntryType::Block),
        file("etc/kept", b"kept"),
    ]);
    let u = s.unpack(&tar).expect("a layer with device nodes unpacks");
    assert_eq!(u.skipped_devices, 2);
    let l = s.layer();
    assert!(l.join("dev").is_dir());
    assert!(std::fs::symlink_metadata(l.join("dev/null2")).is_err(), "no device node on the host");
    assert!(std::fs::symlink_metadata(l.join("dev/sda9")).is_err());
    assert_eq!(std::fs::read_to_string(l.join("etc/kept")).unwrap(), "kept");
    assert!(s.outside_is_empty());
}

#[test]
fn whiteouts_links_ownership_and_compression() {
    let tar = tar_of(&[
        e("etc/", tar::EntryType::Directory),
        E { uid: 1000, ..file("etc/motd", b"hello") },
        link("etc/motd.hard", tar::EntryType::Link, "etc/motd"),
        link("etc/mtab", tar::EntryType::Symlink, "/proc/mounts"),
        file("etc/.wh.shadow", b""),
        e("opt/", tar::EntryType::Directory),
        file("opt/.wh..wh..opq", b""),
        E { uid: 70000, ..file("opt/big-id", b"") },
    ]);
    let gz = {
        use std::io::Write;
        let mut w = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        w.write_all(&tar).unwrap();
        w.finish().unwrap()
    };
    let zst = ruzstd::encoding::compress_to_vec(&tar[..], ruzstd::encoding::CompressionLevel::Fastest);
    let plain_id = ember_image::digest::sha256(&tar);
    for (tag, data) in [("plain", tar.clone()), ("gzip", gz), ("zstd", zst)] {
        let s = Scratch::new(tag);
        let u = s.unpack(&data).unwrap_or_else(|e| panic!("{tag}: {e}"));
        assert_eq!(u.diff_id, plain_id, "{tag}: the diff id is the digest of the uncompressed tar");
        let l = s.layer();
        assert_eq!(std::fs::read_to_string(l.join("etc/motd")).unwrap(), "hello");
        let m = std::fs::metadata(l.join("etc/motd")).unwrap();
        assert_eq!((m.uid(), m.gid(), m.nlink()), (BASE + 1000, BASE + 1000, 2));
        assert_eq!(std::fs::read_link(l.join("etc/mtab")).unwrap(), Path::new("/proc/mounts"));
        let wh = std::fs::symlink_metadata(l.join("etc/shadow")).unwrap();
        assert!(wh.file_type().is_char_device() && wh.rdev() == 0, "{tag}: .wh.shadow is an overlay whiteout");
        assert!(!l.join("etc/.wh.shadow").exists());
        assert_eq!(
            ember_sys::fs::lgetxattr(&l.join("opt"), "user.overlay.opaque").unwrap().as_deref(),
            Some(&b"y"[..])
        );
        assert_eq!(
            std::fs::metadata(l.join("opt/big-id")).unwrap().uid(),
            BASE + 65534,
            "ids past the range become nobody"
        );
        assert_eq!(std::fs::metadata(&l).unwrap().uid(), BASE);
    }
}

/// Layer files are owned by the sandboxes' id range on the host: a setuid or
/// setgid file there would let any host user run it as that uid (the
/// sandboxes' root on the host). The sticky bit stays.
#[test]
fn layer_files_drop_setuid_and_setgid_bits() {
    let s = Scratch::new("setid");
    let dir = |name, mode| E { mode, ..e(name, tar::EntryType::Directory) };
    let tar = tar_of(&[
        dir("bin/", 0o755),
        E { mode: 0o4755, ..file("bin/su", b"#!/bin/sh\n") },
        E { mode: 0o2755, ..file("bin/wall", b"#!/bin/sh\n") },
        dir("shared/", 0o2775),
        dir("tmp/", 0o1777),
    ]);
    s.unpack(&tar).expect("unpack");
    let mode = |p: &str| std::fs::metadata(s.layer().join(p)).unwrap().mode() & 0o7777;
    assert_eq!([mode("bin/su"), mode("bin/wall"), mode("shared"), mode("tmp")], [0o755, 0o755, 0o775, 0o1777]);
}
