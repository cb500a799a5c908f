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
