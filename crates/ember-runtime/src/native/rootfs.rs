//! The sandbox's filesystem: the built-in `host` template's base layer and the
//! mount plan the child runs before `pivot_root`.
//!
//! Layout of one sandbox:
//! - `<dir>/mnt`        tmpfs, sized by `disk_bytes`: the writable layer. Mounted
//!   by the daemon on the host before the clone ([`prepare_layer`]), so the host
//!   can still read the upper dir after the sandbox pivots (sandbox snapshots)
//!   and can pre-fill it (restores); unmounted on every removal and leftover reap.
//! - `<dir>/mnt/upper`, `<dir>/mnt/work`  overlay upper and work dirs
//! - inside the sandbox's own mount namespace only (never in the host's table):
//!   `<dir>/mnt/root`, the overlay of the template's lower dirs + upper, the new
//!   root; read-only, nosuid, nodev binds of the host's `/usr` (the `host`
//!   template only); fresh `/proc`, a minimal `/dev`, then `pivot_root` into it.
//!
//! An OCI image template supplies its unpacked layers as further lower dirs; the
//! rest of the plan is the same.
use crate::RuntimeError;
use ember_sys::spawn::FsOp;
use std::ffi::CString;
use std::os::fd::RawFd;
use std::os::unix::fs::{chown, symlink, PermissionsExt};
use std::path::{Path, PathBuf};

/// ids inside the sandbox map to `base..base+65536` on the host.
pub const ID_RANGE: u32 = 65536;

fn prep(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let path = path.to_path_buf();
    move |source| RuntimeError::Prepare { what, path, source }
}

pub(crate) fn cstr(p: impl AsRef<Path>) -> CString {
    CString::new(p.as_ref().as_os_str().as_encoded_bytes()).expect("paths built by ember have no NUL")
}

const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
sandbox:x:1000:1000:sandbox:/home/sandbox:/bin/bash\n\
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
const GROUP: &str = "root:x:0:\ntty:x:5:\nsandbox:x:1000:\nnogroup:x:65534:\n";

/// Ensures the `host` template's base layer exists under `templates_dir` and
/// returns its path: a generated minimal `/etc` and the skeleton of a root
/// filesystem whose `/usr` comes from the host at mount time. Nothing of the
/// host's own `/etc`, `/root` or `/home` is copied except the public CA bundle,
/// os-release and the links of `/etc/alternatives` that point into `/usr`. Owned by the sandbox id range so overlay can copy files up
/// inside the user namespace.
///
/// A layer is never changed in place: running sandboxes have it as an overlay
/// lower dir, and overlayfs must not see its lower layers change. The content
/// is hashed into the directory name; a new content gets a new directory.
pub fn ensure_host_template(templates_dir: &Path, uid_base: u32) -> Result<PathBuf, RuntimeError> {
    let files = host_template_files();
    let mut links: Vec<(String, PathBuf)> = ["bin", "sbin", "lib", "lib64", "lib32", "libx32"]
        .iter()
        .filter_map(|l| Some((l.to_string(), std::fs::read_link(Path::new("/").join(l)).ok()?)))
        .collect();
    links.extend(host_alternatives(Path::new("/etc/alternatives")));
    let mut h = Fnv::default();
    h.feed(&uid_base.to_le_bytes());
    for (name, data) in &files {
        h.feed(name.as_bytes());
        h.feed(data);
    }
    for (l, t) in &links {
        h.feed(l.as_bytes());
        h.feed(t.as_os_str().as_encoded_bytes());
    }
    let dir = templates_dir.join(format!("host-{:016x}", h.0)).join("rootfs");
    if dir.exists() {
        return Ok(dir);
    }
    let tmp = templates_dir.join(format!("host-{:016x}.tmp", h.0));
    let _ = std::fs::remove_dir_all(&tmp);
    let root = tmp.join("rootfs");
    write_skeleton(&root, &files, &links)?;
    chown_tree(&root, uid_base)?;
    let home = root.join("home/sandbox");
    chown(&home, Some(uid_base + 1000), Some(uid_base + 1000)).map_err(prep("chown", &home))?;
    let final_dir = dir.parent().unwrap_or(&dir).to_path_buf();
    std::fs::rename(&tmp, &final_dir).map_err(prep("publish host template", &final_dir))?;
    Ok(dir)
}

#[derive(Default)]
struct Fnv(u64);

