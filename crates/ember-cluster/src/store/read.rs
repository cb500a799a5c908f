//! Reading one object whole, by requests to the stream's leader only.
//!
//! An object is its metadata message (the last on `$O.<bucket>.M.<name>`)
//! and its parts, the messages on `$O.<bucket>.C.<nuid>` in stream order. A
//! read asks for the metadata, then for each part the first message on the
//! parts' subject after the one before: one request a part, no consumer.
//! The library's get makes an ordered push consumer per object (created,
//! then deleted): a rebind's restore (three objects) spent 440-700 ms so
//! on the loaded 300-session drill, and one such get failed its digest
//! check under load here (`a_get_over_the_cap_is_refused_before_reading`,
//! 1 run in 40 beside three busy loops; its cause not found).
use super::{failed, step, Answer, Handles};
use crate::retry::{again, Step};
use async_nats::jetstream::object_store::{InfoErrorKind, ObjectInfo};
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use ember_snapshot::StoreError;

/// Reads object `key` whole: its size checked against `max` before a byte
/// is read, never more than that size read, and its bytes checked against
/// the SHA-256 digest of its metadata.
pub(super) async fn read(h: Handles, key: String, max: u64) -> Result<Answer<Vec<u8>>, Step> {
    let info = match step("info", h.store.info(&key)).await? {
        Ok(info) if info.deleted => return Ok(Err(StoreError::NotFound { key })),
        Ok(info) => info,
        Err(e) if e.kind() == InfoErrorKind::NotFound => return Ok(Err(StoreError::NotFound { key })),
        Err(e) => return Err(again(e)),
    };
    let size = info.size as u64;
    if size > max {
        return Ok(Err(StoreError::TooLarge { key, size, limit: max }));
    }
    let data = match parts(&h, &info, &key).await? {
        Ok(data) => data,
        Err(e) => return Ok(Err(e)),
    };
    if data.len() != info.size {
        return Ok(Err(failed("get", &key, format!("{} bytes, its metadata says {}", data.len(), info.size))));
    }
    // The library checks a digest only when there is one, as here.
    if let Some(want) = info.digest.as_deref() {
        if want != super::write::digest(&data) {
            return Ok(Err(failed("get", &key, "its bytes do not match the digest of its metadata")));
        }
    }
    Ok(Ok(data))
}

/// The object's `info.chunks` parts, in stream order. A part missing (the
/// object replaced and its parts purged since its metadata was read) fails
/// the try: the call's next try reads the metadata again.
async fn parts(h: &Handles, info: &ObjectInfo, key: &str) -> Result<Answer<Vec<u8>>, Step> {
    let subject = format!("$O.{}.C.{}", info.bucket, info.nuid);
    let mut data = Vec::with_capacity(info.size);
    let mut next = 1;
    for _ in 0..info.chunks {
        let part = match step("get part", h.stream.get_first_raw_message_by_subject(&subject, next)).await? {
            Ok(m) => m,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {
                return Err(again(format!("{key}: a part of {subject} is gone (replaced since?)")));
            }
            Err(e) => return Err(again(e)),
        };
        if data.len() + part.payload.len() > info.size {
            return Ok(Err(failed("get", key, format!("more than the {} bytes its metadata says", info.size))));
        }
        data.extend_from_slice(&part.payload);
        next = part.sequence + 1;
    }
    Ok(Ok(data))
}
