//! Sandbox ids.
//!
//! An id is used as a path component (state dir, cgroup name) and as a hostname, so
//! it is restricted to `[a-z0-9-]`, 1..=63 characters, not starting with `-`.
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid id {id:?}: ids are 1-63 characters of [a-z0-9-] and do not start with '-'")]
pub struct IdError {
    pub id: String,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxId(String);

impl SandboxId {
    /// Builds an id from 16 random bytes, formatted like a UUID v4 (what
    /// OpenSandbox clients expect to see).
    pub fn from_random(mut b: [u8; 16]) -> Self {
        b[6] = (b[6] & 0x0f) | 0x40;
        b[8] = (b[8] & 0x3f) | 0x80;
        let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
        SandboxId(format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32]))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A short form for hostnames and cgroup names in logs.
    pub fn short(&self) -> &str {
        &self.0[..self.0.len().min(12)]
    }
}

impl TryFrom<String> for SandboxId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        let ok = !s.is_empty()
            && s.len() <= 63
            && !s.starts_with('-')
            && s.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
        if ok {
            Ok(SandboxId(s))
        } else {
            Err(IdError { id: s })
        }
    }
}

impl std::str::FromStr for SandboxId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        SandboxId::try_from(s.to_string())
    }
}

impl From<SandboxId> for String {
    fn from(id: SandboxId) -> String {
        id.0
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_are_uuid_shaped_and_valid() {
        let id = SandboxId::from_random([0xab; 16]);
        assert_eq!(id.as_str().len(), 36);
        assert_eq!(&id.as_str()[14..15], "4");
        assert!(SandboxId::try_from(id.as_str().to_string()).is_ok());
    }

    #[test]
    fn rejects_path_tricks() {
        for bad in ["", "../etc", "a/b", "-x", "UPPER", &"a".repeat(64)] {
            assert!(SandboxId::try_from(bad.to_string()).is_err(), "{bad}");
        }
    }
}
