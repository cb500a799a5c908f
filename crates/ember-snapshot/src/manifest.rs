//! The manifest: what a snapshot holds, persisted as `manifests/<id>.json`.
//!
//! On the wire it is an envelope `{"format", "version", "sha256", "manifest"}`
//! where `sha256` is the hex digest of the canonical (serde_json) encoding of
//! `manifest`. Every type here serializes deterministically (fixed field order,
//! `BTreeMap`s), so a reader re-encodes what it parsed and compares digests.
//! The envelope's `mac` authenticates those same bytes ([`ManifestKey`]): the
//! checksum catches corruption, the MAC a store someone else wrote.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{ManifestKey, SnapshotError};

/// The envelope's `format` value.
pub const FORMAT: &str = "ember-snapshot";
/// The manifest version this build writes when a chunk is named by BLAKE3
/// (and the newest it reads): a build before BLAKE3 refuses it as a newer
/// version instead of failing on a chunk without a sha256. A manifest of
/// sha256 chunks is written as version 2 when a chunk is in a pack, else as
/// version 1: the same bytes the builds before wrote and read.
pub const VERSION: u32 = 3;
/// The version of manifests with a packed chunk, all named by sha256.
const VERSION_PACKED: u32 = 2;
/// The version of manifests whose chunks are all objects of their own, named by sha256.
const VERSION_UNPACKED: u32 = 1;

/// One snapshot: its tree, where each file's bytes are, and how it was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub id: String,
    /// Milliseconds since the Unix epoch when the snapshot was committed.
    pub created_unix_ms: u64,
    /// Caller's labels, such as the workspace name and the lease epoch.
    pub labels: BTreeMap<String, String>,
    pub chunking: Chunking,
    /// Entries in walk order: a directory always precedes what it contains;
    /// the first entry is the root, with path `.`.
    pub entries: Vec<Entry>,
    pub stats: Stats,
    /// Things the walk skipped (devices, sockets, fifos, non-UTF-8 names).
    pub warnings: Vec<String>,
}

/// The content-defined chunking parameters, in bytes, and how chunks are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunking {
    pub min: u32,
    pub avg: u32,
    pub max: u32,
    /// zstd level used for the chunk objects.
    pub zstd_level: i32,
    /// The hash that names this snapshot's new chunks and packs. Absent in
    /// manifests of builds before BLAKE3 (sha256), and left out when sha256
    /// so that such a manifest keeps its bytes.
    #[serde(default, skip_serializing_if = "ChunkHash::is_sha256")]
    pub hash: ChunkHash,
}

impl Default for Chunking {
    fn default() -> Self {
        Chunking { min: 256 * 1024, avg: 1024 * 1024, max: 4 * 1024 * 1024, zstd_level: 3, hash: ChunkHash::Blake3 }
    }
}

/// A content hash for chunk and pack names. Both are 256-bit and collision
/// resistant, so a store can hold chunks named by either side by side (a
/// workspace's first snapshot after an upgrade stores its chunks once more,
/// under BLAKE3 names). New snapshots use BLAKE3: a snapshot hashes every
/// byte of the tree, and BLAKE3 runs ~4x sha256's speed here (SHA-NI).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChunkHash {
    /// Every manifest before BLAKE3: the serde default.
    #[default]
    Sha256,
    Blake3,
}

impl ChunkHash {
    pub fn digest(self, data: &[u8]) -> [u8; 32] {
        match self {
            ChunkHash::Sha256 => Sha256::digest(data).into(),
            ChunkHash::Blake3 => blake3::hash(data).into(),
        }
    }

    fn is_sha256(&self) -> bool {
        *self == ChunkHash::Sha256
    }
}

/// A chunk's name: the hex digest of its uncompressed bytes, under the hash
/// its variant says. In a manifest it is the chunk's `"sha256"` or
/// `"blake3"` field.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChunkId {
    Sha256(String),
    Blake3(String),
}

