//! The streams, consumers and buckets the queue needs, created if absent
//! (an existing one is used as it is: changing a live stream's settings is
//! an operator's decision, not a side effect of a node starting).
use super::kv::Bucket;
use super::JetStreamConfig;
use crate::retry::{again, retry};
use async_nats::jetstream::{self, consumer, kv, stream};
use ember_queue::QueueError;
use std::time::Duration;

/// Dedup window of the task streams: a publish retried within it is dropped.
const DEDUP_WINDOW: Duration = Duration::from_secs(120);

/// A tier's work-queue stream and its one durable pull consumer.
pub(crate) async fn work_queue(
    js: &jetstream::Context,
    cfg: &JetStreamConfig,
    name: &str,
    subject: &str,
) -> Result<consumer::PullConsumer, QueueError> {
    let stream = create_stream(js, cfg, name, subject, stream::RetentionPolicy::WorkQueue).await?;
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
    name: &str,
    subject: &str,
) -> Result<(), QueueError> {
    create_stream(js, cfg, name, subject, stream::RetentionPolicy::Limits).await.map(|_| ())
}

async fn create_stream(
    js: &jetstream::Context,
    cfg: &JetStreamConfig,
    name: &str,
    subject: &str,
    retention: stream::RetentionPolicy,
) -> Result<stream::Stream, QueueError> {
    let config = stream::Config {
        name: name.to_string(),
        subjects: vec![subject.to_string()],
        retention,
        storage: stream::StorageType::File,
        num_replicas: cfg.replicas,
        duplicate_window: DEDUP_WINDOW,
        ..Default::default()
    };
    retry(cfg.retry_budget, "create stream", name, || async {
        js.get_or_create_stream(config.clone()).await.map_err(again)
    })
    .await
}

/// A key-value bucket keeping the last value of each key.
pub(crate) async fn bucket(js: &jetstream::Context, cfg: &JetStreamConfig, name: String) -> Result<Bucket, QueueError> {
    let store = retry(cfg.retry_budget, "create bucket", &name, || async {
        if let Ok(kv) = js.get_key_value(name.as_str()).await {
            return Ok(kv);
        }
        let config = kv::Config {
            bucket: name.clone(),
            history: 1,
            storage: stream::StorageType::File,
            num_replicas: cfg.replicas,
            ..Default::default()
        };
        js.create_key_value(config).await.map_err(again)
    })
    .await?;
    // Reads from the stream leader, not "direct" from any replica: a
    // lagging follower answers an older revision or none at all, and the
    // queue decides on what it reads (a missing record, a fenced attempt).
    // The failover test saw both once direct gets were on.
    let stream_name = store.stream_name.clone();
    let store = retry(cfg.retry_budget, "bucket reads from its leader", &name, || async {
        let mut stream = js.get_stream(&stream_name).await.map_err(again)?;
        let mut config = stream.info().await.map_err(again)?.config.clone();
        if config.allow_direct {
            config.allow_direct = false;
            js.update_stream(config).await.map_err(again)?;
        }
        js.get_key_value(name.as_str()).await.map_err(again)
    })
    .await?;
    Ok(Bucket { store, name, budget: cfg.retry_budget })
}
