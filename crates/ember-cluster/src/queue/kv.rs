//! The key-value side of the queue: task records (the truth about every
//! task), read and written with compare-and-set on the entry's revision, so
//! two workers (or a worker and a cancel) can never both move one task: the
//! second write names a revision that is no longer current, is refused, and
//! its caller re-reads and decides again.
use crate::retry::{again, retry, Step};
use async_nats::jetstream::kv::{Operation, Store, UpdateErrorKind};
use bytes::Bytes;
use ember_queue::QueueError;
use ember_types::task::TaskRecord;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

/// A task as the records bucket holds it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Stored {
    pub record: TaskRecord,
    /// Stream sequence of the message the current attempt was leased from:
    /// a later delivery of the same sequence is a redelivery (its lease
    /// expired), any other sequence for this task a duplicate message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
}

/// What a compare-and-set came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Cas {
    Done(u64),
    /// Another writer got there first: re-read and decide again.
    Conflict,
}

/// A key for any string: KV keys allow `[-/_=.a-zA-Z0-9]`, so names of
/// that alphabet (minus `.`, `/` and `=`) stay readable and anything else is
/// hex behind a `=`, which no readable key contains.
pub(crate) fn key_of(s: &str) -> String {
    let plain = !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if plain {
        s.to_string()
    } else {
        let hex: String = s.bytes().map(|b| format!("{b:02x}")).collect();
        format!("={hex}")
    }
}

/// One bucket with the retry policy applied to each request.
#[derive(Clone)]
pub(crate) struct Bucket {
    pub store: Store,
    pub name: String,
    pub budget: Duration,
}

impl Bucket {
    /// The live value of `key` and its revision (`None`: absent or deleted).
    pub async fn get(&self, key: &str) -> Result<Option<(Bytes, u64)>, QueueError> {
        retry(self.budget, "kv get", key, || async {
            let e = self.store.entry(key).await.map_err(again)?;
            Ok(e.filter(|e| e.operation == Operation::Put).map(|e| (e.value, e.revision)))
        })
        .await
    }

    /// Writes `value` if the key is still at `expected` (`None`: absent).
    /// A try whose reply was lost may have landed: a conflict after such a
    /// try reads the value back and counts it as done if it is ours.
    pub async fn cas(&self, key: &str, value: Bytes, expected: Option<u64>) -> Result<Cas, QueueError> {
        let mut unsure = false;
        retry(self.budget, "kv update", key, || {
            let value = value.clone();
            let was_unsure = unsure;
            unsure = true;
            async move {
                let res = match expected {
                    Some(rev) => self.store.update(key, value.clone(), rev).await.map_err(|e| e.kind()),
                    None => self.store.create(key, value.clone()).await.map_err(|e| match e.kind() {
                        async_nats::jetstream::kv::CreateErrorKind::AlreadyExists => UpdateErrorKind::WrongLastRevision,
                        _ => UpdateErrorKind::Other,
                    }),
                };
                match res {
                    Ok(rev) => Ok(Cas::Done(rev)),
                    Err(UpdateErrorKind::WrongLastRevision) if was_unsure => match self.get(key).await? {
                        Some((now, rev)) if now == value => Ok(Cas::Done(rev)),
                        _ => Ok(Cas::Conflict),
                    },
                    Err(UpdateErrorKind::WrongLastRevision) => Ok(Cas::Conflict),
                    Err(kind) => Err(Step::Again(format!("{kind} in bucket {}", self.name))),
                }
            }
        })
        .await
    }

    /// Deletes `key` if it is still at `rev`; a conflict means someone
    /// changed it since, which the caller re-reads.
    pub async fn delete(&self, key: &str, rev: Option<u64>) -> Result<Cas, QueueError> {
        retry(self.budget, "kv delete", key, || async {
            match self.store.delete_expect_revision(key, rev).await {
                Ok(()) => Ok(Cas::Done(0)),
                Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => match self.get(key).await? {
                    None => Ok(Cas::Done(0)),
                    Some(_) => Ok(Cas::Conflict),
                },
                Err(e) => Err(again(e)),
            }
        })
        .await
    }

