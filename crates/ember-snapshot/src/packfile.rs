//! Pack objects: many small chunks in one object.
//!
//! A chunk under [`PACK_BELOW`] bytes (a small file, or a file's tail) is not
//! stored as `chunks/<digest>` but appended, in its stored form, to its
//! worker's pack, which goes to the store as `packs/<digest of the pack>`
//! once it holds [`PACK_TARGET`] bytes or the upload ends. The manifest
//! names each packed chunk's place ([`PackAt`]). Why: an object per small
//! file made a snapshot of a tree of small files create (and fsync, and
//! later remove) one file per source file in a local store, and made one
//! request each to the JetStream and S3 stores; the file creation on a busy
//! ext4 cost more than the hashing and the compression together
//! (docs/performance.md, row 10).
//!
//! Dedup: a packed chunk has no key of its own to look up. The places of
//! packed chunks this process has written or read are kept in a bounded
//! table ([`Places`]), per workspace ([`Scope`]); a snapshot reuses a place
//! from it after one lookup of the pack per snapshot (the pack may have been
//! collected since), and packs again what it does not find there. A pack's
//! name is the hash of its bytes, so a place learned from one store holds in
//! any store that has the pack. A process that has not seen a chunk's place
//! (a restart, another node) stores it once more, in a new pack.
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;

use crate::manifest::{pack_key, ChunkHash, Manifest, PackAt};
use crate::{ObjectStore, SnapshotError, Staged};

/// Chunks shorter than this are packed.
pub(crate) const PACK_BELOW: usize = 256 << 10;
/// A pack is written once it holds this many stored bytes.
pub(crate) const PACK_TARGET: usize = 4 << 20;
/// Chunks whose places are kept ([`Places`]): at most ~20 MiB.
const PLACES_MAX: usize = 100_000;
/// Places kept per chunk, newest first.
const PLACES_PER_CHUNK: usize = 2;

/// Places of packed chunks, by the [`Scope`] they were learned in and the
/// chunk's digest. Bounded: when full it is emptied (what is forgotten costs
/// a chunk stored again, never a wrong read).
pub(crate) struct Places {
    map: Mutex<HashMap<PlaceKey, Vec<PackAt>>>,
}

/// A chunk's digest, under its hash, in a [`Scope`].
type PlaceKey = (Scope, ChunkHash, [u8; 32]);

/// Where a place may be reused: the snapshots of one workspace (or one
/// sandbox's layer; or the unlabelled ones) in the stores of one manifest
/// key.
///
/// Why per workspace: a pack holds the other small files of the snapshot
/// that wrote it, and lives as long as any manifest names a chunk in it. A
/// snapshot of workspace B reusing a chunk of workspace A's pack would keep
/// A's other files in the store after A's snapshots are deleted and swept,
/// for as long as B's snapshot lives: another tenant's data kept for it.
/// Across workspaces a small file is stored once per workspace instead.
/// Why per key: a process writing several stores with keys of their own
/// (the tests) keeps each store's places apart. The key enters as its MAC
/// of a fixed text, which reveals nothing of it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Scope(u64);

impl Scope {
    pub(crate) fn of(store: &dyn ObjectStore, labels: &BTreeMap<String, String>) -> Scope {
        let owner = match (labels.get("workspace"), labels.get("sandbox")) {
            (Some(w), _) => format!("workspace\0{w}"),
            (None, Some(s)) => format!("sandbox\0{s}"),
            (None, None) => String::new(),
        };
        let mac = store.manifest_key().sign(format!("ember-snapshot pack places\0{owner}").as_bytes());
        let digits = mac.rsplit(':').next().unwrap_or_default();
        Scope(digits.get(..16).and_then(|d| u64::from_str_radix(d, 16).ok()).unwrap_or_default())
    }
}

static PLACES: LazyLock<Places> = LazyLock::new(|| Places { map: Mutex::new(HashMap::new()) });

/// The process's table of places.
pub(crate) fn places() -> &'static Places {
    &PLACES
}

