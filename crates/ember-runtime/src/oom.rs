//! Where a class's sandboxes report their OOM kills: descriptors that up to
//! [`PER_SOURCE`] of them share, not one each. One each cost the daemon a
//! descriptor per sandbox beside its pidfd, so its `RLIMIT_NOFILE` (20,000
//! on this project's machines, unraisable without `CAP_SYS_RESOURCE`)
//! capped it below 10,000 sandboxes; and on cgroup v2 each was an inotify
//! instance, of which a user has 128 by default
//! (`fs.inotify.max_user_instances`), so a v2 host could not start its
//! ~128th sandbox.
//!
//! A source that fires says only that some sandbox reported to it may have
//! had an OOM kill (cgroup v1 also signals one whose cgroup is removed): the
//! engine reads the kill counters of that source's sandboxes to learn
//! which. So a source is shared by few enough that a fire costs little.
use ember_cgroups::{CgroupError, Cgroups};
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};

/// Sandboxes per source: a fire reads at most this many counters (a few
/// times over a second), and a class holds one descriptor per this many.
pub const PER_SOURCE: usize = 64;

/// A class's shared OOM sources, made as launches need them.
#[derive(Debug, Default)]
pub struct OomSources {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Each source and how many sandboxes report to it.
    sources: Vec<(Arc<OwnedFd>, usize)>,
    /// Which source each sandbox reports to.
    of: HashMap<String, usize>,
}

impl OomSources {
    /// A source that sandbox cgroup `name`'s OOM events now reach: the
    /// least shared one, or a new one once each has [`PER_SOURCE`].
    pub fn watch(&self, cg: &dyn Cgroups, name: &str) -> Result<Arc<OwnedFd>, CgroupError> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let i = match inner.of.get(name) {
            Some(&i) => i,
            None => {
                let i = inner.pick(cg)?;
                inner.sources[i].1 += 1;
                inner.of.insert(name.to_string(), i);
                i
            }
        };
        let source = inner.sources[i].0.clone();
        drop(inner);
        if let Err(e) = cg.oom_report_to(name, source.as_fd()) {
            self.forget(name);
            return Err(e);
        }
        Ok(source)
    }

    /// Sandbox `name` is gone: its place is free.
    pub fn forget(&self, name: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = inner.of.remove(name) {
            inner.sources[i].1 = inner.sources[i].1.saturating_sub(1);
        }
    }
}

impl Inner {
    /// The least shared source below [`PER_SOURCE`], else a new one; the
    /// least shared anyway when a new one cannot be made (no inotify
    /// instance left to this user, say).
    fn pick(&mut self, cg: &dyn Cgroups) -> Result<usize, CgroupError> {
        let least = self.sources.iter().enumerate().min_by_key(|(_, (_, n))| *n).map(|(i, (_, n))| (i, *n));
        if let Some((i, n)) = least {
            if n < PER_SOURCE {
                return Ok(i);
            }
        }
        match cg.oom_source() {
            Ok(fd) => {
                self.sources.push((Arc::new(fd), 0));
                Ok(self.sources.len() - 1)
            }
            Err(e) => match least {
                Some((i, _)) => {
                    tracing::warn!(error = %e, made = self.sources.len(), "another OOM source: sharing those made");
                    Ok(i)
                }
                None => Err(e),
            },
        }
    }
}
