//! Where a class's sandboxes report their OOM kills: a few descriptors that
//! all of them share, not one each. One each cost the daemon a descriptor
//! per sandbox beside its pidfd, so its `RLIMIT_NOFILE` (20,000 on this
//! project's machines, unraisable without `CAP_SYS_RESOURCE`) capped it
//! below 10,000 sandboxes; and on cgroup v2 each was an inotify instance,
//! of which a user has 128 by default (`fs.inotify.max_user_instances`),
//! so a v2 host could not start its ~128th sandbox.
//!
//! A source that fires says only that some sandbox reported to it may have
//! had an OOM kill: the engine reads the kill counters of that source's
//! sandboxes to learn which.
use ember_cgroups::{CgroupError, Cgroups};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How many sources one class makes at most. Each fire reads the counters
/// of a source's share of the sandboxes, 1/8 of them.
pub const OOM_SOURCES: usize = 8;

/// A class's shared OOM sources, made as launches need them.
#[derive(Debug, Default)]
pub struct OomSources {
    made: Mutex<Vec<Arc<OwnedFd>>>,
    next: AtomicUsize,
}

impl OomSources {
    /// A source that sandbox cgroup `name`'s OOM events now reach.
    pub fn watch(&self, cg: &dyn Cgroups, name: &str) -> Result<Arc<OwnedFd>, CgroupError> {
        let source = self.pick(cg)?;
        cg.oom_report_to(name, source.as_fd())?;
        Ok(source)
    }

    /// How many sources are made.
    pub fn made(&self) -> usize {
        self.made.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// A new source while fewer than [`OOM_SOURCES`] are made, else the next
    /// in turn; one already made when a new one cannot be (no inotify
    /// instance left to this user, say).
    fn pick(&self, cg: &dyn Cgroups) -> Result<Arc<OwnedFd>, CgroupError> {
        let mut made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        if made.len() < OOM_SOURCES {
            match cg.oom_source() {
                Ok(fd) => {
                    let fd = Arc::new(fd);
                    made.push(fd.clone());
                    return Ok(fd);
                }
                Err(e) if made.is_empty() => return Err(e),
                Err(e) => tracing::warn!(error = %e, made = made.len(), "another OOM source: sharing those made"),
            }
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % made.len();
        Ok(made[i].clone())
    }
}
