//! Samples, nearest-rank percentiles and a progress counter on stderr.
use serde::Serialize;
use std::io::{IsTerminal, Write};
use std::time::Duration;

/// After this many failures in a row with no success, a series stops early:
/// the thing measured is broken and repeating it only wastes time.
const GIVE_UP_AFTER: usize = 3;

/// One measured quantity: its samples (ms) and the runs that failed.
#[derive(Debug, Default)]
pub struct Series {
    samples: Vec<f64>,
    failed: usize,
    first_error: Option<String>,
    gave_up: bool,
}

impl Series {
    pub fn push(&mut self, d: Duration) {
        self.samples.push(d.as_secs_f64() * 1000.0);
    }

    pub fn push_ms(&mut self, ms: f64) {
        self.samples.push(ms);
    }

    pub fn fail(&mut self, e: impl std::fmt::Display) {
        self.failed += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
        if self.samples.is_empty() && self.failed >= GIVE_UP_AFTER {
            self.gave_up = true;
        }
    }

    /// True once the series failed [`GIVE_UP_AFTER`] times without one success.
    pub fn gave_up(&self) -> bool {
        self.gave_up
    }

    pub fn summary(&self) -> Summary {
        let mut s = self.samples.clone();
        s.sort_by(f64::total_cmp);
        let mean = (!s.is_empty()).then(|| s.iter().sum::<f64>() / s.len() as f64);
        // Microsecond resolution is all the clocks here give meaningfully.
        let us = |v: Option<f64>| v.map(|v| (v * 1000.0).round() / 1000.0);
        Summary {
            samples: s.len(),
            failed: self.failed,
            min_ms: us(s.first().copied()),
            p50_ms: us(percentile(&s, 50.0)),
            p90_ms: us(percentile(&s, 90.0)),
            p99_ms: us(percentile(&s, 99.0)),
            max_ms: us(s.last().copied()),
            mean_ms: us(mean),
            first_error: self.first_error.clone(),
            gave_up: self.gave_up,
        }
    }
}

/// What a [`Series`] came to. Every figure is absent when nothing succeeded.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub samples: usize,
    pub failed: usize,
    pub min_ms: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub mean_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub gave_up: bool,
}

/// Nearest-rank percentile of sorted samples: the smallest sample with at
/// least `p`% of the samples at or below it.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

/// `label i/n` on stderr: rewritten in place on a terminal, printed once at the
/// end otherwise (so logs get one line per series).
pub struct Progress {
    label: String,
    total: usize,
    tty: bool,
}

impl Progress {
    pub fn new(label: impl Into<String>, total: usize) -> Progress {
        let p = Progress { label: label.into(), total, tty: std::io::stderr().is_terminal() };
        p.tick(0);
        p
    }

    pub fn tick(&self, done: usize) {
        if self.tty {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[2K  {} {done}/{}", self.label, self.total);
            let _ = e.flush();
        }
    }

    pub fn finish(&self, s: &Series) {
        let failed = if s.failed > 0 { format!(", {} failed", s.failed) } else { String::new() };
        let stop = if s.gave_up { " (gave up)" } else { "" };
        if self.tty {
            eprint!("\r\x1b[2K");
        }
        eprintln!("  {} {}/{}{failed}{stop}", self.label, s.samples.len(), self.total);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&s, 50.0), Some(50.0));
        assert_eq!(percentile(&s, 90.0), Some(90.0));
        assert_eq!(percentile(&s, 99.0), Some(99.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn gives_up_only_without_a_success() {
        let mut s = Series::default();
        s.push_ms(1.0);
        for _ in 0..5 {
            s.fail("x");
        }
        assert!(!s.gave_up());
        let mut s = Series::default();
        for _ in 0..3 {
            s.fail("x");
        }
        assert!(s.gave_up());
        let sum = s.summary();
        assert_eq!((sum.samples, sum.failed, sum.p50_ms), (0, 3, None));
        assert_eq!(sum.first_error.as_deref(), Some("x"));
    }
}
