//! Snapshot and restore through a LocalStore: round trip, incremental upload,
//! corruption and missing chunks. Run as root (ownership is restored).
mod common;

use std::cell::Cell;
use std::fs;

use common::{assert_same_tree, keys, mixed_tree, Rng};
use ember_snapshot::{
    inspect, list, restore, snapshot, ChunkHash, LocalStore, RestoreOptions, SnapshotError, SnapshotOptions,
};

#[test]
fn mixed_tree_round_trips_through_local_store() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    mixed_tree(&src);
    let store = common::local_store(&tmp.path().join("store"));
    let calls = Cell::new(0u32);
    let last = Cell::new((0, 0));
    let progress = |p: ember_snapshot::Progress| {
        calls.set(calls.get() + 1);
        last.set((p.bytes_done, p.bytes_total));
    };
    let mut opts = SnapshotOptions::new("round-trip").label("workspace", "w1").label("lease_epoch", "7");
    opts.progress = &progress;
    let info = snapshot(&src, &store, opts).unwrap();
    let s = &info.summary.stats;
    assert!(calls.get() > 2, "progress was reported");
    assert_eq!(last.get().0, last.get().1, "progress ends at the total");
    assert_eq!(s.logical_bytes, last.get().1);
    assert!(s.logical_bytes > 20_000_000);
    assert_eq!(s.files, 9);
    assert_eq!(s.symlinks, 3);
    assert!(s.chunks_reused >= 1, "the two identical small files share a chunk");
    assert!(info.summary.warnings.iter().any(|w| w.contains("socket a/sock")), "{:?}", info.summary.warnings);

    let summary = inspect(&store, "round-trip").unwrap();
    assert_eq!(summary.labels["lease_epoch"], "7");
    assert_eq!(summary.stats, *s);
    assert!(summary.created_unix_ms > 0);

    let out = tmp.path().join("out");
    let r = restore(&store, "round-trip", &out, RestoreOptions::default()).unwrap();
    assert_eq!((r.files, r.symlinks, r.bytes), (9, 3, s.logical_bytes));
    assert_same_tree(&src, &out);
    // No temp dir is left beside the target.
    let names: Vec<_> = fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 3, "{names:?}");

    let again = restore(&store, "round-trip", &out, RestoreOptions::default());
    assert!(matches!(again, Err(SnapshotError::TargetExists { .. })), "{again:?}");
    let missing = restore(&store, "nope", &tmp.path().join("x"), RestoreOptions::default());
    assert!(matches!(missing, Err(SnapshotError::NotFound { .. })), "{missing:?}");
}

#[test]
fn second_snapshot_after_one_percent_change_uploads_a_small_fraction() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("small")).unwrap();
    let mut rng = Rng(7);
    for i in 0..12 {
        fs::write(src.join(format!("big{i}.bin")), rng.bytes(5_000_000)).unwrap();
    }
    for i in 0..200 {
        fs::write(src.join(format!("small/f{i}")), rng.bytes(10_000)).unwrap();
    }
    let store = common::local_store(&tmp.path().join("store")).without_fsync();
    let first = snapshot(&src, &store, SnapshotOptions::new("one")).unwrap().summary.stats;
    assert_eq!(first.bytes_uploaded, first.logical_bytes, "random data: everything is new");

    // ~1 %: 600 kB overwritten in the middle of one big file, and one small file rewritten.
    let big = src.join("big5.bin");
    let mut data = fs::read(&big).unwrap();
    data[2_000_000..2_600_000].copy_from_slice(&rng.bytes(600_000));
    fs::write(&big, data).unwrap();
    fs::write(src.join("small/f3"), rng.bytes(10_000)).unwrap();

    let second = snapshot(&src, &store, SnapshotOptions::new("two")).unwrap().summary.stats;
    let fraction = second.bytes_uploaded as f64 / second.logical_bytes as f64;
    eprintln!(
        "incremental: uploaded {} of {} bytes ({:.2} %), {} chunks uploaded, {} reused, dedup {:.1}x",
        second.bytes_uploaded,
        second.logical_bytes,
        fraction * 100.0,
        second.chunks_uploaded,
        second.chunks_reused,
        second.dedup_ratio()
    );
    assert!(second.bytes_uploaded >= 610_000, "the changed bytes were uploaded");
    assert!(fraction < 0.06, "uploaded {:.2} % of the data after a 1 % change", fraction * 100.0);
    assert!(second.chunks_reused > second.chunks_uploaded * 10);
    assert!(second.dedup_ratio() > 20.0);
    assert_eq!(list(&store).unwrap().iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["one", "two"]);

    let out = tmp.path().join("out");
    restore(&store, "two", &out, RestoreOptions::default()).unwrap();
    assert_same_tree(&src, &out);
}

