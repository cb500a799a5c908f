//! The streams, consumers and buckets the queue needs, created if absent.
//! An existing one is used as it is (changing a live stream's settings is
//! an operator's decision, not a side effect of a node starting), but for
//! two settings ember's correctness rests on: its reads go to its leader,
//! and it has the replicas the cluster keeps (`replicas.rs`).
use super::kv::Bucket;
use super::JetStreamConfig;
use crate::retry::{again, retry};
use async_nats::jetstream::{self, consumer, stream};
use ember_queue::QueueError;
use std::time::Duration;

/// Dedup window of the task streams: a publish retried within it is dropped.
const DEDUP_WINDOW: Duration = Duration::from_secs(120);

/// A tier's work-queue stream and its one durable pull consumer.
pub(crate) async fn work_queue(
    js: &jetstream::Context,
    cfg: &JetStreamConfig,
    replicas: usize,
    name: &str,
    subject: &str,
) -> Result<consumer::PullConsumer, QueueError> {
    let stream = create_stream(js, cfg, replicas, name, subject, stream::RetentionPolicy::WorkQueue).await?;
    let config = consumer::pull::Config {
        durable_name: Some("workers".into()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: cfg.ack_wait,
        // Unlimited: a Nak for a held workspace is a delivery too; attempts
        // are counted in the task record (module docs of `queue`).
        max_deliver: -1,
        max_ack_pending: cfg.max_ack_pending,
        ..Default::default()
    };
    retry(cfg.retry_budget, "create consumer", name, || async {
        stream.get_or_create_consumer("workers", config.clone()).await.map_err(again)
    })
    .await
}

/// The dead-letter stream: a copy of each dead-lettered task's record.
pub(crate) async fn dead_letters(
    js: &jetstream::Context,
    cfg: &JetStreamConfig,
    replicas: usize,
    name: &str,
    subject: &str,
) -> Result<(), QueueError> {
    create_stream(js, cfg, replicas, name, subject, stream::RetentionPolicy::Limits).await.map(|_| ())
}

async fn create_stream(
    js: &jetstream::Context,
    cfg: &JetStreamConfig,
    replicas: usize,
    name: &str,
    subject: &str,
    retention: stream::RetentionPolicy,
) -> Result<stream::Stream, QueueError> {
    let config = stream::Config {
        name: name.to_string(),
        subjects: vec![subject.to_string()],
        retention,
        storage: stream::StorageType::File,
        num_replicas: replicas,
        duplicate_window: DEDUP_WINDOW,
        ..Default::default()
    };
    retry(cfg.retry_budget, "create stream", name, || async {
        js.get_or_create_stream(config.clone()).await.map_err(again)
    })
    .await?;
    settle_stream(js, name, replicas, cfg.retry_budget).await?;
    // Fetched again: the handle keeps the stream's settings it was made with.
    retry(cfg.retry_budget, "open stream", name, || async { js.get_stream(name).await.map_err(again) }).await
}

/// A key-value bucket keeping the last value of each key.
pub(crate) async fn bucket(
    js: &jetstream::Context,
    cfg: &JetStreamConfig,
    replicas: usize,
    name: String,
) -> Result<Bucket, QueueError> {
    let store = retry(cfg.retry_budget, "create bucket", &name, || async {
        if let Ok(kv) = js.get_key_value(name.as_str()).await {
            return Ok(kv);
        }
        let config = crate::replicas::kv_stream(&name, 1, Duration::ZERO, replicas);
        js.create_stream(config).await.map_err(again)?;
        js.get_key_value(name.as_str()).await.map_err(again)
    })
    .await?;
    settle_stream(js, &store.stream_name, replicas, cfg.retry_budget).await?;
    // Fetched again: the handle keeps the stream's settings it was made with.
    let store = retry(cfg.retry_budget, "open bucket", &name, || async {
        js.get_key_value(name.as_str()).await.map_err(again)
    })
    .await?;
    Ok(Bucket { store, name, budget: cfg.retry_budget })
}

/// Settles `stream` ([`crate::replicas::settle`]): its direct gets off, so
/// reads go to the stream leader, not to any replica (a lagging follower
/// answers an older revision or none at all, and the queue decides on what
/// it reads: a missing record, a fenced attempt; the failover test saw both
/// once direct gets were on, as a restore does: a manifest another node has
/// just written), and `replicas` at least.
pub(crate) async fn settle_stream(
    js: &jetstream::Context,
    stream: &str,
    replicas: usize,
    budget: Duration,
) -> Result<(), QueueError> {
    retry(budget, "settle stream", stream, || async {
        let mut handle = js.get_stream(stream).await.map_err(again)?;
        let mut config = handle.info().await.map_err(again)?.config.clone();
        if crate::replicas::settle(&mut config, replicas) {
            js.update_stream(config).await.map_err(again)?;
        }
        Ok(())
    })
    .await
}
