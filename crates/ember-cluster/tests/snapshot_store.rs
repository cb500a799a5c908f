//! The snapshot store on the JetStream object store (`NatsStore`), on a
//! real 3-server cluster (`tests/common/`): the conformance suite every
//! store backend passes (objects, snapshots, restore, gc, a forged
//! manifest refused), reads through the stream leader's SIGKILL, and the
//! cap on what a read takes in.
mod common;

use common::NatsCluster;
use ember_cluster::{NatsBucket, NatsStoreConfig};
use ember_snapshot::{restore, snapshot, ManifestKey, ObjectStore, RestoreOptions, SnapshotOptions, StoreError};

const STREAM: &str = "OBJ_ember_snapshots";

fn bucket(urls: Vec<String>, max_object: u64) -> NatsBucket {
    let cfg = NatsStoreConfig { max_object, ..NatsStoreConfig::new(urls) };
    NatsBucket::connect(cfg).expect("connect to the bucket")
}

#[test]
fn jetstream_object_store_passes_the_store_conformance_suite() {
    let cluster = NatsCluster::start("objconf", 3);
    let store = bucket(cluster.urls(), ember_snapshot::MAX_OBJECT_BYTES).store(ManifestKey::ephemeral());
    let tmp = tempfile::tempdir().expect("tempdir");
    ember_snapshot::conformance::run_all(&store, tmp.path());
    let info = common::request(&cluster.urls(), &format!("$JS.API.STREAM.INFO.{STREAM}")).expect("stream info");
    assert_eq!(info["config"]["num_replicas"], 3, "R3 on three servers: {info}");
    assert_eq!(info["config"]["allow_direct"], false, "reads from the leader: {info}");
}

/// The stream's leader is SIGKILLed; the reads that follow at once (a
/// restore: its manifest, then every chunk) and a put ride out the
/// election: latency, never an error.
#[test]
fn a_restore_survives_the_stream_leaders_sigkill() {
    let mut cluster = NatsCluster::start("objkill", 3);
    let key = ManifestKey::ephemeral();
    let store = bucket(cluster.urls(), ember_snapshot::MAX_OBJECT_BYTES).store(key);
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    ember_snapshot::conformance::small_tree(&src);
    snapshot(&src, &store, SnapshotOptions::new("before")).expect("snapshot");

    let leader = cluster.stream_leader(STREAM);
    cluster.kill(&leader);
    let killed = std::time::Instant::now();
    let out = tmp.path().join("out");
    restore(&store, "before", &out, RestoreOptions::default()).expect("a restore through the election");
    eprintln!("restore after the leader's SIGKILL took {:?}", killed.elapsed());
    ember_snapshot::conformance::assert_same_tree(&src, &out);
    store.put("chunks/after", b"written after the election").expect("a put after the election");
    assert_eq!(store.get("chunks/after").expect("get"), b"written after the election");
    assert_ne!(cluster.stream_leader(STREAM), leader, "a new leader");
}

/// A get takes the object's size from its metadata and refuses one over
/// the cap before reading it; a put over the cap writes nothing.
#[test]
fn a_get_over_the_cap_is_refused_before_reading() {
    let cluster = NatsCluster::start("objcap", 3);
    let key = ManifestKey::ephemeral();
    let roomy = bucket(cluster.urls(), 4 << 20).store(key.clone());
    let tight = bucket(cluster.urls(), 1 << 20).store(key);
    let big = vec![7u8; 2 << 20];
    roomy.put("chunks/big", &big).expect("put under the roomy cap");
    let err = tight.get("chunks/big").expect_err("over the cap");
    assert!(matches!(err, StoreError::TooLarge { size, limit, .. } if size == 2 << 20 && limit == 1 << 20), "{err:?}");
    let err = tight.put("chunks/other", &big).expect_err("over the cap");
    assert!(matches!(err, StoreError::TooLarge { .. }), "{err:?}");
    assert!(!tight.exists("chunks/other").expect("exists"));
    assert!(roomy.get("chunks/big").expect("get") == big);
}

/// An object of one part is read from its part's subject directly (two
/// requests, no consumer): the bytes found there must still match the
/// object's digest. Here a message of other bytes, the same length, is
/// appended to the part's subject, so it is the last one there: the get
/// refuses it rather than handing back what the digest does not vouch for.
#[test]
fn a_one_part_object_whose_part_does_not_match_its_digest_is_refused() {
    let cluster = NatsCluster::start("objdigest", 3);
    let store = bucket(cluster.urls(), ember_snapshot::MAX_OBJECT_BYTES).store(ManifestKey::ephemeral());
    store.put("chunks/x", b"hello").expect("put");
    assert_eq!(store.get("chunks/x").expect("get"), b"hello");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let client = async_nats::ConnectOptions::new().connect(cluster.urls().as_slice()).await.expect("connect");
        let js = async_nats::jetstream::new(client);
        let objects = js.get_object_store("ember_snapshots").await.expect("bucket");
        let nuid = objects.info("chunks/x").await.expect("info").nuid;
        let ack = js.publish(format!("$O.ember_snapshots.C.{nuid}"), "HELLO".into()).await.expect("publish");
        ack.await.expect("stored");
    });
    let err = store.get("chunks/x").expect_err("bytes that do not match the digest");
    assert!(matches!(&err, StoreError::Backend { reason, .. } if reason.contains("digest")), "{err:?}");
}

