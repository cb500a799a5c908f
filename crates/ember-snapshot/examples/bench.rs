//! `cargo run --release -p ember-snapshot --example bench -- [SIZE_MB] [WORK_DIR]`
//! (the same figures as `ember bench snapshot`).
use ember_snapshot::bench::{bench, BenchConfig};

fn main() {
    let mut args = std::env::args().skip(1);
    let dir_size_mb = args.next().and_then(|s| s.parse().ok()).unwrap_or(500);
    let work_dir = args.next().map(Into::into).unwrap_or_else(|| std::env::temp_dir().join("ember-bench-snapshot"));
    match bench(&BenchConfig { dir_size_mb, work_dir, forks: 10, keep: false, s3: None }) {
        Ok(report) => print!("{report}"),
        Err(e) => {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            eprintln!("bench failed: {msg}");
            std::process::exit(1);
        }
    }
}
