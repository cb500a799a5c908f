//! Caps on every duration and count a request carries, in one place, and the
//! checked arithmetic that turns them into deadlines. A value outside its cap
//! is refused (a 400), never wrapped into a deadline in the past or a panic.
//! docs/api/openapi.yaml states the same bounds.

/// Longest sandbox `timeout` and task `timeout` (seconds), whatever
/// `--max-ttl` allows: 30 days. Longer-lived sandboxes are created without
/// one (on a daemon without `--max-ttl`).
pub const MAX_TIMEOUT_SECS: u64 = 30 * 24 * 3600;
/// A task's sandbox outlives the attempt's `timeout` by this much (to report
/// and clean up), so a task `timeout` is capped this much below a sandbox's.
pub const TASK_GRACE_SECS: u64 = 120;
/// Shortest and longest task lease (`leaseMs`): 100 ms to 1 day.
pub const MIN_LEASE_MS: u64 = 100;
pub const MAX_LEASE_MS: u64 = 24 * 3600 * 1000;
/// Shortest task heartbeat (`heartbeatMs`); the longest is below the lease.
pub const MIN_HEARTBEAT_MS: u64 = 10;
/// Attempts of a task before it is dead-lettered.
pub const MAX_TASK_ATTEMPTS: u32 = 100;
/// Largest `pageSize` of the list routes.
pub const MAX_PAGE_SIZE: u32 = 200;
/// Most workspaces one fork of a snapshot makes. The answer is synchronous
/// (each new workspace is an ext4 image made and filled, ~0.1 s): a larger
/// fan-out is several requests, so none outlives a client's timeout.
pub const MAX_FORK_COUNT: u32 = 100;

/// A value outside its cap: which field, and the bounds it must keep.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field} must be between {min} and {max}{unit}, got {value}")]
pub struct LimitError {
    pub field: &'static str,
    pub value: u64,
    pub min: u64,
    pub max: u64,
    pub unit: &'static str,
}

/// `value` if it lies in `min..=max`.
pub fn check(field: &'static str, value: u64, min: u64, max: u64, unit: &'static str) -> Result<u64, LimitError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(LimitError { field, value, min, max, unit })
    }
}

/// A `timeout` in seconds: at least 1, at most `max` (`--max-ttl`) and never
/// beyond [`MAX_TIMEOUT_SECS`].
pub fn timeout_secs(field: &'static str, value: u64, max: Option<u64>) -> Result<u64, LimitError> {
    let max = max.map_or(MAX_TIMEOUT_SECS, |m| m.min(MAX_TIMEOUT_SECS));
    check(field, value, 1, max, " seconds")
}

/// Unix milliseconds `secs` seconds after `now_ms`, checked: a sum that does
/// not fit is the far future (`i64::MAX`), never a wrapped time in the past.
/// Callers check `secs` against its cap first, so that is a last resort.
pub fn expiry_ms(now_ms: i64, secs: u64) -> i64 {
    i64::try_from(secs).ok().and_then(|s| s.checked_mul(1000)).and_then(|ms| ms.checked_add(now_ms)).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_capped() {
        assert_eq!(timeout_secs("timeout", 600, None), Ok(600));
        assert!(timeout_secs("timeout", 0, None).is_err());
        assert!(timeout_secs("timeout", i64::MAX as u64, None).is_err());
        assert!(timeout_secs("timeout", 99_999_999_999_999, None).is_err());
        assert!(timeout_secs("timeout", 601, Some(600)).is_err());
        // A --max-ttl above the cap does not lift it.
        assert!(timeout_secs("timeout", MAX_TIMEOUT_SECS + 1, Some(u64::MAX)).is_err());
        let e = timeout_secs("timeout", 0, Some(600)).unwrap_err();
        assert_eq!(e.to_string(), "timeout must be between 1 and 600 seconds, got 0");
    }

    #[test]
    fn deadlines_never_wrap() {
        assert_eq!(expiry_ms(1_000, 2), 3_000);
        assert_eq!(expiry_ms(1_000, u64::MAX), i64::MAX);
        assert_eq!(expiry_ms(1_000, i64::MAX as u64), i64::MAX);
        assert_eq!(expiry_ms(i64::MAX - 10, 1), i64::MAX);
        assert_eq!(expiry_ms(0, MAX_TIMEOUT_SECS), MAX_TIMEOUT_SECS as i64 * 1000);
    }
}