/// The part messages the bucket's stream holds, by subject.
fn parts_held(urls: &[String]) -> serde_json::Value {
    let body = r#"{"subjects_filter":"$O.ember_snapshots.C.>"}"#;
    let info = common::request_with(urls, &format!("$JS.API.STREAM.INFO.{STREAM}"), body).expect("stream info");
    info["state"]["subjects"].clone()
}

/// Two processes (two connections, each remembering its own writes) write,
/// replace and delete the same names, each write's guess of what is there
/// wrong in turn: every replaced or deleted object's parts are purged, none
/// left unreachable, and every read sees the last write.
#[test]
fn objects_replaced_by_another_writer_leave_no_parts_behind() {
    let cluster = NatsCluster::start("objrace", 3);
    let key = ManifestKey::ephemeral();
    let a = bucket(cluster.urls(), ember_snapshot::MAX_OBJECT_BYTES).store(key.clone());
    let b = bucket(cluster.urls(), ember_snapshot::MAX_OBJECT_BYTES).store(key);
    a.put_new("chunks/k", b"from a").expect("a's put_new");
    b.put_new("chunks/k", b"from b").expect("b's put_new: guessed absent, was not");
    assert_eq!(a.get("chunks/k").expect("get"), b"from b");
    a.put("chunks/k", b"from a again").expect("a's put: remembers its own write, replaced since");
    assert_eq!(b.get("chunks/k").expect("get"), b"from a again");
    b.delete("chunks/k").expect("b's delete: remembers its own write, replaced since");
    assert!(a.get("chunks/k").expect_err("deleted").is_not_found());
    a.put("chunks/m", b"marker").expect("put");
    b.put("chunks/m", b"marker, b").expect("put");
    a.delete("chunks/m").expect("a's delete of b's object");
    assert!(!b.exists("chunks/m").expect("exists"));
    assert_eq!(parts_held(&cluster.urls()), serde_json::Value::Null, "no part left behind");
}

/// What one snapshot of a one-file tree into an empty bucket asks of the
/// servers, counted by a subscriber on the same server as the store's
/// connection: 2 lookups (the manifest's name, the gc lock), 4 metadata
/// messages (the marker, the pack, the manifest, the marker's tombstone), 2
/// parts (the pack, the manifest), no purge. The library's put and delete
/// made it 7 lookups, 3 parts and a purge; a chunk of its own instead of a
/// pack, 3 lookups (its own).
#[test]
fn a_snapshot_asks_the_servers_as_little_as_it_can() {
    use futures_util::{FutureExt, StreamExt};
    let cluster = NatsCluster::start("objcount", 3);
    let url = vec![cluster.urls()[0].clone()];
    let store = bucket(url.clone(), ember_snapshot::MAX_OBJECT_BYTES).store(ManifestKey::ephemeral());
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    std::fs::write(src.join("a"), b"one small file, one chunk").expect("write");

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let client = rt.block_on(async_nats::connect(url[0].as_str())).expect("connect the tap");
    let subjects = [
        "$JS.API.STREAM.MSG.GET.OBJ_ember_snapshots",
        "$JS.API.STREAM.PURGE.OBJ_ember_snapshots",
        "$O.ember_snapshots.M.>",
        "$O.ember_snapshots.C.>",
        "tap.end",
    ];
    let mut subs: Vec<_> = subjects.iter().map(|s| rt.block_on(client.subscribe(*s)).expect("subscribe")).collect();
    rt.block_on(client.flush()).expect("flush");

    snapshot(&src, &store, SnapshotOptions::new("counted")).expect("snapshot");

    // Every message the store's requests made reached this connection
    // before the one it sends now (one server, one connection's order).
    rt.block_on(async {
        client.publish("tap.end", "".into()).await.expect("publish");
        subs[4].next().await.expect("the end of the tap");
    });
    let counts: Vec<usize> =
        subs[..4].iter_mut().map(|sub| std::iter::from_fn(|| sub.next().now_or_never().flatten()).count()).collect();
    assert_eq!(counts, [2, 0, 4, 2], "lookups, purges, metadata messages, parts");
}
