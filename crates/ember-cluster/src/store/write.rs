//! Writes and deletes in the object store's format (async-nats's reads,
//! `list` and `info` take them as their own), in fewer requests.
//!
//! The library's `put` looks the name up before it writes (to purge the
//! parts it replaces), and its `delete` looks it up, writes a tombstone and
//! purges, whether or not the object had parts. One checkpoint of the
//! 300-session drill made 19 requests to the servers, 6 of them for its
//! pending marker alone (docs/chaos.md). Here:
//!
//! - every metadata message is published with the sequence its name's last
//!   one had (`Nats-Expected-Last-Subject-Sequence`; 0: none yet), a
//!   compare-and-set: a write that lost a race reads the name again and
//!   publishes over the winner, purging the winner's parts, where the
//!   library's blind rollup left a racing writer's parts unreachable;
//! - the sequence comes from what this process last wrote under the name
//!   (a gc lock it renews, a marker it removes), or for a name the caller
//!   expects to be new ([`Write::assume_absent`]: a chunk its lookup did
//!   not find, a new snapshot's manifest and marker) is taken as 0; a lookup
//!   only when neither holds or the guess was wrong;
//! - an object without parts (an empty marker) is purged of nothing.
//!
//! So an empty marker costs one request to put and one to remove, a new
//! chunk or manifest two (its part, its metadata).
use super::{step, Handles, PART};
use crate::retry::{again, Step};
use async_nats::jetstream::{
    self, context::PublishErrorKind, object_store::ObjectInfo, stream::LastRawMessageErrorKind,
};
use async_nats::HeaderMap;
use base64::Engine;
use parking_lot::Mutex;
use sha2::Digest;
use std::collections::HashMap;
use std::future::IntoFuture;
use std::time::SystemTime;

/// How many names a process remembers its last write of; past that it
/// forgets them all (a later write or delete of one looks it up first).
const REMEMBERED: usize = 4096;
/// How often one write reads its name again after losing a race, before
/// the try fails (the call's retry policy then tries again).
const RACES: usize = 5;

/// A name's last metadata message: its stream sequence, and the id and
/// count of the parts it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Last {
    pub seq: u64,
    pub nuid: String,
    pub chunks: usize,
    pub deleted: bool,
}

/// What this process last wrote under each name (see the module's text).
#[derive(Default)]
pub(super) struct Written(Mutex<HashMap<String, Last>>);

impl Written {
    fn get(&self, name: &str) -> Option<Last> {
        self.0.lock().get(name).cloned()
    }

    fn set(&self, name: &str, last: Last) {
        let mut map = self.0.lock();
        if map.len() >= REMEMBERED && !map.contains_key(name) {
            map.clear();
        }
        map.insert(name.to_string(), last);
    }

    fn forget(&self, name: &str) {
        self.0.lock().remove(name);
    }
}

/// One write: `data` under `name`.
pub(super) struct Write<'a> {
    pub name: &'a str,
    pub data: &'a [u8],
    /// The caller expects no object under `name` (see the module's text).
    pub assume_absent: bool,
}

/// An object's digest as its metadata carries it (the library's format),
/// written by a put and checked by a read (`read.rs`).
pub(super) fn digest(data: &[u8]) -> String {
    format!("SHA-256={}", base64::engine::general_purpose::URL_SAFE.encode(sha2::Sha256::digest(data)))
}

fn meta_subject(bucket: &str, name: &str) -> String {
    format!("$O.{bucket}.M.{}", base64::engine::general_purpose::URL_SAFE.encode(name))
}

fn part_subject(bucket: &str, nuid: &str) -> String {
    format!("$O.{bucket}.C.{nuid}")
}

/// The name's last metadata message, from the stream's leader.
pub(super) async fn last(stream: &jetstream::stream::Stream, bucket: &str, name: &str) -> Result<Option<Last>, Step> {
    let subject = meta_subject(bucket, name);
    let m = match step("info", stream.get_last_raw_message_by_subject(&subject)).await? {
        Ok(m) => m,
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
        Err(e) => return Err(again(e)),
    };
    let info: ObjectInfo = serde_json::from_slice(&m.payload).map_err(|e| again(format!("metadata of {name}: {e}")))?;
    Ok(Some(Last { seq: m.sequence, nuid: info.nuid, chunks: info.chunks, deleted: info.deleted }))
}

/// Publishes `info` as `name`'s metadata over the message `expected` (0:
/// none). `Ok(None)`: another write came first.
async fn publish_meta(h: &Handles, info: &ObjectInfo, expected: u64) -> Result<Option<u64>, Step> {
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Rollup", "sub");
    headers.insert("Nats-Expected-Last-Subject-Sequence", expected.to_string().as_str());
    let body = serde_json::to_vec(info).map_err(|e| again(format!("metadata of {}: {e}", info.name)))?;
    let subject = meta_subject(&info.bucket, &info.name);
    let sent = step("put metadata", h.js.publish_with_headers(subject, headers, body.into())).await?;
    let ack = match sent {
        Ok(ack) => step("put metadata", ack.into_future()).await?,
        Err(e) => return Err(again(e)),
    };
    match ack {
        Ok(ack) => Ok(Some(ack.sequence)),
        Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Ok(None),
        Err(e) => Err(again(e)),
    }
}

