//! Secrets of a sandbox: `{"name": "value"}` on create or claim, delivered as
//! files `/run/secrets/<name>` (mode 0400, the sandbox user's) on a tmpfs the
//! launch mounts in the sandbox's own mount namespace. The values live only in
//! the daemon's memory for the length of the create call: never in a record,
//! an environment, a log line or an error (`Debug` prints names only).
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where the files are, inside the sandbox.
pub const SECRETS_DIR: &str = "/run/secrets";
/// At most this many secrets per sandbox.
pub const MAX_SECRETS: usize = 64;
/// A name's bytes: `[A-Za-z0-9._-]`, not `.` or `..`.
pub const MAX_NAME_BYTES: usize = 128;
/// One value's bytes.
pub const MAX_VALUE_BYTES: usize = 64 << 10;
/// All values together; the tmpfs is sized from it (`TMPFS_BYTES`).
pub const MAX_TOTAL_BYTES: usize = 512 << 10;
/// Size of the secrets tmpfs: the values plus a page per file.
pub const TMPFS_BYTES: usize = MAX_TOTAL_BYTES + MAX_SECRETS * 4096;

/// Name → value, redacted when printed.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secrets(pub BTreeMap<String, String>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.0.keys().map(|k| (k, "<redacted>"))).finish()
    }
}

/// Why a set of secrets is refused; it names the secret, never its value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("too many secrets: {count} (at most {MAX_SECRETS})")]
    TooMany { count: usize },
    #[error("bad secret name {name:?}: 1 to {MAX_NAME_BYTES} of [A-Za-z0-9._-], not . or ..")]
    Name { name: String },
    #[error("secret {name:?} is {bytes} bytes (at most {MAX_VALUE_BYTES})")]
    ValueTooLarge { name: String, bytes: usize },
    #[error("secrets total {bytes} bytes (at most {MAX_TOTAL_BYTES})")]
    TotalTooLarge { bytes: usize },
}

/// Whether `name` can be a file name in the secrets dir: no `/`, no NUL, not
/// `.` or `..`, nothing a shell or a path join could read differently.
pub fn valid_name(name: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    (1..=MAX_NAME_BYTES).contains(&name.len()) && name.chars().all(ok) && name != "." && name != ".."
}

impl Secrets {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }

    /// Checks names, count and sizes against the caps above.
    pub fn validate(&self) -> Result<(), SecretError> {
        if self.0.len() > MAX_SECRETS {
            return Err(SecretError::TooMany { count: self.0.len() });
        }
        let mut total = 0usize;
        for (name, value) in &self.0 {
            if !valid_name(name) {
                return Err(SecretError::Name { name: name.chars().take(MAX_NAME_BYTES).collect() });
            }
            if value.len() > MAX_VALUE_BYTES {
                return Err(SecretError::ValueTooLarge { name: name.clone(), bytes: value.len() });
            }
            total += value.len();
        }
        if total > MAX_TOTAL_BYTES {
            return Err(SecretError::TotalTooLarge { bytes: total });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(name: &str, value: &str) -> Secrets {
        Secrets([(name.to_string(), value.to_string())].into())
    }

    #[test]
    fn names_are_file_names_beneath_the_dir() {
        for bad in ["", ".", "..", "a/b", "../x", "a\0b", "a b", &"x".repeat(MAX_NAME_BYTES + 1)] {
            assert!(one(bad, "v").validate().is_err(), "{bad:?} accepted");
        }
        for good in ["token", "db.password", "API_KEY-2", "..x"] {
            assert_eq!(one(good, "v").validate(), Ok(()), "{good:?} refused");
        }
    }

    #[test]
    fn sizes_and_count_are_bounded() {
        assert!(one("a", &"v".repeat(MAX_VALUE_BYTES + 1)).validate().is_err());
        let many = Secrets((0..=MAX_SECRETS).map(|i| (format!("s{i}"), String::new())).collect());
        assert_eq!(many.validate(), Err(SecretError::TooMany { count: MAX_SECRETS + 1 }));
        let big = Secrets((0..9).map(|i| (format!("s{i}"), "v".repeat(MAX_VALUE_BYTES))).collect());
        assert!(matches!(big.validate(), Err(SecretError::TotalTooLarge { .. })));
    }

    #[test]
    fn debug_prints_names_not_values() {
        let s = format!("{:?}", one("token", "hunter2"));
        assert!(s.contains("token") && !s.contains("hunter2"), "{s}");
    }
}