impl Fnv {
    fn feed(&mut self, b: &[u8]) {
        if self.0 == 0 {
            self.0 = 0xcbf29ce484222325;
        }
        for &x in b {
            self.0 = (self.0 ^ x as u64).wrapping_mul(0x100000001b3);
        }
        self.0 = (self.0 ^ 0xff).wrapping_mul(0x100000001b3);
    }
}

/// Debian's alternatives: `/usr/bin/awk` → `/etc/alternatives/awk` →
/// `/usr/bin/mawk`. The sandbox's `/etc` is generated, so without these links
/// `awk`, `vi`, `pager` and friends dangle. Only the links are copied, sorted
/// (they feed the layer's hash), and only those pointing into what the
/// sandbox has from the host (`/usr`, or the top-level links into it):
/// nothing else of the host's `/etc` is exposed.
fn host_alternatives(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let into_usr = |t: &Path| ["/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/"].iter().any(|p| t.starts_with(p));
    let mut out: Vec<(String, PathBuf)> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            (into_usr(&target) && !name.starts_with('.')).then(|| (format!("etc/alternatives/{name}"), target))
        })
        .collect();
    out.sort();
    out
}

fn host_template_files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("etc/passwd", PASSWD.into()),
        ("etc/group", GROUP.into()),
        ("etc/hosts", b"127.0.0.1\tlocalhost\n::1\tlocalhost\n".to_vec()),
        ("etc/resolv.conf", b"# no network: this sandbox has only loopback\n".to_vec()),
        ("etc/nsswitch.conf", b"passwd: files\ngroup: files\nhosts: files dns\n".to_vec()),
        ("etc/hostname", b"sandbox\n".to_vec()),
        ("etc/ssl/certs/ca-certificates.crt", std::fs::read("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default()),
        ("etc/os-release", std::fs::read("/etc/os-release").unwrap_or_default()),
    ]
}

fn write_skeleton(dir: &Path, files: &[(&str, Vec<u8>)], links: &[(String, PathBuf)]) -> Result<(), RuntimeError> {
    let dirs: &[(&str, u32)] = &[
        ("", 0o755),
        ("usr", 0o755),
        ("etc", 0o755),
        ("etc/alternatives", 0o755),
        ("etc/ssl", 0o755),
        ("etc/ssl/certs", 0o755),
        ("home", 0o755),
        ("home/sandbox", 0o755),
        ("root", 0o700),
        ("tmp", 0o1777),
        ("var", 0o755),
        ("var/tmp", 0o1777),
        ("run", 0o755),
        ("proc", 0o555),
        ("dev", 0o755),
        ("opt", 0o755),
        ("mnt", 0o755),
        ("workspace", 0o755),
    ];
    for (d, mode) in dirs {
        let p = dir.join(d);
        std::fs::create_dir_all(&p).map_err(prep("template dir", &p))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).map_err(prep("chmod", &p))?;
    }
    for (link, target) in links {
        symlink(target, dir.join(link)).map_err(prep("template symlink", &dir.join(link)))?;
    }
    for (f, data) in files {
        let p = dir.join(f);
        std::fs::write(&p, data).map_err(prep("template file", &p))?;
    }
    Ok(())
}

fn chown_tree(dir: &Path, base: u32) -> Result<(), RuntimeError> {
    std::os::unix::fs::lchown(dir, Some(base), Some(base)).map_err(prep("chown", dir))?;
    if dir.is_symlink() || !dir.is_dir() {
        return Ok(());
    }
    for e in std::fs::read_dir(dir).map_err(prep("readdir", dir))?.flatten() {
        chown_tree(&e.path(), base)?;
    }
    Ok(())
}

/// Inputs of one sandbox's mount plan.
pub struct RootfsPlan<'a> {
    pub sandbox_dir: &'a Path,
    pub lower_dirs: &'a [PathBuf],
    /// Idmapped detached trees of `lower_dirs`, in order (or none: the dirs
    /// are used as they are), attached at `mnt/l<i>` as the overlay's lowers.
    pub lower_trees: &'a [RawFd],
    /// Host directories bound read-only at the same path (`/usr` for `host`).
    pub host_binds: &'a [PathBuf],
    /// Host directories bound at their mount paths (read-only or not).
    pub volumes: &'a [ember_types::VolumeMount],
    /// Detached trees of the volumes' host paths, in order (or none): idmapped,
    /// or as they are when launched from a [`ember_sys::mountns::LaunchNs`].
    pub volume_trees: &'a [RawFd],
    /// A detached copy of the writable layer's tmpfs (`mnt`), attached there
    /// first: a sandbox cloned from a launch namespace, which does not have
    /// the host's later mounts, gets it so.
    pub layer_tree: Option<RawFd>,
    pub disk_bytes: u64,
    pub hostname: &'a str,
}