/// Publishes `info` over whatever `name` holds: `guess` first, then what a
/// lookup finds, until the compare-and-set takes. Returns the message's
/// sequence and the object it replaced.
async fn replace(h: &Handles, info: &ObjectInfo, guess: Option<Last>) -> Result<(u64, Option<Last>), Step> {
    let mut before = match guess {
        Some(g) => Some(g),
        None => last(&h.stream, &info.bucket, &info.name).await?,
    };
    for _ in 0..RACES {
        if let Some(seq) = publish_meta(h, info, before.as_ref().map_or(0, |b| b.seq)).await? {
            return Ok((seq, before));
        }
        before = last(&h.stream, &info.bucket, &info.name).await?;
    }
    Err(again(format!("{}: other writes kept coming first", info.name)))
}

/// Purges the parts `old` named (none for an object without parts, or for
/// parts of this write's own id). A failure leaves them unreachable, never
/// a wrong read: the write stands, and a warning says so.
async fn purge_parts(h: &Handles, bucket: &str, old: Option<Last>, mine: &str) {
    let Some(old) = old.filter(|o| o.chunks > 0 && o.nuid != mine) else { return };
    let subject = part_subject(bucket, &old.nuid);
    for _ in 0..3 {
        let error = match step("purge", h.stream.purge().filter(&subject).into_future()).await {
            Ok(Ok(_)) => return,
            Ok(Err(e)) => e.to_string(),
            Err(Step::Again(e)) => e,
            Err(Step::Fail(e)) => e.to_string(),
        };
        tracing::debug!(%subject, %error, "purging replaced parts");
    }
    tracing::warn!(%subject, "parts of a replaced object left unreachable in the snapshot bucket");
}

/// Writes `w` as one object: its parts under a new id, then its metadata
/// (the object is visible only once that is in), then the replaced
/// object's parts purged.
pub(super) async fn put(h: &Handles, written: &Written, w: &Write<'_>) -> Result<(), Step> {
    let bucket = h.bucket.as_str();
    let nuid: String = std::iter::repeat_with(fastrand::alphanumeric).take(22).collect();
    let parts = part_subject(bucket, &nuid);
    for part in w.data.chunks(PART) {
        let sent = step("put part", h.js.publish(parts.clone(), bytes::Bytes::copy_from_slice(part))).await?;
        step("put part", sent.map_err(again)?.into_future()).await?.map_err(again)?;
    }
    let info = ObjectInfo {
        name: w.name.to_string(),
        description: None,
        metadata: HashMap::new(),
        headers: None,
        options: Some(async_nats::jetstream::object_store::ObjectOptions { link: None, max_chunk_size: Some(PART) }),
        bucket: bucket.to_string(),
        nuid: nuid.clone(),
        size: w.data.len(),
        chunks: w.data.len().div_ceil(PART),
        modified: Some(SystemTime::now().into()),
        digest: Some(digest(w.data)),
        deleted: false,
    };
    let absent = Last { seq: 0, nuid: String::new(), chunks: 0, deleted: true };
    let guess = written.get(w.name).or(w.assume_absent.then_some(absent));
    let (seq, before) = replace(h, &info, guess).await?;
    written.set(w.name, Last { seq, nuid: nuid.clone(), chunks: info.chunks, deleted: false });
    purge_parts(h, bucket, before, &nuid).await;
    Ok(())
}

/// Deletes `name`: a tombstone over its metadata, then its parts purged.
/// An absent or deleted name is left as it is.
pub(super) async fn delete(h: &Handles, written: &Written, name: &str) -> Result<(), Step> {
    let bucket = h.bucket.as_str();
    let before = match written.get(name) {
        Some(b) => Some(b),
        None => last(&h.stream, bucket, name).await?,
    };
    let Some(before) = before.filter(|b| !b.deleted) else { return Ok(()) };
    let tombstone = ObjectInfo {
        name: name.to_string(),
        description: None,
        metadata: HashMap::new(),
        headers: None,
        options: None,
        bucket: bucket.to_string(),
        nuid: before.nuid.clone(),
        size: 0,
        chunks: 0,
        modified: Some(SystemTime::now().into()),
        digest: None,
        deleted: true,
    };
    let (_, replaced) = replace(h, &tombstone, Some(before)).await?;
    written.forget(name);
    purge_parts(h, bucket, replaced.filter(|r| !r.deleted), "").await;
    Ok(())
}
