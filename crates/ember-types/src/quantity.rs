//! Kubernetes-style quantities, as OpenSandbox's `resourceLimits` carries them:
//! memory (`512Mi`, `2Gi`, `1G`, `1048576`) and cpu (`500m`, `1`, `0.5`).

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantityError {
    #[error("invalid memory quantity {0:?}: use bytes or a suffix Ki, Mi, Gi, Ti, K, M, G, T")]
    Memory(String),
    #[error("invalid cpu quantity {0:?}: use cores (\"1\", \"0.5\") or millicores (\"500m\")")]
    Cpu(String),
}

/// Parses a memory quantity into bytes.
pub fn parse_memory_bytes(s: &str) -> Result<u64, QuantityError> {
    let err = || QuantityError::Memory(s.to_string());
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let mult: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return Err(err()),
    };
    let v: f64 = num.parse().map_err(|_| err())?;
    if !v.is_finite() || v <= 0.0 {
        return Err(err());
    }
    let bytes = v * mult as f64;
    if bytes > u64::MAX as f64 / 2.0 {
        return Err(err());
    }
    Ok(bytes as u64)
}

/// Parses a cpu quantity into millicores.
pub fn parse_cpu_millis(s: &str) -> Result<u64, QuantityError> {
    let err = || QuantityError::Cpu(s.to_string());
    let t = s.trim();
    let millis = if let Some(m) = t.strip_suffix('m') {
        m.parse::<u64>().map_err(|_| err())?
    } else {
        let v: f64 = t.parse().map_err(|_| err())?;
        if !v.is_finite() || v > 1_000_000.0 {
            return Err(err());
        }
        (v * 1000.0).round() as u64
    };
    if millis == 0 {
        return Err(err());
    }
    Ok(millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory() {
        assert_eq!(parse_memory_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(parse_memory_bytes("2Gi"), Ok(2 << 30));
        assert_eq!(parse_memory_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(parse_memory_bytes("4096"), Ok(4096));
        assert_eq!(parse_memory_bytes("1.5Gi"), Ok(3 << 29));
        for bad in ["", "Mi", "-1Mi", "12Xi", "0", "nan"] {
            assert!(parse_memory_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cpu() {
        assert_eq!(parse_cpu_millis("500m"), Ok(500));
        assert_eq!(parse_cpu_millis("1"), Ok(1000));
        assert_eq!(parse_cpu_millis("0.25"), Ok(250));
        for bad in ["", "0", "0m", "x", "-1"] {
            assert!(parse_cpu_millis(bad).is_err(), "{bad}");
        }
    }
}
