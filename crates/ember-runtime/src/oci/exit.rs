//! The agent's exit code, left beside its socket: under an OCI runtime the
//! daemon cannot `waitid` the init (it is the runtime's child).
use std::path::Path;

/// The agent writes its exit code here, in its socket dir, just before it
/// exits (the daemon cannot `waitid` an init an OCI runtime started).
pub const EXIT_FILE: &str = "exit";

/// `O_NOFOLLOW` (its x86_64 Linux value, the target ember builds for), for opens that must not follow a
/// link (this crate has no libc; its `unsafe` lives in ember-sys).
pub(super) const O_NOFOLLOW: i32 = 0o400_000;

/// Reads the agent's exit code. The file is in a dir the sandbox can write, so
/// it is untrusted: never a symlink or a FIFO (`O_NOFOLLOW | O_NONBLOCK`, a
/// regular file only), a few bytes, a number. A sandbox can only lie about its
/// own exit code, which it could choose anyway.
pub(super) fn read_exit_file(path: &Path) -> Option<i32> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    const O_NONBLOCK: i32 = 0o4_000;
    let f = std::fs::OpenOptions::new().read(true).custom_flags(O_NOFOLLOW | O_NONBLOCK).open(path).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    f.take(16).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_file_is_read_only_when_it_is_a_small_regular_file() {
        let dir = std::env::temp_dir().join(format!("ember-exit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join(EXIT_FILE);
        assert_eq!(read_exit_file(&f), None, "absent: unknown");
        std::fs::write(&f, "3\n").unwrap();
        assert_eq!(read_exit_file(&f), Some(3));
        std::fs::write(&f, "not a number").unwrap();
        assert_eq!(read_exit_file(&f), None);
        let target = dir.join("elsewhere");
        std::fs::write(&target, "7\n").unwrap();
        std::fs::remove_file(&f).unwrap();
        std::os::unix::fs::symlink(&target, &f).unwrap();
        assert_eq!(read_exit_file(&f), None, "a symlink is not followed");
        std::fs::remove_file(&f).unwrap();
        let mkfifo = std::process::Command::new("mkfifo").arg(&f).status().unwrap();
        assert!(mkfifo.success());
        assert_eq!(read_exit_file(&f), None, "a FIFO neither blocks nor counts");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