impl ChunkId {
    pub fn new(hash: ChunkHash, digest: &[u8; 32]) -> ChunkId {
        match hash {
            ChunkHash::Sha256 => ChunkId::Sha256(hex::encode(digest)),
            ChunkHash::Blake3 => ChunkId::Blake3(hex::encode(digest)),
        }
    }

    /// The hex digest: the name of the chunk's object (`chunks/<hex>`).
    pub fn hex(&self) -> &str {
        match self {
            ChunkId::Sha256(h) | ChunkId::Blake3(h) => h,
        }
    }

    pub fn hash(&self) -> ChunkHash {
        match self {
            ChunkId::Sha256(_) => ChunkHash::Sha256,
            ChunkId::Blake3(_) => ChunkHash::Blake3,
        }
    }
}

/// One path in the tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Relative, `/`-separated; `.` for the root.
    pub path: String,
    #[serde(flatten)]
    pub kind: EntryKind,
    /// Permission bits, including setuid, setgid and sticky (`mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum EntryKind {
    Dir,
    /// A regular file: its chunks in order. A dense file's chunks add up to
    /// `size`. A sparse one lists its data extents in `data` (`[offset, len]`,
    /// ascending, within `size`); its chunks fill those extents in order (no
    /// chunk spans two) and the rest of the file is holes.
    File {
        size: u64,
        chunks: Vec<ChunkRef>,
        /// Absent for dense files (and in manifests of older builds).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<Vec<[u64; 2]>>,
    },
    Symlink {
        target: String,
    },
}

/// A chunk: `chunks/<hex digest>` holds its zstd-compressed bytes, or, for a
/// small chunk, a slice of a pack object ([`PackAt`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    /// The digest of the uncompressed bytes; first, under its hash's name,
    /// as the `sha256` field was before BLAKE3.
    #[serde(flatten)]
    pub id: ChunkId,
    /// Uncompressed length.
    pub len: u64,
    /// Where the chunk's stored bytes are when it is packed; absent for a
    /// chunk stored as `chunks/<digest>` (and in manifests of older builds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<PackAt>,
}

/// A packed chunk's place: bytes `at..at + stored` of `packs/<pack>` are its
/// stored form (zstd frames, as a chunk object's). The pack is named by the
/// digest of its bytes (under the snapshot's [`ChunkHash`]), so a place,
/// once true, is true in any store that has the pack; the chunk's own digest
/// is still checked on every read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PackAt {
    #[serde(with = "hex_32")]
    pub pack: [u8; 32],
    pub at: u64,
    pub stored: u64,
}

/// A 32-byte digest as 64 hex digits.
mod hex_32 {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(text.as_bytes(), &mut out).map_err(D::Error::custom)?;
        Ok(out)
    }
}

/// Counts recorded when the snapshot was made.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Sum of the regular files' sizes.
    pub logical_bytes: u64,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// Chunk references, counting repeats.
    pub chunk_refs: u64,
    /// Distinct chunks, and their uncompressed bytes.
    pub unique_chunks: u64,
    pub unique_bytes: u64,
    /// Chunks this snapshot uploaded (absent before), uncompressed and as stored.
    pub chunks_uploaded: u64,
    pub bytes_uploaded: u64,
    pub stored_bytes_uploaded: u64,
    /// Chunk references satisfied by a chunk already stored or already uploaded.
    pub chunks_reused: u64,
    pub bytes_reused: u64,
    /// What the snapshot's distinct chunks take in the store (compressed),
    /// reused ones included. Absent (0) in manifests of older builds; omitted
    /// when 0 so those still verify.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stored_bytes: u64,
    /// Bytes of holes in sparse files: `logical_bytes` less this is the data
    /// a restore writes. Omitted when 0, as above.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hole_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    format: String,
    version: u32,
    sha256: String,
    /// `hmac-sha256:<hex>` over the canonical manifest bytes. Absent in
    /// manifests of builds before authentication (refused unless the key
    /// accepts unsigned ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mac: Option<String>,
    manifest: serde_json::Value,
}

pub(crate) fn manifest_key(id: &str) -> String {
    format!("manifests/{id}.json")
}

