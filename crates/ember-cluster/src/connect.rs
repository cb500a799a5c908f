//! How every long-lived NATS connection of a node is made.
//!
//! A server that goes silent (its host lost without a reset, a link cut
//! between the node and it, a stopped process) keeps the connection open:
//! nothing is refused, nothing answered. The client notices only when its
//! pings go unanswered, and async-nats pings once a minute by default and
//! gives up after two unanswered: about three minutes during which the node
//! serves nothing (its heartbeats time out, its sessions are rebound
//! elsewhere) although other servers of the cluster are up. With a ping
//! every [`PING_INTERVAL`] the connection is given up after about three of
//! them, and the client connects to another server it was given or the
//! cluster advertised. Any message from the server counts as an answer, so
//! a busy connection sends no pings at all.
use async_nats::ConnectOptions;
use std::time::Duration;

/// How often an idle connection pings its server.
pub const PING_INTERVAL: Duration = Duration::from_secs(2);

/// Options of a node's connections: `connect_timeout` for each attempt, and
/// a ping every [`PING_INTERVAL`].
pub(crate) fn options(connect_timeout: Duration) -> ConnectOptions {
    ConnectOptions::new().connection_timeout(connect_timeout).ping_interval(PING_INTERVAL)
}
