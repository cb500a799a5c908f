//! How many replicas the streams and buckets ember makes in the cluster
//! have: three when the cluster has three servers or more (R3 survives the
//! loss of one server), else one.
//!
//! The cluster's size is what the server a node is connected to says: its
//! INFO lists the client URLs of every server of the cluster. Counted from
//! the URLs a node was given instead, a node given one server of three
//! (`--cluster nats://a:4222`) that opened a bucket first made it R1, on
//! that server alone: when the server stopped, nothing in the bucket could
//! be written (no replica left to elect a leader), and no session of a dead
//! node was rebound for as long (the rebind tests, once in CI). The URLs
//! given count when they are more (a server with `no_advertise` lists none).
//!
//! A stream ember finds with fewer replicas than that (made so by an
//! earlier node) is raised to them when a node opens it: it is ember's own,
//! and left R1 it is lost with its one server. A node keeping R3 also looks
//! again every [`KEEP_EVERY`] ([`keep`]), so a stream lowered while it runs
//! is raised again.
//!
//! What ember makes it makes read from the leader from the start
//! ([`kv_stream`], [`object_stream`]): a stream update sends the whole
//! config, with no compare-and-set, and a node that made a bucket R1 with
//! async-nats's direct gets on and then turned them off wrote its
//! `num_replicas: 1` back over another node's raise to R3 in between (the
//! rebind tests, twice: once in CI). A node now updates only a stream an
//! older ember made, or one to raise.
use async_nats::jetstream::{self, stream};
use async_nats::Client;
use futures_util::StreamExt;
use std::time::Duration;

/// Replicas of what ember makes on a cluster of three servers or more.
pub const SURVIVES_ONE: usize = 3;