pub(crate) fn chunk_key(hex: &str) -> String {
    format!("chunks/{hex}")
}

pub(crate) fn pack_key(pack: &[u8; 32]) -> String {
    format!("packs/{}", hex::encode(pack))
}

impl Manifest {
    /// The envelope bytes to store, authenticated with `mac_key`.
    pub fn encode(&self, mac_key: &ManifestKey) -> Result<Vec<u8>, SnapshotError> {
        let corrupt = |e: serde_json::Error| SnapshotError::CorruptManifest {
            key: manifest_key(&self.id),
            reason: format!("encoding: {e}"),
        };
        let canonical = serde_json::to_vec(self).map_err(corrupt)?;
        let env = Envelope {
            format: FORMAT.into(),
            version: self.version(),
            sha256: hex::encode(Sha256::digest(&canonical)),
            mac: Some(mac_key.sign(&canonical)),
            manifest: serde_json::to_value(self).map_err(corrupt)?,
        };
        serde_json::to_vec_pretty(&env).map_err(corrupt)
    }

    /// Parses and verifies the envelope stored under `key` for snapshot `id`:
    /// its checksum, then its MAC with `mac_key`, then that it names `id` (a
    /// genuine manifest copied under another id is refused too).
    pub fn decode(key: &str, id: &str, bytes: &[u8], mac_key: &ManifestKey) -> Result<Manifest, SnapshotError> {
        let corrupt = |reason: String| SnapshotError::CorruptManifest { key: key.to_string(), reason };
        let env: Envelope = serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not an envelope: {e}")))?;
        if env.format != FORMAT {
            return Err(corrupt(format!("format is {:?}, not {FORMAT:?}", env.format)));
        }
        if !(VERSION_UNPACKED..=VERSION).contains(&env.version) {
            return Err(SnapshotError::UnsupportedVersion { key: key.into(), found: env.version, supported: VERSION });
        }
        let manifest: Manifest =
            serde_json::from_value(env.manifest).map_err(|e| corrupt(format!("bad manifest: {e}")))?;
        let canonical = serde_json::to_vec(&manifest).map_err(|e| corrupt(e.to_string()))?;
        let actual = hex::encode(Sha256::digest(&canonical));
        if actual != env.sha256 {
            return Err(corrupt(format!("checksum mismatch: recorded {}, computed {actual}", env.sha256)));
        }
        let tampered = |reason: String| SnapshotError::Tampered { id: id.to_string(), reason };
        mac_key.verify(&canonical, env.mac.as_deref()).map_err(|r| tampered(r.to_string()))?;
        if manifest.id != id {
            return Err(tampered(format!("it names snapshot {:?}", manifest.id)));
        }
        Ok(manifest)
    }

    /// The oldest envelope version that holds this manifest (see [`VERSION`]).
    fn version(&self) -> u32 {
        if self.chunking.hash != ChunkHash::Sha256 || self.chunks().any(|c| c.id.hash() != ChunkHash::Sha256) {
            VERSION
        } else if self.chunks().any(|c| c.pack.is_some()) {
            VERSION_PACKED
        } else {
            VERSION_UNPACKED
        }
    }

    /// The file bytes a restore writes: every chunk reference's length
    /// (holes excluded), from the entries rather than the recorded stats.
    pub fn data_bytes(&self) -> u64 {
        self.entries
            .iter()
            .filter_map(|e| match &e.kind {
                EntryKind::File { chunks, .. } => Some(chunks.iter().map(|c| c.len).fold(0u64, u64::saturating_add)),
                _ => None,
            })
            .fold(0, u64::saturating_add)
    }

    /// Every chunk reference, in walk order, repeats included.
    pub fn chunks(&self) -> impl Iterator<Item = &ChunkRef> {
        self.entries
            .iter()
            .filter_map(|e| match &e.kind {
                EntryKind::File { chunks, .. } => Some(chunks),
                _ => None,
            })
            .flatten()
    }

