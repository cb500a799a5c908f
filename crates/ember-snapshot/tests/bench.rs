//! The benchmark runs end to end at a small size (the real run is `ember bench snapshot`).
use ember_snapshot::bench::{bench, BenchConfig};

#[test]
fn bench_runs_at_a_small_size() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = BenchConfig { dir_size_mb: 20, work_dir: tmp.path().join("bench"), forks: 2, keep: false, s3: None };
    let r = bench(&cfg).unwrap();
    eprintln!("{r}");
    assert!(r.tree_bytes >= 20_000_000 && r.files > 100);
    assert!(r.changed_bytes >= r.tree_bytes / 100);
    assert!(
        r.incremental_uploaded < r.tree_bytes / 3,
        "incremental uploaded {} of {}",
        r.incremental_uploaded,
        r.tree_bytes
    );
    assert!(r.full.stored_bytes < r.tree_bytes, "partly compressible data compresses");
    assert!(r.tar_zstd.stored_bytes > 0 && r.restore.bytes == r.tree_bytes);
    assert!(!cfg.work_dir.exists(), "scratch removed");
    // The reference is multi-threaded like ember (`-T0`), and says so.
    let text = r.to_string();
    assert!(text.contains("tar | zstd -T0 -3 (reference)"), "{text}");
    assert!(text.contains("zstd -T0 -d | tar -x (reference)"), "{text}");
}