/// The replicas for the cluster `client` is connected to, of which the node
/// was given `given` URLs. A client made with `retry_on_initial_connect`
/// has no server's INFO until it connects: this waits for it, for as long
/// as a call retries ([`RETRY_BUDGET`]; past it, what is done next fails
/// for want of a connection anyway).
///
/// [`RETRY_BUDGET`]: crate::RETRY_BUDGET
pub async fn for_cluster(client: &Client, given: usize) -> usize {
    let start = tokio::time::Instant::now();
    let info = loop {
        match client.try_server_info() {
            Some(info) => break Some(info),
            None if start.elapsed() >= crate::RETRY_BUDGET => break None,
            None => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    };
    wanted(given, info.map_or(0, |i| i.connect_urls.len()))
}

/// [`SURVIVES_ONE`] when the larger of the URLs given and the servers the
/// cluster advertises is three or more, else one.
fn wanted(given: usize, advertised: usize) -> usize {
    if given.max(advertised) >= SURVIVES_ONE {
        SURVIVES_ONE
    } else {
        1
    }
}

/// Settles the `config` of an existing stream ember uses: reads go to its
/// leader (direct gets off: a lagging follower answers an older revision or
/// none, see `queue::setup::settle_stream`) and it has `replicas` at least.
/// Whether anything changed (the stream is then to be updated).
pub(crate) fn settle(config: &mut stream::Config, replicas: usize) -> bool {
    let mut changed = false;
    if config.allow_direct {
        config.allow_direct = false;
        changed = true;
    }
    if config.num_replicas < replicas {
        tracing::warn!(
            stream = %config.name,
            from = config.num_replicas,
            to = replicas,
            "a stream with fewer replicas than the cluster keeps: raised"
        );
        config.num_replicas = replicas;
        changed = true;
    }
    changed
}

/// The stream of key-value bucket `bucket`, as async-nats's
/// `create_key_value` makes it (`kv_to_stream_config`) but for its reads,
/// which go to the leader.
pub(crate) fn kv_stream(bucket: &str, history: i64, max_age: Duration, replicas: usize) -> stream::Config {
    stream::Config {
        name: format!("KV_{bucket}"),
        description: Some(String::new()),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: history.max(1),
        max_age,
        storage: stream::StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        deny_purge: false,
        allow_direct: false,
        num_replicas: replicas.max(1),
        discard: stream::DiscardPolicy::New,
        ..Default::default()
    }
}

/// The stream of object store `bucket`, as async-nats's
/// `create_object_store` makes it but for its reads (the leader's).
pub(crate) fn object_stream(bucket: &str, description: &str, replicas: usize) -> stream::Config {
    stream::Config {
        name: format!("OBJ_{bucket}"),
        description: Some(description.to_string()),
        subjects: vec![format!("$O.{bucket}.C.>"), format!("$O.{bucket}.M.>")],
        storage: stream::StorageType::File,
        num_replicas: replicas.max(1),
        discard: stream::DiscardPolicy::New,
        allow_rollup: true,
        allow_direct: false,
        ..Default::default()
    }
}

/// How often a node keeping R3 looks at the replicas of ember's streams.
pub const KEEP_EVERY: Duration = Duration::from_secs(15);

/// Whether `stream` is one ember makes under `prefix`: its buckets, its
/// object store, its task queue.
fn is_embers(stream: &str, prefix: &str) -> bool {
    let upper = format!("{}_TASKS_", prefix.to_uppercase());
    [format!("KV_{prefix}_"), format!("OBJ_{prefix}_"), upper].iter().any(|p| stream.starts_with(p.as_str()))
}

/// Every [`KEEP_EVERY`], settles each of ember's streams under `prefix`
/// that has fewer than `replicas` (or direct gets on), one listing a round.
/// Only a node keeping [`SURVIVES_ONE`] runs it: one keeping R1 would only
/// ever write a lower count back.
pub async fn keep(js: jetstream::Context, prefix: String, replicas: usize) {
    if replicas < SURVIVES_ONE {
        return;
    }
    let mut tick = tokio::time::interval(KEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut streams = js.streams();
        while let Some(info) = streams.next().await {
            let Ok(info) = info else { break };
            let mut config = info.config;
            if !is_embers(&config.name, &prefix) || !settle(&mut config, replicas) {
                continue;
            }
            if let Err(e) = js.update_stream(&config).await {
                tracing::warn!(stream = %config.name, error = %e, "raise a stream's replicas");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_servers_known_either_way_make_r3() {
        assert_eq!(wanted(1, 3), 3, "one URL given, the cluster advertises three");
        assert_eq!(wanted(3, 0), 3, "three given, none advertised (no_advertise)");
        assert_eq!(wanted(2, 5), 3);
        assert_eq!(wanted(1, 1), 1, "a single server");
        assert_eq!(wanted(2, 2), 1, "two servers: R2 would survive none");
        assert_eq!(wanted(1, 0), 1);
    }

    #[test]
    fn a_stream_is_raised_never_lowered_and_reads_from_its_leader() {
        let mut c = stream::Config { name: "KV_x".into(), num_replicas: 1, allow_direct: true, ..Default::default() };
        assert!(settle(&mut c, 3));
        assert_eq!((c.num_replicas, c.allow_direct), (3, false));
        assert!(!settle(&mut c, 3), "settled: nothing to update");
        assert!(!settle(&mut c, 1), "never lowered");
        assert_eq!(c.num_replicas, 3);
    }

    #[test]
    fn what_ember_makes_a_node_keeping_r1_never_updates() {
        // The update of a node keeping R1 is what wrote R1 over a raise.
        let mut kv = kv_stream("ember_pools", 1, Duration::ZERO, 1);
        assert!(!settle(&mut kv, 1), "{kv:?}");
        assert_eq!((kv.name.as_str(), kv.subjects[0].as_str()), ("KV_ember_pools", "$KV.ember_pools.>"));
        let mut obj = object_stream("ember_snapshots", "chunks", 1);
        assert!(!settle(&mut obj, 1), "{obj:?}");
        assert!(settle(&mut obj, 3), "raised by a node keeping R3");
    }

    #[test]
    fn only_embers_streams_are_kept() {
        for name in ["KV_ember_pools", "OBJ_ember_snapshots", "EMBER_TASKS_STANDARD", "EMBER_TASKS_DEAD"] {
            assert!(is_embers(name, "ember"), "{name}");
        }
        for name in ["KV_other", "KV_emberx_pools", "ORDERS", "OBJ_ember"] {
            assert!(!is_embers(name, "ember"), "{name}");
        }
    }
}
