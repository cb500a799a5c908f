//! The S3 path against a real S3-protocol server on loopback: moto's server
//! mode, from the venv that `scripts/test.sh` creates (`.venv` at the
//! workspace root, or `EMBER_MOTO_SERVER` naming the `moto_server` binary).
mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_same_tree, keys, mixed_tree};
use ember_snapshot::{
    delete, gc, inspect, list, restore, snapshot, GcOptions, ObjectStore, RestoreOptions, S3Config, S3Store,
    SnapshotOptions,
};

/// Kills the server when the test ends, passing or not.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn moto_server() -> PathBuf {
    let path = std::env::var_os("EMBER_MOTO_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/moto_server"));
    assert!(
        path.exists(),
        "moto_server not found at {}: the S3 test needs it. Create it with \
         `python3 -m venv .venv && .venv/bin/pip install 'moto[server]'` at the workspace root \
         (scripts/test.sh does this), or set EMBER_MOTO_SERVER",
        path.display()
    );
    path
}

fn start() -> (Server, u16) {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(moto_server())
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("moto_server starts");
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "moto_server did not listen on {port} within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    (server, port)
}

/// CreateBucket through the S3 API (moto does not check signatures). A
/// server that has just begun to listen can reset the first connection (seen
/// once in CI: ECONNRESET while its app was still loading), so an I/O error is
/// retried for up to 30 s; any reply but 200 fails at once.
fn create_bucket(port: u16, bucket: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match try_create_bucket(port, bucket) {
            Ok(reply) => {
                assert!(reply.starts_with("HTTP/1.1 200"), "CreateBucket: {reply}");
                return;
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("CreateBucket on {port}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("CreateBucket on {port} failed for 30 s: {e}"),
        }
    }
}

fn try_create_bucket(port: u16, bucket: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    let req =
        format!("PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    Ok(reply)
}

/// Bucket `bucket` under `prefix` of the moto server on `port`, with a key of its own.
fn open(port: u16, bucket: &str, prefix: &str) -> S3Store {
    create_bucket(port, bucket);
    S3Store::open(
        S3Config {
            endpoint: format!("http://127.0.0.1:{port}"),
            bucket: bucket.into(),
            region: "us-east-1".into(),
            access_key_id: "test".into(),
            secret_access_key: "test".into(),
            prefix: prefix.into(),
            allow_http: true,
        },
        ember_snapshot::ManifestKey::ephemeral(),
    )
    .unwrap()
}

#[test]
fn s3_store_passes_the_store_conformance_suite() {
    let (_server, port) = start();
    let store = open(port, "ember-conformance", "snapshots");
    let tmp = tempfile::tempdir().unwrap();
    ember_snapshot::conformance::run_all(&store, tmp.path());
}

#[test]
fn snapshot_and_restore_through_s3_on_loopback() {
    let (_server, port) = start();
    let store = open(port, "ember-test", "snapshots");
    assert!(!store.exists("chunks/none").unwrap());
    assert!(store.get("chunks/none").unwrap_err().is_not_found());

    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    mixed_tree(&src);
    let first = snapshot(&src, &store, SnapshotOptions::new("s3-one").label("workspace", "w")).unwrap();
    // The same workspace's next snapshot (small files' packs are reused within a workspace).
    let again = snapshot(&src, &store, SnapshotOptions::new("s3-two").label("workspace", "w")).unwrap();
    assert_eq!(again.summary.stats.chunks_uploaded, 0, "unchanged tree: every chunk reused");
    assert_eq!(list(&store).unwrap().len(), 2);
    assert_eq!(inspect(&store, "s3-one").unwrap().stats, first.summary.stats);

    let out = tmp.path().join("out");
    restore(&store, "s3-two", &out, RestoreOptions::default()).unwrap();
    assert_same_tree(&src, &out);

    delete(&store, "s3-one").unwrap();
    let report = gc(&store, GcOptions { min_age: Duration::ZERO, ..GcOptions::default() }).unwrap();
    assert_eq!((report.manifests, report.chunks_deleted), (1, 0), "s3-two references every chunk");
    store.put("chunks/orphan", b"x").unwrap();
    let report = gc(&store, GcOptions { min_age: Duration::ZERO, ..GcOptions::default() }).unwrap();
    assert_eq!(report.chunks_deleted, 1);
    assert!(keys(&store, "locks/").is_empty() && keys(&store, "pending/").is_empty());

    // Usable, and droppable, on another runtime's thread (the engine may slip).
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async move {
        assert!(store.exists(&keys(&store, "manifests/")[0]).unwrap());
        drop(store);
    });
}
