//! Loop-mounted images and bind mounts made by the daemon itself, where it
//! spawned mount(8) before: one process per mount, each reading the host's
//! whole mount table through libmount (7.5 % of the machine's CPU during a
//! 10-node drill's rebinds, docs/performance.md). The calls are the ones
//! util-linux makes: a free device from `/dev/loop-control`, the image
//! attached with `LOOP_CONFIGURE` (autoclear: the device detaches itself when
//! its filesystem is unmounted), then mount(2).
use crate::fs::cpath;
use crate::SysError;
use std::ffi::CStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

// <linux/loop.h>; the libc crate does not carry them.
const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// How often a free device is asked for again when another process took the
/// one `/dev/loop-control` offered first (`EBUSY` at attach).
const ATTACH_TRIES: usize = 16;

/// Mounts the filesystem image `img` (a regular file, never a symlink) of
/// type `fstype` at `target` through a loop device, nosuid and nodev (what a
/// sandbox writes there never runs set-uid, nor opens a device, on the
/// host). What `mount -o loop,nosuid,nodev` does.
pub fn mount_image(img: &Path, target: &Path, fstype: &CStr) -> Result<(), SysError> {
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    let t = cpath("mount", target)?;
    use std::os::unix::fs::OpenOptionsExt;
    let file: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(img)
        .map_err(|e| SysError::new("open image", img.display().to_string(), e))?
        .into();
    let (dev, path) = attach(&file, img)?;
    drop(file);
    // SAFETY: every pointer is a NUL-terminated string alive across the call.
    let r = unsafe { libc::mount(path.as_ptr(), t.as_ptr(), fstype.as_ptr(), flags, std::ptr::null()) };
    if r != 0 {
        let e = SysError::last("mount", format!("{} on {}", img.display(), target.display()));
        // SAFETY: LOOP_CLR_FD takes no argument; `dev` is ours.
        unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CLR_FD, 0) };
        return Err(e);
    }
    // The mount holds the device now; autoclear detaches it at unmount.
    Ok(())
}

/// Binds `source` at `target` (`mount --bind`).
pub fn bind(source: &Path, target: &Path) -> Result<(), SysError> {
    let (s, t) = (cpath("bind", source)?, cpath("bind", target)?);
    // SAFETY: both pointers are NUL-terminated strings alive across the call.
    let r = unsafe { libc::mount(s.as_ptr(), t.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
    if r != 0 {
        return Err(SysError::last("bind", format!("{} on {}", source.display(), target.display())));
    }
    Ok(())
}

/// Unmounts `target` (`umount`, not lazy: the caller removes what was below).
pub fn unmount(target: &Path) -> Result<(), SysError> {
    let t = cpath("umount", target)?;
    // SAFETY: t is a NUL-terminated path alive across the call.
    if unsafe { libc::umount2(t.as_ptr(), libc::UMOUNT_NOFOLLOW) } != 0 {
        return Err(SysError::last("umount", target.display().to_string()));
    }
    Ok(())
}

/// A free loop device with `file` attached (autoclear), and its path.
fn attach(file: &OwnedFd, img: &Path) -> Result<(OwnedFd, std::ffi::CString), SysError> {
    let ctl = open_rw(c"/dev/loop-control").map_err(|e| SysError::new("open", "/dev/loop-control", e))?;
    let mut last = None;
    for _ in 0..ATTACH_TRIES {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a number.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(SysError::last("loop-control get free", img.display().to_string()));
        }
        let path = std::ffi::CString::new(format!("/dev/loop{n}")).expect("no NUL in a device path");
        let dev = open_rw(&path).map_err(|e| SysError::new("open", format!("/dev/loop{n}"), e))?;
        match configure(&dev, file) {
            Ok(()) => return Ok((dev, path)),
            // Another process attached it between our two calls.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => last = Some(e),
            Err(e) => return Err(SysError::new("attach loop device", img.display().to_string(), e)),
        }
    }
    let e = last.unwrap_or_else(|| std::io::ErrorKind::ResourceBusy.into());
    Err(SysError::new("attach loop device", img.display().to_string(), e))
}

fn configure(dev: &OwnedFd, file: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: all-zero is a valid LoopConfig (plain integers and arrays).
    let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
    cfg.fd = file.as_raw_fd() as u32;
    cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
    // SAFETY: LOOP_CONFIGURE reads one LoopConfig from a live pointer.
    if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &cfg as *const LoopConfig) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EINVAL) && e.raw_os_error() != Some(libc::ENOTTY) {
        return Err(e);
    }
    // Before Linux 5.8: attach, then set the flags.
    // SAFETY: LOOP_SET_FD takes the backing fd as an integer.
    if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_FD, file.as_raw_fd() as libc::c_ulong) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: LOOP_SET_STATUS64 reads one LoopInfo64 from a live pointer.
    if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_STATUS64, &cfg.info as *const LoopInfo64) } != 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: LOOP_CLR_FD takes no argument.
        unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CLR_FD, 0) };
        return Err(e);
    }
    Ok(())
}

fn open_rw(path: &CStr) -> std::io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: path is NUL-terminated and alive across the call.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// Loop devices whose backing file is `img`.
    fn attached_to(img: &Path) -> Vec<String> {
        let name = img.to_string_lossy().into_owned();
        std::fs::read_dir("/sys/block")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).is_ok_and(|b| b.trim() == name))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ember-loop-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("mnt")).unwrap();
        d
    }

    #[test]
    fn an_image_mounts_keeps_what_was_written_and_frees_its_device_at_unmount() {
        let d = scratch("ok");
        let img = d.join("disk.img");
        std::fs::File::create(&img).unwrap().set_len(16 << 20).unwrap();
        let ok = std::process::Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img).status().unwrap();
        assert!(ok.success());
        let mnt = d.join("mnt");
        for round in 0..2 {
            mount_image(&img, &mnt, c"ext4").expect("mount");
            assert!(crate::fs::mounted(&mnt));
            assert_eq!(attached_to(&img).len(), 1, "one device while mounted");
            if round == 0 {
                std::fs::write(mnt.join("f"), b"kept").unwrap();
            } else {
                assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"kept");
            }
            unmount(&mnt).expect("umount");
            assert!(!crate::fs::mounted(&mnt));
            assert_eq!(attached_to(&img), Vec::<String>::new(), "autoclear detached the device at unmount");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn an_image_that_does_not_mount_leaves_no_device_attached() {
        let d = scratch("bad");
        let img = d.join("disk.img");
        std::fs::File::create(&img).unwrap().set_len(4 << 20).unwrap();
        let err = mount_image(&img, &d.join("mnt"), c"ext4").expect_err("zeros are no ext4");
        assert!(err.to_string().contains("disk.img"), "{err}");
        assert_eq!(attached_to(&img), Vec::<String>::new());
        let link = d.join("link.img");
        std::os::unix::fs::symlink(&img, &link).unwrap();
        let err = mount_image(&link, &d.join("mnt"), c"ext4").expect_err("a symlink is not followed");
        assert!(err.to_string().contains("open image"), "{err}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_bind_shows_its_source_and_unmounts() {
        let d = scratch("bind");
        std::fs::create_dir(d.join("src")).unwrap();
        std::fs::write(d.join("src/x"), b"x").unwrap();
        bind(&d.join("src"), &d.join("mnt")).expect("bind");
        assert_eq!(std::fs::read(d.join("mnt/x")).unwrap(), b"x");
        unmount(&d.join("mnt")).expect("umount");
        assert!(!d.join("mnt/x").exists());
        let _ = std::fs::remove_dir_all(&d);
    }
}
