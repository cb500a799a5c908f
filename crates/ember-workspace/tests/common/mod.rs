//! What the workspace tests share: a scratch dir that takes its mounts away.
use std::path::{Path, PathBuf};

/// Mount points at or below `dir`.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().filter_map(|l| l.split_whitespace().nth(4).map(PathBuf::from)).filter(|m| m.starts_with(dir)).collect()
}

/// A dir removed at drop, every mount below it unmounted first (deepest first).
pub struct Scratch(pub PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        for m in mounts_under(&self.0).iter().rev() {
            let _ = std::process::Command::new("umount").arg("-l").arg(m).status();
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
