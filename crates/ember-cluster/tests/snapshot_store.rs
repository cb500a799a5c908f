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

/// Counts the messages on `subjects` that one server sees, from a
/// connection of its own to it.
struct Tap {
    rt: tokio::runtime::Runtime,
    client: async_nats::Client,
    subs: Vec<async_nats::Subscriber>,
}

impl Tap {
    fn new(url: &str, subjects: &[&str]) -> Tap {
        use futures_util::StreamExt;
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        let client = rt.block_on(async_nats::connect(url)).expect("connect the tap");
        let mut subs: Vec<_> =
            subjects.iter().map(|s| rt.block_on(client.subscribe(s.to_string())).expect("subscribe")).collect();
        let mut end = rt.block_on(client.subscribe("tap.end")).expect("subscribe");
        // The server has the tap's subscriptions once it echoes a message
        // sent after them (a flush only writes them out: a store's first
        // lookup, on another connection, was seen to overtake them under load).
        rt.block_on(async {
            client.publish("tap.end", "begin".into()).await.expect("publish");
            end.next().await.expect("the start of the tap");
        });
        subs.push(end);
        Tap { rt, client, subs }
    }

    /// How many messages each subject saw so far: every message the other
    /// connections of the server sent before this call has reached the tap
    /// before the one it sends now (one server, one connection's order).
    fn counts(&mut self) -> Vec<usize> {
        use futures_util::{FutureExt, StreamExt};
        let Tap { rt, client, subs } = self;
        let (end, counted) = subs.split_last_mut().expect("the end's subscription");
        rt.block_on(async {
            client.publish("tap.end", "".into()).await.expect("publish");
            end.next().await.expect("the end of the tap");
        });
        counted.iter_mut().map(|sub| std::iter::from_fn(|| sub.next().now_or_never().flatten()).count()).collect()
    }
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
    let cluster = NatsCluster::start("objcount", 3);
    let url = vec![cluster.urls()[0].clone()];
    let store = bucket(url.clone(), ember_snapshot::MAX_OBJECT_BYTES).store(ManifestKey::ephemeral());
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    std::fs::write(src.join("a"), b"one small file, one chunk").expect("write");
    let mut tap = Tap::new(
        &url[0],
        &[
            "$JS.API.STREAM.MSG.GET.OBJ_ember_snapshots",
            "$JS.API.STREAM.PURGE.OBJ_ember_snapshots",
            "$O.ember_snapshots.M.>",
            "$O.ember_snapshots.C.>",
        ],
    );
    snapshot(&src, &store, SnapshotOptions::new("counted")).expect("snapshot");
    assert_eq!(tap.counts(), [2, 0, 4, 2], "lookups, purges, metadata messages, parts");
}

/// An object of several parts is read by one request for its metadata and
/// one per part, every one to the stream's leader, no consumer made; a
/// message added to its parts' subject after them is not read.
#[test]
fn an_object_of_several_parts_is_read_without_a_consumer() {
    let cluster = NatsCluster::start("objparts", 3);
    let url = vec![cluster.urls()[0].clone()];
    let store = bucket(url.clone(), ember_snapshot::MAX_OBJECT_BYTES).store(ManifestKey::ephemeral());
    let data: Vec<u8> = (0..(3 << 19) + 5).map(|i: u32| (i % 251) as u8).collect();
    store.put("chunks/three", &data).expect("put");
    let nuid = object_nuid(&cluster, "chunks/three");
    publish_part(&cluster, &nuid, b"not a part");
    let mut tap = Tap::new(&url[0], &["$JS.API.STREAM.MSG.GET.OBJ_ember_snapshots", "$JS.API.CONSUMER.>"]);
    assert!(store.get("chunks/three").expect("get") == data, "the object's bytes");
    assert_eq!(tap.counts(), [1 + 4, 0], "lookups (metadata, 4 parts), consumer requests");
}

/// A part's bytes replaced by others of the same length (the message
/// purged, another published in its place): the get refuses what the
/// object's digest does not vouch for, whether of one part or of several.
#[test]
fn an_object_whose_parts_do_not_match_its_digest_is_refused() {
    let cluster = NatsCluster::start("objdigest", 3);
    let store = bucket(cluster.urls(), ember_snapshot::MAX_OBJECT_BYTES).store(ManifestKey::ephemeral());
    let big = vec![3u8; (1 << 20) + 1];
    for (key, data) in [("chunks/x", &b"hello"[..]), ("chunks/big", &big[..])] {
        store.put(key, data).expect("put");
        assert!(store.get(key).expect("get") == data);
        let nuid = object_nuid(&cluster, key);
        let subject = format!("$O.ember_snapshots.C.{nuid}");
        let body = serde_json::json!({ "filter": subject }).to_string();
        common::request_with(&cluster.urls(), &format!("$JS.API.STREAM.PURGE.{STREAM}"), &body).expect("purge");
        let forged: Vec<u8> = data.iter().map(|b| b ^ 0x20).collect();
        for part in forged.chunks(512 << 10) {
            publish_part(&cluster, &nuid, part);
        }
        let err = store.get(key).expect_err("bytes that do not match the digest");
        assert!(matches!(&err, StoreError::Backend { reason, .. } if reason.contains("digest")), "{key}: {err:?}");
    }
}

/// The part id (`nuid`) of object `key`, from its metadata.
fn object_nuid(cluster: &NatsCluster, key: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let client = async_nats::ConnectOptions::new().connect(cluster.urls().as_slice()).await.expect("connect");
        let objects = async_nats::jetstream::new(client).get_object_store("ember_snapshots").await.expect("bucket");
        objects.info(key).await.expect("info").nuid
    })
}

/// Appends `bytes` as a part of the object whose parts are `nuid`'s.
fn publish_part(cluster: &NatsCluster, nuid: &str, bytes: &[u8]) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let client = async_nats::ConnectOptions::new().connect(cluster.urls().as_slice()).await.expect("connect");
        let js = async_nats::jetstream::new(client);
        let subject = format!("$O.ember_snapshots.C.{nuid}");
        let ack = js.publish(subject, bytes.to_vec().into()).await.expect("publish");
        ack.await.expect("stored");
    });
}
