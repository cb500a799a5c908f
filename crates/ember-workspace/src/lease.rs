//! Single-writer leases with fencing epochs.
//!
//! Protocol: 1. a read-write mount asks for the lease; 2. if a live sandbox
//! holds it, the request is refused, unless it steals, which fences the old
//! holder; 3. every grant increments the epoch; 4. a commit (snapshot) is
//! accepted only while the committer's epoch is the current one.
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub holder: String,
    pub epoch: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LeaseError {
    #[error("workspace {name} is mounted read-write by sandbox {holder} (epoch {epoch}); mount it read-only, or steal the lease")]
    Held { name: String, holder: String, epoch: u64 },
    #[error(
        "workspace {name}: epoch {epoch} of sandbox {holder} was fenced by epoch {current}; the commit is refused"
    )]
    Fenced { name: String, holder: String, epoch: u64, current: u64 },
}

/// The lease part of a workspace's record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseState {
    /// The last epoch granted; never decreases.
    pub epoch: u64,
    pub lease: Option<Lease>,
}

impl LeaseState {
    /// Grants the lease to `holder`. `alive` says whether a sandbox still exists;
    /// a dead holder's lease is simply taken over.
    pub fn acquire(
        &mut self,
        name: &str,
        holder: &str,
        steal: bool,
        alive: impl Fn(&str) -> bool,
    ) -> Result<u64, LeaseError> {
        if let Some(l) = &self.lease {
            if l.holder != holder && alive(&l.holder) && !steal {
                return Err(LeaseError::Held { name: name.into(), holder: l.holder.clone(), epoch: l.epoch });
            }
        }
        self.epoch += 1;
        self.lease = Some(Lease { holder: holder.to_string(), epoch: self.epoch });
        Ok(self.epoch)
    }

    /// Releases the lease if `holder` still has it at `epoch` (a fenced holder
    /// releasing late must not drop the new holder's lease).
    pub fn release(&mut self, holder: &str, epoch: u64) -> bool {
        match &self.lease {
            Some(l) if l.holder == holder && l.epoch == epoch => {
                self.lease = None;
                true
            }
            _ => false,
        }
    }

    /// Accepts a commit only from the current epoch's holder.
    pub fn check(&self, name: &str, holder: &str, epoch: u64) -> Result<(), LeaseError> {
        match &self.lease {
            Some(l) if l.holder == holder && l.epoch == epoch => Ok(()),
            _ => Err(LeaseError::Fenced { name: name.into(), holder: holder.into(), epoch, current: self.epoch }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_writer_steal_fences_and_epochs_only_grow() {
        let mut s = LeaseState::default();
        assert_eq!(s.acquire("w", "a", false, |_| true), Ok(1));
        assert!(matches!(s.acquire("w", "b", false, |_| true), Err(LeaseError::Held { .. })));
        assert_eq!(s.acquire("w", "b", true, |_| true), Ok(2), "steal");
        assert!(matches!(s.check("w", "a", 1), Err(LeaseError::Fenced { current: 2, .. })));
        assert!(s.check("w", "b", 2).is_ok());
        assert!(!s.release("a", 1), "a fenced holder cannot release the new lease");
        assert!(s.release("b", 2));
        assert_eq!(s.acquire("w", "c", false, |_| true), Ok(3));
    }

    #[test]
    fn a_dead_holder_is_taken_over_without_steal() {
        let mut s = LeaseState::default();
        s.acquire("w", "a", false, |_| true).unwrap();
        assert_eq!(s.acquire("w", "b", false, |h| h != "a"), Ok(2));
    }
}