impl Places {
    /// The places known for chunk `sha`, newest first.
    pub(crate) fn get(&self, scope: Scope, hash: ChunkHash, sha: &[u8; 32]) -> Vec<PackAt> {
        self.map.lock().get(&(scope, hash, *sha)).cloned().unwrap_or_default()
    }

    /// Learns the places of `m`'s packed chunks (a manifest `store` verified or wrote).
    pub(crate) fn learn(&self, store: &dyn ObjectStore, m: &Manifest) {
        if !m.chunks().any(|c| c.pack.is_some()) {
            return;
        }
        let scope = Scope::of(store, &m.labels);
        let mut map = self.map.lock();
        for c in m.chunks() {
            let (Some(at), Ok(sha)) = (c.pack, decode_sha(c.id.hex())) else { continue };
            let key = (scope, c.id.hash(), sha);
            if map.len() >= PLACES_MAX && !map.contains_key(&key) {
                map.clear();
            }
            let known = map.entry(key).or_default();
            known.retain(|p| *p != at);
            known.insert(0, at);
            known.truncate(PLACES_PER_CHUNK);
        }
    }
}

fn decode_sha(hex_text: &str) -> Result<[u8; 32], hex::FromHexError> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_text, &mut out)?;
    Ok(out)
}

/// One worker's pack being filled.
pub(crate) struct PackWriter {
    /// Names the pack.
    hash: ChunkHash,
    buf: Vec<u8>,
    /// (chunk digest, offset, stored length) of what `buf` holds.
    members: Vec<([u8; 32], u64, u64)>,
}

impl PackWriter {
    pub(crate) fn new(hash: ChunkHash) -> PackWriter {
        PackWriter { hash, buf: Vec::new(), members: Vec::new() }
    }

    /// Appends a chunk's stored form, first writing the pack out if the
    /// chunk would take it past [`PACK_TARGET`]. Returns the places of the
    /// chunks written out, if any.
    pub(crate) fn add(
        &mut self,
        sha: [u8; 32],
        stored: &[u8],
        store: &dyn ObjectStore,
        batch: &Staged,
    ) -> Result<Vec<([u8; 32], PackAt)>, SnapshotError> {
        let written = match self.buf.len() + stored.len() > PACK_TARGET && !self.buf.is_empty() {
            true => self.finish(store, batch)?,
            false => Vec::new(),
        };
        self.members.push((sha, self.buf.len() as u64, stored.len() as u64));
        self.buf.extend_from_slice(stored);
        Ok(written)
    }

    /// Writes the pack out (staged in `batch`) and returns its chunks'
    /// places; nothing when empty.
    pub(crate) fn finish(
        &mut self,
        store: &dyn ObjectStore,
        batch: &Staged,
    ) -> Result<Vec<([u8; 32], PackAt)>, SnapshotError> {
        if self.buf.is_empty() {
            return Ok(Vec::new());
        }
        let pack = self.hash.digest(&self.buf);
        // Named by its bytes: a pack of that name, if any, holds the same.
        store.put_staged(&pack_key(&pack), &self.buf, batch)?;
        self.buf.clear();
        Ok(self.members.drain(..).map(|(sha, at, stored)| (sha, PackAt { pack, at, stored })).collect())
    }
}

/// Whether each pack a snapshot reuses a place in is in the store: one
/// lookup per pack per snapshot, after the snapshot's marker is up (so gc
/// cannot remove it meanwhile).
#[derive(Default)]
pub(crate) struct PackCheck {
    /// Each pack's stored size, `None`: absent.
    known: Mutex<HashMap<[u8; 32], Option<u64>>>,
}

impl PackCheck {
    /// Whether the store has `at`'s pack, long enough to hold its slice.
    pub(crate) fn holds(&self, store: &dyn ObjectStore, at: &PackAt) -> Result<bool, SnapshotError> {
        let known = self.known.lock().get(&at.pack).copied();
        let size = match known {
            Some(size) => size,
            None => {
                let size = store.meta(&pack_key(&at.pack))?.map(|m| m.size);
                self.known.lock().insert(at.pack, size);
                size
            }
        };
        Ok(size.is_some_and(|size| at.at.checked_add(at.stored).is_some_and(|end| end <= size)))
    }
}
