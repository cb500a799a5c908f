//! `ember bench mounts`' measuring: a workspace's mount round trip (its
//! image loop-mounted, its tree bound, both unmounted) as the store makes it,
//! with syscalls (`ember_sys::loopdev`), beside mount(8) and umount(8) doing
//! the same in the same run, alternated, at several sizes of the host's mount
//! table (filled with small tmpfs mounts: libmount reads the whole table on
//! every call). And a 1 GiB workspace's `mkfs.ext4` as the store runs it (in
//! its small namespace, journal not zeroed) beside the way it ran before
//! (the host's namespace, journal zeroed), alternated too. Root only.
use crate::volume::{make_image, mount_image, quiet_namespace, run};
use crate::{io, WorkspaceError};
use ember_sys::loopdev;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// One figure: the host's mount table while it was taken, and each side's
/// round trips in ms (or the first error).
pub struct MountRow {
    pub table: usize,
    pub ours: Result<Vec<f64>, WorkspaceError>,
    pub mount8: Result<Vec<f64>, WorkspaceError>,
    /// `mkfs.ext4` of a 1 GiB image as the store runs it.
    pub mkfs: Result<Vec<f64>, WorkspaceError>,
    /// The same in the host's namespace, with the journal zeroed (before).
    pub mkfs_host: Result<Vec<f64>, WorkspaceError>,
}

struct Paths {
    img: PathBuf,
    fs: PathBuf,
    data: PathBuf,
    mnt: PathBuf,
}

/// `runs` round trips each way for each extra-mount count in `tables`
/// (ascending), in `dir` (made, then removed with everything mounted there).
pub fn mounts(dir: &Path, runs: usize, tables: &[usize], mut row: impl FnMut(MountRow)) -> Result<(), WorkspaceError> {
    // Only a dir this bench made (or nothing) is cleared: a mistyped
    // `--work-dir` naming a directory of the user's is refused, not removed.
    if dir.exists() && !dir.join("disk.img").exists() {
        return Err(io("use as the bench's work dir (exists, not made by it)", dir)(
            std::io::ErrorKind::AlreadyExists.into(),
        ));
    }
    cleanup(dir);
    let fill = dir.join("fill");
    std::fs::create_dir_all(&fill).map_err(io("mkdir", &fill))?;
    let res = measure(dir, runs, tables, &mut row);
    cleanup(dir);
    res
}

fn measure(dir: &Path, runs: usize, tables: &[usize], row: &mut impl FnMut(MountRow)) -> Result<(), WorkspaceError> {
    let p = prepare(dir)?;
    // Made before the fill, as a store makes it when it opens.
    let quiet = quiet_namespace(dir);
    let mut filled = 0;
    for &extra in tables {
        while filled < extra {
            let d = dir.join("fill").join(filled.to_string());
            std::fs::create_dir_all(&d).map_err(io("mkdir", &d))?;
            ember_sys::fs::mount_tmpfs(&d, "size=4k")?;
            filled += 1;
        }
        let (mut ours, mut theirs) = (Ok(Vec::new()), Ok(Vec::new()));
        let (mut mkfs, mut mkfs_host) = (Ok(Vec::new()), Ok(Vec::new()));
        for _ in 0..runs {
            time(&mut ours, || syscalls(&p));
            time(&mut theirs, || mount8(&p));
            time(&mut mkfs, || made(&dir.join("mk"), |d| make_image(d, MKFS_SIZE, (0, 0), quiet.as_ref())));
            time(&mut mkfs_host, || made(&dir.join("mk"), mkfs_before));
        }
        let table = std::fs::read_to_string("/proc/self/mountinfo").map_or(0, |m| m.lines().count());
        row(MountRow { table, ours, mount8: theirs, mkfs, mkfs_host });
    }
    Ok(())
}

/// The image size `mkfs.ext4` is timed on (the default workspace's).
const MKFS_SIZE: u64 = 1 << 30;

/// Runs `f` on a fresh dir `d`, then removes it.
fn made(d: &Path, f: impl FnOnce(&Path) -> Result<(), WorkspaceError>) -> Result<(), WorkspaceError> {
    let _ = std::fs::remove_dir_all(d);
    let res = f(d);
    let _ = std::fs::remove_dir_all(d);
    res
}

/// `make_image` as it was: `mkfs.ext4` in the host's namespace, the journal
/// zeroed.
fn mkfs_before(d: &Path) -> Result<(), WorkspaceError> {
    std::fs::create_dir_all(d).map_err(io("mkdir", d))?;
    let img = d.join("disk.img");
    let f = std::fs::File::create_new(&img).map_err(io("create", &img))?;
    f.set_len(MKFS_SIZE).map_err(io("truncate", &img))?;
    drop(f);
    run("mkfs.ext4", &["-q", "-F", "-m", "0", "-E", "root_owner=0:0", &img.to_string_lossy()], &img)
}

/// Times `f` into `acc`, which keeps the first error instead once one came.
fn time(acc: &mut Result<Vec<f64>, WorkspaceError>, f: impl FnOnce() -> Result<(), WorkspaceError>) {
    let Ok(v) = acc else { return };
    let t = Instant::now();
    match f() {
        Ok(()) => v.push(t.elapsed().as_secs_f64() * 1000.0),
        Err(e) => *acc = Err(e),
    }
}

/// A 64 MiB ext4 image, its mount points and, inside it, the tree to bind.
fn prepare(dir: &Path) -> Result<Paths, WorkspaceError> {
    let p = Paths { img: dir.join("disk.img"), fs: dir.join("fs"), data: dir.join("fs/data"), mnt: dir.join("mnt") };
    let f = std::fs::File::create(&p.img).map_err(io("create", &p.img))?;
    f.set_len(64 << 20).map_err(io("truncate", &p.img))?;
    run("mkfs.ext4", &["-q", "-F", "-m", "0", &p.img.to_string_lossy()], &p.img)?;
    for d in [&p.fs, &p.mnt] {
        std::fs::create_dir_all(d).map_err(io("mkdir", d))?;
    }
    mount_image(&p.img, &p.fs)?;
    std::fs::create_dir_all(&p.data).map_err(io("mkdir", &p.data))?;
    loopdev::unmount(&p.fs)?;
    Ok(p)
}

fn syscalls(p: &Paths) -> Result<(), WorkspaceError> {
    mount_image(&p.img, &p.fs)?;
    loopdev::bind(&p.data, &p.mnt)?;
    loopdev::unmount(&p.mnt)?;
    loopdev::unmount(&p.fs)?;
    Ok(())
}

fn mount8(p: &Paths) -> Result<(), WorkspaceError> {
    let (img, fs) = (p.img.to_string_lossy(), p.fs.to_string_lossy());
    let (data, mnt) = (p.data.to_string_lossy(), p.mnt.to_string_lossy());
    run("mount", &["-o", "loop,nosuid,nodev", &img, &fs], &p.img)?;
    run("mount", &["--bind", &data, &mnt], &p.data)?;
    run("umount", &[&mnt], &p.mnt)?;
    run("umount", &[&fs], &p.fs)
}

/// Unmounts what the bench mounted under `dir` and removes it.
fn cleanup(dir: &Path) {
    for m in [dir.join("mnt"), dir.join("fs")] {
        let _ = ember_sys::fs::unmount_detach(&m);
    }
    for e in std::fs::read_dir(dir.join("fill")).into_iter().flatten().flatten() {
        let _ = ember_sys::fs::unmount_detach(&e.path());
    }
    let _ = std::fs::remove_dir_all(dir);
}
