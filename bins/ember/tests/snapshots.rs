//! Workspace snapshots through the daemon: consistent (the writer is frozen),
//! incremental, restorable and forkable; a fenced writer cannot commit; a daemon
//! killed mid-snapshot leaves no half snapshot.
mod common;

use common::Daemon;
use ember_types::api::WorkspaceMountSpec;
use ember_types::execd::RunCommandRequest;
use std::time::Duration;

fn mount(name: &str) -> WorkspaceMountSpec {
    WorkspaceMountSpec { name: name.into(), ..Default::default() }
}

const VERIFY: &str = "n=0; while read -r i c; do n=$((n+1)); [ \"$i\" = \"$n\" ] || exit 1; \
    [ \"$c\" = \"$(echo rec$i | md5sum | cut -c1-8)\" ] || exit 2; done < /workspace/log; echo $n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_of_a_live_writer_is_consistent_incremental_restorable_and_forkable() {
    let d = Daemon::start();
    d.client.create_workspace("src", "64Mi").await.expect("workspace");
    let w = d.create(|r| r.workspaces = vec![mount("src")]).await;
    let (code, _, _) = d
        .sh(
            &w.id,
            "head -c 8000000 /dev/urandom > /workspace/blob; mkdir -p /workspace/d && echo x > /workspace/d/small",
            None,
        )
        .await;
    assert_eq!(code, Some(0));
    let writer = RunCommandRequest {
        command: Some(
            "i=0; while :; do i=$((i+1)); echo \"$i $(echo rec$i | md5sum | cut -c1-8)\" >> /workspace/log; done"
                .into(),
        ),
        background: true,
        ..Default::default()
    };
    d.client.exec(&w.id, &writer, |_| {}).await.expect("writer");
    tokio::time::sleep(Duration::from_millis(300)).await;

    let first = d.client.snapshot_workspace("src", None).await.expect("snapshot");
    assert_eq!(first.workspace, "src");
    assert!(first.logical_bytes >= 8_000_000 && first.files >= 3, "{first:?}");
    assert_eq!(d.client.get_sandbox(&w.id).await.expect("writer").status.state, "Running", "the writer was thawed");

    let (code, _, _) = d.sh(&w.id, "echo more > /workspace/d/small2", None).await;
    assert_eq!(code, Some(0));
    let second = d.client.snapshot_workspace("src", None).await.expect("second snapshot");
    assert!(
        second.stored_bytes_uploaded * 10 < first.stored_bytes_uploaded,
        "not incremental: {first:?} then {second:?}"
    );
    assert!(second.chunks_reused >= 1 && second.dedup_ratio > 5.0, "{second:?}");

    // The restored log was taken while the writer was frozen: no torn record.
    d.client.restore_snapshot(&first.id, "copy", None).await.expect("restore");
    let r = d.create(|r| r.workspaces = vec![mount("copy")]).await;
    let (code, out, _) = d.sh(&r.id, VERIFY, None).await;
    assert_eq!(code, Some(0), "the snapshot holds a torn or damaged record: {out}");
    assert!(out.trim().parse::<u64>().expect("count") > 0);
    let (_, sum_copy, _) = d.sh(&r.id, "md5sum < /workspace/blob", None).await;
    let (_, sum_src, _) = d.sh(&w.id, "md5sum < /workspace/blob", None).await;
    assert_eq!(sum_copy, sum_src);

    let forks = d.client.fork_snapshot(&second.id, 3, "child").await.expect("fork");
    assert_eq!(forks.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(), ["child-1", "child-2", "child-3"]);
    let c = d.create(|r| r.workspaces = vec![mount("child-3")]).await;
    let (_, out, _) = d.sh(&c.id, "cat /workspace/d/small2; stat -c %U /workspace/blob", None).await;
    assert_eq!(out, "more\nsandbox\n", "content and ownership restored");

    let listed = d.client.list_snapshots(Some("src")).await.expect("list");
    assert_eq!(listed.len(), 2);
    d.client.delete_snapshot(&first.id).await.expect("delete");
    let e = d.client.get_snapshot(&first.id).await.expect_err("deleted").to_string();
    assert!(e.contains("SNAPSHOT::NOT_FOUND"), "{e}");
    let e = d.client.restore_snapshot("nope", "x", None).await.expect_err("unknown").to_string();
    assert!(e.contains("SNAPSHOT::NOT_FOUND"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_writer_cannot_commit_a_snapshot_after_takeover() {
    let d = Daemon::start();
    d.client.create_workspace("f", "32Mi").await.expect("workspace");
    let a = d.create(|r| r.workspaces = vec![mount("f")]).await;
    let b = d.create(|r| r.workspaces = vec![WorkspaceMountSpec { steal: true, ..mount("f") }]).await;
    let e = d.client.snapshot_workspace("f", Some((&a.id, 1))).await.expect_err("fenced").to_string();
    assert!(e.contains("WORKSPACE::FENCED"), "{e}");
    assert!(d.client.list_snapshots(Some("f")).await.expect("list").is_empty(), "nothing was committed");
    let ok = d.client.snapshot_workspace("f", Some((&b.id, 2))).await.expect("current writer commits");
    assert_eq!(ok.epoch, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_mid_snapshot_leaves_no_half_snapshot_and_thaws_the_writer() {
    let mut d = Daemon::start();
    let w = d.big_writer("").await;
    let client = d.client.clone();
    let snap = tokio::spawn(async move { client.snapshot_workspace("big", None).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    d.kill9();
    let _ = snap.await;
    d.spawn();
    // Every snapshot that exists is complete: each restores with every chunk verified.
    for s in d.client.list_snapshots(Some("big")).await.expect("list") {
        let name = format!("r-{}", s.id.len());
        d.client.restore_snapshot(&s.id, &name, None).await.expect("a listed snapshot restores");
    }
    let state = d.client.get_sandbox(&w.id).await.expect("writer").status.state;
    assert_eq!(state, "Running", "the writer frozen for the interrupted snapshot was thawed");
    let s = d.client.snapshot_workspace("big", None).await.expect("a new snapshot after the restart");
    assert!(s.logical_bytes >= 240_000_000);
}

/// A snapshot runs to its end whoever waits for it: its caller gone
/// mid-snapshot (a client's disconnect; in a cluster a forwarded call's
/// deadline) left the writer frozen for good and the operation running
/// (the 300-session drill's runs CD and CQ: six sessions hung on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_whose_caller_goes_away_runs_to_its_end_and_thaws_the_writer() {
    let d = Daemon::start();
    let w = d.big_writer("").await;
    let client = d.client.clone();
    let snap = tokio::spawn(async move { client.snapshot_workspace("big", None).await });
    d.abort_when_frozen(&w.id, snap).await;
    let cg = d.cgroups();
    let frozen = || cg.is_frozen(&w.id).expect("freezer state");
    let mut tries = 0;
    let op = loop {
        let ops = d.client.snapshot_operations().await.expect("operations");
        let op = ops.into_iter().find(|o| o.target == "big").expect("the snapshot's operation");
        if op.finished_at.is_some() {
            break op;
        }
        tries += 1;
        assert!(
            tries < 1200,
            "the operation never finished after its caller went away (writer frozen: {}): {op:?}",
            frozen()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(op.phase, "done", "{op:?}");
    assert_eq!(d.client.list_snapshots(Some("big")).await.expect("list").len(), 1, "it was committed");
    assert!(!frozen(), "the writer was left frozen");
    let (code, out, _) = d.sh(&w.id, "echo alive", None).await;
    assert_eq!((code, out.as_str()), (Some(0), "alive\n"));
}

/// Stored bytes of every chunk in the daemon's local snapshot store: the
/// chunks of their own and the packs of small ones.
fn chunk_bytes(d: &Daemon) -> u64 {
    fn walk(dir: &std::path::Path) -> u64 {
        let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
        entries.map(|e| if e.path().is_dir() { walk(&e.path()) } else { e.metadata().map_or(0, |m| m.len()) }).sum()
    }
    walk(&d.data_dir.join("snapshots/chunks")) + walk(&d.data_dir.join("snapshots/packs"))
}

/// Snapshots are deleted and swept while others are being written: every
/// sweep and every write succeeds (the sweep waits for the writes in flight),
/// every remaining snapshot restores byte for byte, and the store shrinks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_during_snapshot_writes_keeps_every_remaining_snapshot_restorable() {
    const BLOB: usize = 3 << 20;
    let d = Daemon::start();
    let mut blobs = Vec::new();
    for i in 0..5 {
        let name = format!("w{i}");
        d.client.create_workspace(&name, "64Mi").await.expect("workspace");
        // Random bytes: no chunk is shared between workspaces, none compresses.
        let mut blob = vec![0u8; BLOB];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").expect("urandom"), &mut blob).expect("read");
        std::fs::write(d.data_dir.join("workspaces").join(&name).join("mnt/blob"), &blob).expect("write blob");
        blobs.push(blob);
    }
    let mut old = Vec::new();
    for i in 0..3 {
        old.push(d.client.snapshot_workspace(&format!("w{i}"), None).await.expect("snapshot").id);
    }
    let three = chunk_bytes(&d);
    assert!(three >= 3 * BLOB as u64, "three blobs stored: {three}");

    let (c, s0, s1) = (&d.client, old[0].clone(), old[1].clone());
    let deletes_and_sweeps = async {
        let mut freed = 0;
        for id in [s0, s1] {
            c.delete_snapshot(&id).await.expect("delete");
            freed += c.gc_snapshots(Some(0)).await.expect("gc while snapshots are written").bytes_deleted;
        }
        freed
    };
    let writes = async {
        let mut ids = Vec::new();
        for i in 3..5 {
            ids.push(c.snapshot_workspace(&format!("w{i}"), None).await.expect("snapshot during gc").id);
        }
        ids
    };
    let sweeps = async {
        for _ in 0..3 {
            c.gc_snapshots(Some(0)).await.expect("gc");
        }
    };
    let (freed, new, ()) = tokio::join!(deletes_and_sweeps, writes, sweeps);
    let last = c.gc_snapshots(Some(0)).await.expect("final gc");
    assert!(last.missing_chunks.is_empty(), "a sweep removed a live chunk: {last:?}");
    assert_eq!(last.chunks_seen, last.chunks_referenced, "every unreferenced chunk is gone: {last:?}");
    let now = chunk_bytes(&d);
    // Three snapshots remain (old[2] and the two new ones), as before the deletes.
    assert!(now <= three + (64 << 10), "deleted snapshots' chunks were reclaimed: {three} then {now}, freed {freed}");

    let remaining = [(old[2].clone(), 2), (new[0].clone(), 3), (new[1].clone(), 4)];
    for (id, i) in remaining {
        let copy = format!("copy{i}");
        c.restore_snapshot(&id, &copy, None).await.unwrap_or_else(|e| panic!("restore {id}: {e}"));
        let got = std::fs::read(d.data_dir.join("workspaces").join(&copy).join("mnt/blob")).expect("restored blob");
        assert!(got == blobs[i], "snapshot {id} restored different bytes");
    }

    c.delete_snapshot(&old[2]).await.expect("delete");
    let r = c.gc_snapshots(Some(0)).await.expect("gc");
    let after = chunk_bytes(&d);
    assert!(r.bytes_deleted >= BLOB as u64 && after + BLOB as u64 <= now, "the store shrank: {now} then {after}");
}

/// A restore into a workspace smaller than the snapshot's data is refused
/// before anything is written, naming both sizes (before, the requested size
/// was silently raised to fit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_smaller_than_the_snapshots_data_is_refused_up_front() {
    let d = Daemon::start();
    d.client.create_workspace("big", "64Mi").await.expect("workspace");
    let w = d.create(|r| r.workspaces = vec![mount("big")]).await;
    let (code, _, err) = d.sh(&w.id, "head -c 24000000 /dev/urandom > /workspace/blob", None).await;
    assert_eq!(code, Some(0), "{err}");
    let snap = d.client.snapshot_workspace("big", None).await.expect("snapshot");
    let e = d.client.restore_snapshot(&snap.id, "small", Some("16Mi")).await.expect_err("refused").to_string();
    assert!(e.starts_with("SNAPSHOT::TOO_LARGE:") && e.ends_with("(HTTP 422)"), "{e}");
    assert!(e.contains("24000000 bytes") && e.contains(&(16u64 << 20).to_string()), "{e}");
    let gone = d.client.get_workspace("small").await.expect_err("no workspace left behind").to_string();
    assert!(gone.contains("WORKSPACE::NOT_FOUND"), "{gone}");
    d.client.restore_snapshot(&snap.id, "fits", Some("48Mi")).await.expect("a quota the data fits in");
}

/// The chunk hash of each snapshot manifest in `d`'s store, and its version.
fn manifest_hashes(d: &Daemon, id: &str) -> (u64, Vec<String>) {
    let text = std::fs::read(d.data_dir.join(format!("snapshots/manifests/{id}.json"))).expect("manifest");
    let env: serde_json::Value = serde_json::from_slice(&text).expect("json");
    let mut hashes: Vec<String> = env["manifest"]["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["chunks"].as_array())
        .flatten()
        .map(|c| ["sha256", "blake3"].iter().find(|h| c.get(**h).is_some()).expect("a chunk name").to_string())
        .collect();
    hashes.dedup();
    (env["version"].as_u64().expect("version"), hashes)
}

/// A daemon told `--snapshot-hash sha256` writes what the builds before
/// BLAKE3 read (a rolling upgrade of a cluster); by default chunks are
/// named by BLAKE3 (manifest version 3). Both restore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chunk_hash_follows_the_daemons_flag_and_both_kinds_restore() {
    for (flag, version, hash) in [(None, 3, "blake3"), (Some("sha256"), 2, "sha256")] {
        let d = match flag {
            Some(h) => Daemon::start_with(&["--snapshot-hash", h]),
            None => Daemon::start(),
        };
        d.client.create_workspace("w", "64Mi").await.expect("workspace");
        let w = d.create(|r| r.workspaces = vec![mount("w")]).await;
        let script = "head -c 3000000 /dev/urandom > /workspace/big; echo small > /workspace/small; \
                      md5sum /workspace/big /workspace/small | cut -c1-32";
        let (code, sums, _) = d.sh(&w.id, script, None).await;
        assert_eq!(code, Some(0));
        let snap = d.client.snapshot_workspace("w", None).await.expect("snapshot");
        assert_eq!(manifest_hashes(&d, &snap.id), (version, vec![hash.to_string()]), "{flag:?}");
        d.client.restore_snapshot(&snap.id, "copy", None).await.expect("restore");
        let r = d.create(|r| r.workspaces = vec![mount("copy")]).await;
        let (code, again, _) = d.sh(&r.id, "md5sum /workspace/big /workspace/small | cut -c1-32", None).await;
        assert_eq!((code, again), (Some(0), sums), "{flag:?}: the restore holds the same bytes");
    }
}