const MS_NOSUID: u64 = 0x2;
const MS_NODEV: u64 = 0x4;
const MS_NOEXEC: u64 = 0x8;

impl RootfsPlan<'_> {
    pub fn mnt(&self) -> PathBuf {
        self.sandbox_dir.join("mnt")
    }

    pub fn new_root(&self) -> PathBuf {
        self.mnt().join("root")
    }

    /// The operations the child runs, in order.
    pub fn ops(&self) -> Vec<FsOp> {
        let mnt = self.mnt();
        let root = self.new_root();
        let mut ops = Vec::new();
        if let Some(tree) = self.layer_tree {
            ops.push(FsOp::Attach { tree, target: cstr(&mnt) });
        }
        let lowers: Vec<PathBuf> = if self.lower_trees.is_empty() {
            self.lower_dirs.to_vec()
        } else {
            let attach = |(i, tree): (usize, &RawFd)| {
                let at = mnt.join(format!("l{i}"));
                ops.extend([mkdir(&at, 0o755), FsOp::Attach { tree: *tree, target: cstr(&at) }]);
                at
            };
            self.lower_trees.iter().enumerate().map(attach).collect()
        };
        let lower = lowers.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(":");
        // The tmpfs and upper/work/root exist already: [`prepare_layer`].
        ops.push(mount(
            "overlay",
            &root,
            "overlay",
            MS_NOSUID,
            &format!("lowerdir={lower},upperdir={}/upper,workdir={}/work,userxattr", mnt.display(), mnt.display()),
        ));
        // An image may lack these; the rest of the plan mounts or writes in them.
        for d in ["proc", "dev", "etc", "tmp"] {
            ops.push(mkdir(root.join(d), if d == "tmp" { 0o1777 } else { 0o755 }));
        }
        for b in self.host_binds {
            let target = root.join(b.strip_prefix("/").unwrap_or(b));
            ops.push(FsOp::BindReadOnly { source: cstr(b), target: cstr(target) });
        }
        for (i, v) in self.volumes.iter().enumerate() {
            // mkdir -p of the mount point inside the new root (EEXIST is fine).
            let mut target = root.clone();
            for part in Path::new(&v.mount_path).components().skip(1) {
                target.push(part);
                ops.push(mkdir(&target, 0o755));
            }
            let (source, target) = (cstr(&v.host_path), cstr(&target));
            if let Some(tree) = self.volume_trees.get(i) {
                ops.push(FsOp::Attach { tree: *tree, target });
                continue;
            }
            ops.push(if v.read_only { FsOp::BindReadOnly { source, target } } else { FsOp::Bind { source, target } });
        }
        ops.push(mount("proc", root.join("proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, ""));
        ops.extend(mask_proc(&root));
        ops.extend(dev_ops(&root.join("dev")));
        ops.extend(secrets_ops(&root));
        let hn = self.hostname;
        ops.push(write(root.join("etc/hostname"), format!("{hn}\n").into_bytes(), 0o644));
        ops.push(write(
            root.join("etc/hosts"),
            format!("127.0.0.1\tlocalhost {hn}\n::1\tlocalhost {hn}\n").into_bytes(),
            0o644,
        ));
        ops
    }
}

/// The opaque-directory xattr of the native class's overlay: it is mounted
/// with `userxattr` (inside a user namespace), so overlayfs uses `user.overlay.*`.
pub const OPAQUE_XATTR: &str = "user.overlay.opaque";

/// Mounts the writable layer's tmpfs at `mnt` on the host (size = the disk
/// quota; root owned by `owner`, the host uid of the sandbox's root) and makes
/// `upper`, `work` and `root` in it. Returns the upper dir. Idempotent: a layer
/// already mounted (a restore pre-filled it) is kept as it is.
pub fn prepare_layer(mnt: &Path, disk_bytes: u64, owner: u32) -> Result<PathBuf, RuntimeError> {
    use std::os::unix::fs::MetadataExt;
    std::fs::create_dir_all(mnt).map_err(prep("layer dir", mnt))?;
    let parent = mnt.parent().unwrap_or(mnt);
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).map_err(prep("stat", p));
    if dev(mnt)? == dev(parent)? {
        let opts = format!("size={disk_bytes},mode=0755,uid={owner},gid={owner}");
        ember_sys::fs::mount_tmpfs(mnt, &opts)?;
    }
    for d in ["upper", "work", "root"] {
        let p = mnt.join(d);
        match std::fs::create_dir(&p) {
            Ok(()) => chown(&p, Some(owner), Some(owner)).map_err(prep("chown", &p))?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(prep("layer dir", &p)(e)),
        }
    }
    Ok(mnt.join("upper"))
}

/// Unmounts the writable layer's tmpfs (lazily: the sandbox's own mount
/// namespace may still hold it while its processes die). Nothing mounted is fine.
pub fn release_layer(mnt: &Path) -> Result<(), RuntimeError> {
    ember_sys::fs::unmount_detach(mnt)?;
    Ok(())
}

/// Hides host-wide kernel information in `/proc`, as Docker's defaults do.
fn mask_proc(root: &Path) -> Vec<FsOp> {
    let mut ops = Vec::new();
    for f in ["kcore", "keys", "timer_list", "sched_debug", "latency_stats"] {
        if Path::new("/proc").join(f).is_file() {
            ops.push(FsOp::Bind { source: cstr("/dev/null"), target: cstr(root.join("proc").join(f)) });
        }
    }
    for d in ["acpi", "scsi", "asound"] {
        if Path::new("/proc").join(d).is_dir() {
            ops.push(mount(
                "tmpfs",
                root.join("proc").join(d),
                "tmpfs",
                MS_NOSUID | MS_NODEV | MS_NOEXEC,
                "size=0,mode=0555",
            ));
        }
    }
    for ro in ["sys", "sysrq-trigger", "irq", "bus", "fs"] {
        let p = root.join("proc").join(ro);
        if Path::new("/proc").join(ro).exists() {
            ops.push(FsOp::BindReadOnly { source: cstr(&p), target: cstr(&p) });
        }
    }
    ops
}

/// `/run/secrets`: a small tmpfs in the sandbox's own mount namespace (so
/// outside the writable layer, its snapshots and the host's view of the data
/// dir), written by the agent when the create or claim brings secrets.
fn secrets_ops(root: &Path) -> Vec<FsOp> {
    use ember_types::secrets::{MAX_SECRETS, SECRETS_DIR, TMPFS_BYTES};
    let dir = root.join(SECRETS_DIR.trim_start_matches('/'));
    let data = format!("size={TMPFS_BYTES},nr_inodes={},mode=0755", MAX_SECRETS + 1);
    vec![
        mkdir(root.join("run"), 0o755),
        mkdir(&dir, 0o755),
        mount("tmpfs", &dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, &data),
    ]
}

/// A minimal `/dev`: device nodes cannot be created in a user namespace, so the
/// host's harmless ones are bound onto empty files.
fn dev_ops(dev: &Path) -> Vec<FsOp> {
    let mut ops = vec![mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=65536,mode=0755")];
    for d in ["null", "zero", "full", "random", "urandom", "tty"] {
        ops.push(write(dev.join(d), Vec::new(), 0o666));
        ops.push(FsOp::Bind { source: cstr(Path::new("/dev").join(d)), target: cstr(dev.join(d)) });
    }
    ops.push(mkdir(dev.join("pts"), 0o755));
    ops.push(mount("devpts", dev.join("pts"), "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"));
    ops.push(FsOp::Symlink { target: cstr("pts/ptmx"), link: cstr(dev.join("ptmx")) });
    ops.push(mkdir(dev.join("shm"), 0o1777));
    ops.push(mount("tmpfs", dev.join("shm"), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=67108864"));
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        ops.push(FsOp::Symlink { target: cstr(target), link: cstr(dev.join(name)) });
    }
    ops
}

fn mount(src: &str, target: impl AsRef<Path>, fstype: &str, flags: u64, data: &str) -> FsOp {
    FsOp::Mount {
        source: Some(cstr(src)),
        target: cstr(target),
        fstype: Some(cstr(fstype)),
        flags,
        data: (!data.is_empty()).then(|| cstr(data)),
    }
}

fn mkdir(p: impl AsRef<Path>, mode: u32) -> FsOp {
    FsOp::Mkdir { path: cstr(p), mode }
}

fn write(p: impl AsRef<Path>, contents: Vec<u8>, mode: u32) -> FsOp {
    FsOp::WriteFile { path: cstr(p), contents, mode }
}

/// Paths under a writable layer's root that the launch mounts on or writes
/// into from the host's side of the root (before `pivot_root`, or on the
/// host for the OCI classes).
const LAYER_PATHS: [&str; 6] = ["etc", "proc", "dev", "tmp", "run", "run/secrets"];

/// Refuses a writable layer (`upper`) in which one of [`LAYER_PATHS`], or a
/// path in `also` (relative, e.g. a volume's mount path), is or goes through
/// a symlink. A restored layer is what the sandbox (or a snapshot store) made
/// it: its `etc -> /some/host/dir` would be followed by the host-side writes
/// of `etc/hostname`, its `tmp -> /` bound by the OCI runtime. Resolved from
/// the layer's fd, never following (docs/threat-model.md).
pub fn check_layer_root(upper: &Path, also: &[&str]) -> Result<(), RuntimeError> {
    let dir = ember_sys::beneath::PinnedDir::open(upper)?;
    for rel in LAYER_PATHS.iter().copied().chain(also.iter().copied()) {
        if dir.has_symlink(rel)? {
            return Err(RuntimeError::UnsafeLayer { path: upper.join(rel) });
        }
    }
    Ok(())
}

/// Refuses an image in which one of [`LAYER_PATHS`] is not a directory: the
/// mount plan writes and mounts there before `pivot_root`, and a symlink would
/// point those at host paths. The top-most layer that has the name decides
/// (layers are immutable; a restored upper dir is checked by [`check_layer_root`]).
///
/// A list that passed is remembered (up to [`CHECKED_MAX`] lists, forgotten
/// all at once when full): an image's layers are unpacked once each, beneath
/// a path named by their digest, and never change there, so the answer
/// cannot either; a 5-layer image cost 30 stats per create.
pub fn check_image_root(lower_dirs: &[PathBuf]) -> Result<(), RuntimeError> {
    if lower_dirs.is_empty() || checked().contains(lower_dirs) {
        return Ok(());
    }
    stat_image_root(lower_dirs)?;
    let mut checked = checked();
    if checked.len() >= CHECKED_MAX {
        checked.clear();
    }
    checked.insert(lower_dirs.to_vec());
    Ok(())
}

/// How many lower-dir lists [`check_image_root`] remembers.
const CHECKED_MAX: usize = 1024;

fn checked() -> std::sync::MutexGuard<'static, std::collections::HashSet<Vec<PathBuf>>> {
    static CHECKED: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<Vec<PathBuf>>>> =
        std::sync::LazyLock::new(Default::default);
    CHECKED.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn stat_image_root(lower_dirs: &[PathBuf]) -> Result<(), RuntimeError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    for name in LAYER_PATHS {
        for l in lower_dirs {
            let p = l.join(name);
            match std::fs::symlink_metadata(&p) {
                Err(_) => continue,
                Ok(m) if m.is_dir() => break,
                Ok(m) if m.file_type().is_char_device() && m.rdev() == 0 => break, // whiteout
                Ok(_) => {
                    return Err(RuntimeError::Prepare {
                        what: "image root (/etc, /proc, /dev, /tmp, /run and /run/secrets must be directories)",
                        path: p,
                        source: std::io::ErrorKind::InvalidInput.into(),
                    })
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_whose_etc_is_a_symlink_is_refused_and_a_good_one_remembered() {
        let root = std::env::temp_dir().join(format!("ember-image-root-{}", std::process::id()));
        let (top, bottom) = (root.join("top"), root.join("bottom"));
        for d in [&top, &bottom] {
            std::fs::create_dir_all(d).unwrap();
        }
        // The top layer's /etc is a link to the host's: refused.
        symlink("/etc", top.join("etc")).unwrap();
        std::fs::create_dir(bottom.join("etc")).unwrap();
        let bad = vec![top.clone(), bottom.clone()];
        assert!(check_image_root(&bad).is_err());
        assert!(check_image_root(&bad).is_err(), "a refusal is not remembered as a pass");
        assert!(!checked().contains(&bad));
        // The order decides: the top-most layer that has the name.
        let good = vec![bottom.clone(), top.clone()];
        check_image_root(&good).unwrap();
        assert!(checked().contains(&good), "a pass is remembered");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