    /// Every chunk the manifest references, without repeats.
    pub fn chunk_ids(&self) -> impl Iterator<Item = &str> {
        let mut seen = std::collections::HashSet::new();
        self.chunks().map(|c| c.id.hex()).filter(move |s| seen.insert(*s))
    }

    /// The store keys the manifest's chunks are read from, without repeats:
    /// `chunks/<hex digest>` for a chunk of its own, `packs/<pack>` for a packed one.
    pub fn object_keys(&self) -> std::collections::BTreeSet<String> {
        self.chunks()
            .map(|c| match &c.pack {
                Some(p) => pack_key(&p.pack),
                None => chunk_key(c.id.hex()),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest as the builds before BLAKE3 made them: sha256 chunks.
    fn sample() -> Manifest {
        Manifest {
            id: "s1".into(),
            created_unix_ms: 1,
            labels: [("workspace".to_string(), "w".to_string())].into(),
            chunking: Chunking { hash: ChunkHash::Sha256, ..Chunking::default() },
            entries: vec![Entry {
                path: "a".into(),
                kind: EntryKind::File {
                    size: 3,
                    chunks: vec![ChunkRef { id: ChunkId::Sha256("ab".into()), len: 3, pack: None }],
                    data: None,
                },
                mode: 0o644,
                uid: 0,
                gid: 0,
                mtime_sec: 5,
                mtime_nsec: 6,
            }],
            stats: Stats::default(),
            warnings: vec![],
        }
    }

    #[test]
    fn round_trips_and_detects_tampering() {
        let (m, key) = (sample(), ManifestKey::ephemeral());
        let bytes = m.encode(&key).unwrap();
        assert_eq!(Manifest::decode("k", "s1", &bytes, &key).unwrap(), m);
        let tampered = String::from_utf8(bytes.clone()).unwrap().replace("\"mode\": 420", "\"mode\": 493");
        let decoded = Manifest::decode("k", "s1", tampered.as_bytes(), &key);
        assert!(matches!(decoded, Err(SnapshotError::CorruptManifest { .. })));
        assert!(Manifest::decode("k", "s1", b"{", &key).is_err());
        let other = Manifest::decode("k", "s1", &bytes, &ManifestKey::ephemeral());
        assert!(matches!(other, Err(SnapshotError::Tampered { .. })), "another node's key");
        let moved = Manifest::decode("k", "s2", &bytes, &key);
        assert!(matches!(moved, Err(SnapshotError::Tampered { .. })), "copied under another id");
    }

    #[test]
    fn a_manifest_with_a_packed_chunk_is_version_2_and_one_without_stays_version_1() {
        let key = ManifestKey::ephemeral();
        let version = |bytes: &[u8]| serde_json::from_slice::<serde_json::Value>(bytes).unwrap()["version"].clone();
        let plain = sample().encode(&key).unwrap();
        assert_eq!(version(&plain), 1, "the bytes a build before packs writes and reads");
        let mut m = sample();
        if let EntryKind::File { chunks, .. } = &mut m.entries[0].kind {
            chunks[0].pack = Some(PackAt { pack: [7; 32], at: 9, stored: 12 });
        }
        let packed = m.encode(&key).unwrap();
        assert_eq!(version(&packed), 2);
        assert!(String::from_utf8_lossy(&packed).contains(&"07".repeat(32)), "the pack in hex");
        assert_eq!(Manifest::decode("k", "s1", &packed, &key).unwrap(), m);
        assert_eq!(m.object_keys().into_iter().collect::<Vec<_>>(), [format!("packs/{}", "07".repeat(32))]);
    }

    /// The canonical bytes of `sample()`, unpacked and packed, as the build
    /// before BLAKE3 (84aaadd) wrote them: its manifests keep their checksums.
    const BEFORE_BLAKE3: [&str; 2] = [
        r#"{"id":"s1","created_unix_ms":1,"labels":{"workspace":"w"},"chunking":{"min":262144,"avg":1048576,"max":4194304,"zstd_level":3},"entries":[{"path":"a","type":"file","size":3,"chunks":[{"sha256":"ab","len":3}],"mode":420,"uid":0,"gid":0,"mtime_sec":5,"mtime_nsec":6}],"stats":{"logical_bytes":0,"files":0,"dirs":0,"symlinks":0,"chunk_refs":0,"unique_chunks":0,"unique_bytes":0,"chunks_uploaded":0,"bytes_uploaded":0,"stored_bytes_uploaded":0,"chunks_reused":0,"bytes_reused":0},"warnings":[]}"#,
        r#"{"id":"s1","created_unix_ms":1,"labels":{"workspace":"w"},"chunking":{"min":262144,"avg":1048576,"max":4194304,"zstd_level":3},"entries":[{"path":"a","type":"file","size":3,"chunks":[{"sha256":"ab","len":3,"pack":{"pack":"0707070707070707070707070707070707070707070707070707070707070707","at":9,"stored":12}}],"mode":420,"uid":0,"gid":0,"mtime_sec":5,"mtime_nsec":6}],"stats":{"logical_bytes":0,"files":0,"dirs":0,"symlinks":0,"chunk_refs":0,"unique_chunks":0,"unique_bytes":0,"chunks_uploaded":0,"bytes_uploaded":0,"stored_bytes_uploaded":0,"chunks_reused":0,"bytes_reused":0},"warnings":[]}"#,
    ];

    #[test]
    fn a_sha256_manifest_keeps_the_bytes_of_the_builds_before_blake3() {
        let mut m = sample();
        assert_eq!(serde_json::to_string(&m).unwrap(), BEFORE_BLAKE3[0]);
        assert_eq!(serde_json::from_str::<Manifest>(BEFORE_BLAKE3[0]).unwrap(), m);
        if let EntryKind::File { chunks, .. } = &mut m.entries[0].kind {
            chunks[0].pack = Some(PackAt { pack: [7; 32], at: 9, stored: 12 });
        }
        assert_eq!(serde_json::to_string(&m).unwrap(), BEFORE_BLAKE3[1]);
        assert_eq!(serde_json::from_str::<Manifest>(BEFORE_BLAKE3[1]).unwrap(), m);
    }

    #[test]
    fn a_blake3_manifest_names_its_hash_and_is_version_3() {
        let key = ManifestKey::ephemeral();
        let mut m = sample();
        m.chunking = Chunking::default();
        let digest = ChunkHash::Blake3.digest(b"abc");
        assert_eq!(
            hex::encode(digest),
            "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85",
            "BLAKE3's test vector"
        );
        if let EntryKind::File { chunks, .. } = &mut m.entries[0].kind {
            chunks[0].id = ChunkId::new(ChunkHash::Blake3, &digest);
        }
        let bytes = m.encode(&key).unwrap();
        let env: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(env["version"], 3, "a build before BLAKE3 refuses it as a newer version");
        assert_eq!(env["manifest"]["chunking"]["hash"], "blake3");
        let chunk = &env["manifest"]["entries"][0]["chunks"][0];
        assert_eq!(chunk["blake3"], hex::encode(digest));
        assert!(chunk.get("sha256").is_none(), "{chunk}");
        assert_eq!(Manifest::decode("k", "s1", &bytes, &key).unwrap(), m);
        assert_eq!(m.object_keys().into_iter().collect::<Vec<_>>(), [format!("chunks/{}", hex::encode(digest))]);
        let nameless = String::from_utf8(bytes).unwrap().replace("\"blake3\": \"", "\"sha512\": \"");
        let decoded = Manifest::decode("k", "s1", nameless.as_bytes(), &key);
        assert!(matches!(decoded, Err(SnapshotError::CorruptManifest { .. })), "{decoded:?}");
    }

    #[test]
    fn refuses_other_versions() {
        let key = ManifestKey::ephemeral();
        let text =
            String::from_utf8(sample().encode(&key).unwrap()).unwrap().replace("\"version\": 1", "\"version\": 9");
        let decoded = Manifest::decode("k", "s1", text.as_bytes(), &key);
        assert!(matches!(decoded, Err(SnapshotError::UnsupportedVersion { .. })));
    }
}
