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
//! and left R1 it is lost with its one server.
use async_nats::jetstream::stream;
use async_nats::Client;

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
}