    /// Every live value of the bucket with its key, in one pass: an ordered
    /// consumer on the bucket's stream delivers each key's last message.
    /// Listing the keys and then reading each was a round trip per key: the
    /// prune of the 300-session drill read 9,300 records so, every minute,
    /// on each node, and through an election each read waited its retries.
    ///
    /// The pass ends when the server reports nothing pending, and that count
    /// can run behind a key rewritten meanwhile: its old message is gone
    /// before the consumer reaches it, and its new one not yet counted (one
    /// task of 300 was missing from a listing under load). So the pass is
    /// checked against the keys the stream held before it began (one request
    /// names them all), and a key the pass did not bring is read alone.
    pub async fn values(&self) -> Result<Vec<(String, Bytes)>, QueueError> {
        retry(self.budget, "kv values", &self.name, || async {
            let before = self.keys_now().await?;
            if before.is_empty() {
                return Ok(Vec::new());
            }
            let (mut out, seen) = self.pass().await?;
            let behind: Vec<&String> = before.iter().filter(|k| !seen.contains(*k)).collect();
            if !behind.is_empty() {
                tracing::debug!(bucket = %self.name, keys = behind.len(), "listing: keys the pass missed, read alone");
            }
            for key in behind {
                let e = self.store.entry(key).await.map_err(again)?;
                if let Some(e) = e.filter(|e| e.operation == Operation::Put) {
                    out.insert(key.clone(), e.value);
                }
            }
            Ok(out.into_iter().collect())
        })
        .await
    }

    /// The keys the bucket's stream holds a message for (a removed key's is
    /// its marker), at one instant.
    async fn keys_now(&self) -> Result<HashSet<String>, Step> {
        use futures_util::TryStreamExt;
        let filter = format!("{}>", self.store.prefix);
        let subjects = self.store.stream.info_with_subjects(&filter).await.map_err(again)?;
        let subjects: Vec<(String, usize)> = subjects.try_collect().await.map_err(again)?;
        let key = |s: String| s.strip_prefix(self.store.prefix.as_str()).map(str::to_string);
        Ok(subjects.into_iter().filter_map(|(s, _)| key(s)).collect())
    }

    /// One pass of an ordered consumer over each key's last message: the
    /// live values by key, and every key it brought (removed ones too).
    async fn pass(&self) -> Result<(BTreeMap<String, Bytes>, HashSet<String>), Step> {
        use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
        use futures_util::StreamExt;
        let cfg = OrderedConfig {
            filter_subject: format!("{}>", self.store.prefix),
            deliver_policy: DeliverPolicy::LastPerSubject,
            ..Default::default()
        };
        let mut consumer = self.store.stream.create_consumer(cfg).await.map_err(again)?;
        // By key: the consumer goes on delivering the writes made while it
        // runs, so a key written meanwhile comes twice (a cluster's
        // `GET /v1/tasks` listed such a task twice). Its later message is its
        // newer value, or its removal.
        let (mut out, mut seen) = (BTreeMap::new(), HashSet::new());
        if consumer.info().await.map_err(again)?.num_pending == 0 {
            return Ok((out, seen));
        }
        let mut messages = consumer.messages().await.map_err(again)?;
        while let Some(m) = messages.next().await {
            let m = m.map_err(again)?;
            let pending = m.info().map_err(again)?.pending;
            // A delete or purge leaves a marker as the key's last message.
            let removed = m.headers.as_ref().is_some_and(|h| h.get("KV-Operation").is_some());
            if let Some(key) = m.subject.strip_prefix(self.store.prefix.as_str()) {
                match removed {
                    true => _ = out.remove(key),
                    false => _ = out.insert(key.to_string(), m.payload.clone()),
                }
                seen.insert(key.to_string());
            }
            if pending == 0 {
                return Ok((out, seen));
            }
        }
        Err(again(format!("the listing of bucket {} ended early", self.name)))
    }
}

/// The records bucket, typed.
#[derive(Clone)]
pub(crate) struct Records(pub Bucket);

impl Records {
    pub async fn load(&self, id: &str) -> Result<Option<(Stored, u64)>, QueueError> {
        let Some((bytes, rev)) = self.0.get(&key_of(id)).await? else { return Ok(None) };
        let st = serde_json::from_slice(&bytes).map_err(|e| QueueError::Unavailable {
            op: "decode task record",
            id: id.to_string(),
            reason: e.to_string(),
        })?;
        Ok(Some((st, rev)))
    }

    pub async fn save(&self, st: &Stored, rev: Option<u64>) -> Result<Cas, QueueError> {
        self.0.cas(&key_of(&st.record.id), encode(st), rev).await
    }

    /// Applies `f` to the task's current record and writes it back, again
    /// on a newer record until no other writer came in between. `f` sees
    /// every retry's record afresh, so its checks (fencing) hold for the
    /// record actually written.
    pub async fn modify(
        &self,
        id: &str,
        mut f: impl FnMut(&mut Stored) -> Result<(), QueueError>,
    ) -> Result<Stored, QueueError> {
        loop {
            let (mut st, rev) = self.load(id).await?.ok_or_else(|| QueueError::NotFound(id.to_string()))?;
            f(&mut st)?;
            if let Cas::Done(_) = self.save(&st, Some(rev)).await? {
                return Ok(st);
            }
        }
    }
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Bytes {
    // Serializing plain data structs to a Vec cannot fail.
    Bytes::from(serde_json::to_vec(v).unwrap_or_default())
}