fn one_chunk_tree(tmp: &std::path::Path) -> (LocalStore, String) {
    let src = tmp.join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a"), Rng(3).bytes(3_000_000)).unwrap();
    fs::write(src.join("b"), b"small").unwrap();
    let store = common::local_store(&tmp.join("store"));
    snapshot(&src, &store, SnapshotOptions::new("s")).unwrap();
    let chunk = keys(&store, "chunks/")[0].clone();
    (store, chunk)
}

#[test]
fn corrupted_chunk_is_detected_and_nothing_is_left_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, key) = one_chunk_tree(tmp.path());
    let path = store.root().join(&key);
    let mut bytes = fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    fs::write(&path, bytes).unwrap();
    let out = tmp.path().join("out");
    let err = restore(&store, "s", &out, RestoreOptions::default()).unwrap_err();
    let SnapshotError::CorruptChunk { chunk, reason } = &err else { panic!("{err:?}") };
    assert_eq!(format!("chunks/{chunk}"), key, "{reason}");
    assert!(err.to_string().contains(chunk.as_str()));
    assert!(!out.exists());
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 2, "only src and store remain");
}

#[test]
fn missing_chunk_is_detected() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, key) = one_chunk_tree(tmp.path());
    fs::remove_file(store.root().join(&key)).unwrap();
    let out = tmp.path().join("out");
    let err = restore(&store, "s", &out, RestoreOptions::default()).unwrap_err();
    let SnapshotError::MissingChunk { chunk } = &err else { panic!("{err:?}") };
    assert_eq!(format!("chunks/{chunk}"), key);
    assert!(!out.exists());
}

/// The chunk names file `path` has in stored manifest `id`: (hash, hex digest, length).
fn chunk_names(store: &LocalStore, id: &str, path: &str) -> (u64, Vec<(String, String, usize)>) {
    let text = fs::read(store.root().join(format!("manifests/{id}.json"))).unwrap();
    let env: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let entry = env["manifest"]["entries"].as_array().unwrap().iter().find(|e| e["path"] == path).unwrap().clone();
    let names = entry["chunks"].as_array().unwrap().iter().map(|c| {
        let (hash, hex) =
            ["sha256", "blake3"].iter().find_map(|h| Some((h.to_string(), c.get(*h)?.as_str()?.to_string()))).unwrap();
        (hash, hex, c["len"].as_u64().unwrap() as usize)
    });
    (env["version"].as_u64().unwrap(), names.collect())
}

/// A store written by the builds before BLAKE3 (chunks named by sha256)
/// keeps restoring beside the snapshots this build writes, named by BLAKE3;
/// each chunk is checked against the hash that named it.
#[test]
fn sha256_and_blake3_snapshots_share_a_store() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let data = Rng(5).bytes(3_000_000);
    fs::write(src.join("a"), &data).unwrap();
    let store = common::local_store(&tmp.path().join("store"));
    let mut old = SnapshotOptions::new("old");
    old.chunking.hash = ChunkHash::Sha256;
    snapshot(&src, &store, old).unwrap();
    let new = snapshot(&src, &store, SnapshotOptions::new("new")).unwrap().summary.stats;
    assert_eq!(new.bytes_reused, 0, "other names: the same chunks stored once more");

    let digest = |hash: &str, bytes: &[u8]| match hash {
        "sha256" => hex::encode(ChunkHash::Sha256.digest(bytes)),
        _ => hex::encode(blake3::hash(bytes).as_bytes()),
    };
    let mut objects = Vec::new();
    for (id, want, version) in [("old", "sha256", 1), ("new", "blake3", 3)] {
        let (found, names) = chunk_names(&store, id, "a");
        assert_eq!(found, version, "{id}");
        let mut at = 0;
        for (hash, hex, len) in names {
            assert_eq!(hash, want, "{id}");
            assert_eq!(hex, digest(&hash, &data[at..at + len]), "{id}: the chunk at {at} is named by its bytes");
            at += len;
            objects.push(format!("chunks/{hex}"));
        }
        assert_eq!(at, data.len());
        let out = tmp.path().join(format!("out-{id}"));
        restore(&store, id, &out, RestoreOptions::default()).unwrap();
        assert_same_tree(&src, &out);
    }
    objects.sort();
    assert_eq!(keys(&store, "chunks/"), objects, "each snapshot's chunks under their own names");

    for id in ["old", "new"] {
        let key = format!("chunks/{}", chunk_names(&store, id, "a").1[0].1);
        let path = store.root().join(&key);
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x55;
        fs::write(&path, bytes).unwrap();
        let err = restore(&store, id, &tmp.path().join(format!("bad-{id}")), RestoreOptions::default()).unwrap_err();
        let SnapshotError::CorruptChunk { chunk, .. } = &err else { panic!("{id}: {err:?}") };
        assert_eq!(format!("chunks/{chunk}"), key, "{id}");
    }
}
