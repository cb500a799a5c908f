//! FastCDC's cut points, found faster. The cuts are exactly those of
//! fastcdc's `v2020::FastCDC` (normalization level 1, no seed), which the
//! snapshots before this one were cut with, so dedup across them holds.
//!
//! Why not fastcdc's own scan: it was a fifth of a full snapshot's CPU,
//! second only to zstd (docs/performance.md, row 10). Its loop is one chain
//! of dependent shifts and adds, one hash step after the other, so the core
//! waits on each step's latency. The gear hash at a byte depends only on
//! the 64 bytes before it (`h = (h << 1) + GEAR[b]`: an older byte's term is
//! shifted out of the 64 bits), so four stretches of the input can be
//! hashed at once, each started 64 bytes early, and their first hits taken
//! in order. The four chains interleave and the core runs them side by side.
use std::sync::LazyLock;

use fastcdc::v2020::{get_gear_with_seed, select_masks, Normalization};

/// Stretches hashed at once.
const LANES: usize = 4;
/// Bytes of each stretch per round; a hit wastes at most one round's rest.
const STRETCH: usize = 4096;
/// Bytes a gear hash depends on: its 64 bits, one shift per byte.
const MEMORY: usize = 64;

static GEAR: LazyLock<[u64; 256]> = LazyLock::new(|| {
    let (gear, _) = get_gear_with_seed(0);
    gear.as_ref().try_into().expect("the gear table has 256 entries")
});

/// The content-defined chunker: `min`, `avg`, `max` in bytes.
#[derive(Clone, Copy)]
pub(crate) struct Cdc {
    min: usize,
    avg: usize,
    max: usize,
    mask_s: u64,
    mask_l: u64,
}

impl Cdc {
    pub(crate) fn new(min: usize, avg: usize, max: usize) -> Cdc {
        let (mask_s, mask_l) = select_masks(avg, Normalization::Level1);
        Cdc { min, avg, max, mask_s, mask_l }
    }

    /// The length of the first chunk of `src`, as fastcdc's `cut_gear`
    /// finds it: the first byte from `min` (rounded down to even) whose hash
    /// has no bit of the strict mask set before the center (`avg`, or the end
    /// if sooner) or of the loose mask after it, up to `max`. A hit at byte
    /// `p` cuts before it. fastcdc tests bytes in pairs, so an odd end's last
    /// byte is never tested.
    pub(crate) fn cut(&self, src: &[u8]) -> usize {
        let mut remaining = src.len();
        if remaining <= self.min {
            return remaining;
        }
        let mut center = self.avg;
        if remaining > self.max {
            remaining = self.max;
        } else if remaining < center {
            center = remaining;
        }
        let src = &src[..remaining];
        let start = self.min / 2 * 2;
        let strict_end = (center / 2 * 2).max(start);
        let end = remaining / 2 * 2;
        scan(src, start, start, strict_end, self.mask_s)
            .or_else(|| scan(src, start, strict_end, end, self.mask_l))
            .unwrap_or(remaining)
    }
}

/// The first byte `p` in `from..to` where the gear hash of `src[origin..=p]`
/// has no bit of `mask` set.
fn scan(src: &[u8], origin: usize, from: usize, to: usize, mask: u64) -> Option<usize> {
    let gear: &[u64; 256] = &GEAR;
    let mut at = from;
    while to.saturating_sub(at) >= LANES * STRETCH {
        let lane = |k: usize| -> (&[u8; STRETCH], u64) {
            let s = at + k * STRETCH;
            let bytes = src[s..s + STRETCH].try_into().expect("a stretch is STRETCH bytes");
            (bytes, warm(src, origin, s))
        };
        let lanes = [lane(0), lane(1), lane(2), lane(3)];
        let [b0, b1, b2, b3] = lanes.map(|(b, _)| b);
        let [mut h0, mut h1, mut h2, mut h3] = lanes.map(|(_, h)| h);
        for i in 0..STRETCH {
            h0 = (h0 << 1).wrapping_add(gear[b0[i] as usize]);
            h1 = (h1 << 1).wrapping_add(gear[b1[i] as usize]);
            h2 = (h2 << 1).wrapping_add(gear[b2[i] as usize]);
            h3 = (h3 << 1).wrapping_add(gear[b3[i] as usize]);
            // Rare (one byte in 2^19 for the default sizes): four branches, predicted.
            if h0 & mask == 0 || h1 & mask == 0 || h2 & mask == 0 || h3 & mask == 0 {
                let (bytes, h) = (lanes.map(|(b, _)| b), [h0, h1, h2, h3]);
                return Some(at + first_hit(&bytes, h, i, mask));
            }
        }
        at += LANES * STRETCH;
    }
    let mut h = warm(src, origin, at);
    for (p, &b) in src.iter().enumerate().take(to).skip(at) {
        h = (h << 1).wrapping_add(gear[b as usize]);
        if h & mask == 0 {
            return Some(p);
        }
    }
    None
}

/// Where in the round the first hit is, given that lane hashes `h` are
/// those at byte `i` of each stretch and at least one has no bit of `mask`
/// set: the first such lane's, unless a lane before it hits later in its
/// stretch (its bytes come first).
fn first_hit(bytes: &[&[u8; STRETCH]; LANES], h: [u64; LANES], i: usize, mask: u64) -> usize {
    let gear: &[u64; 256] = &GEAR;
    let k = (0..LANES).find(|&k| h[k] & mask == 0).expect("a lane hit");
    for j in 0..k {
        let mut hj = h[j];
        for (p, &b) in bytes[j].iter().enumerate().skip(i + 1) {
            hj = (hj << 1).wrapping_add(gear[b as usize]);
            if hj & mask == 0 {
                return j * STRETCH + p;
            }
        }
    }
    k * STRETCH + i
}

/// The gear hash of `src[origin..s]` (0 when empty): only its last 64 bytes count.
fn warm(src: &[u8], origin: usize, s: usize) -> u64 {
    let gear: &[u64; 256] = &GEAR;
    src[s.saturating_sub(MEMORY).max(origin)..s].iter().fold(0u64, |h, &b| (h << 1).wrapping_add(gear[b as usize]))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use fastcdc::v2020::FastCDC;

    /// Noise from `seed`, with a run of one byte value (where no cut falls)
    /// at the start of every `every` stretches of `run` bytes.
    pub(crate) fn runs_and_noise(len: usize, seed: u64, run: usize, every: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if (i / run).is_multiple_of(every) {
                    b'z'
                } else {
                    x as u8
                }
            })
            .collect()
    }

    fn cuts(c: &Cdc, src: &[u8]) -> Vec<usize> {
        let mut at = 0;
        let mut out = Vec::new();
        while at < src.len() {
            let len = c.cut(&src[at..]);
            out.push(len);
            at += len;
        }
        out
    }

    /// Every cut is fastcdc's, over sizes small and large, odd lengths, runs
    /// without a cut (the largest chunk), and the default chunking.
    #[test]
    fn cuts_where_fastcdc_does() {
        let sizes = [(256, 1024, 4096), (4096, 16384, 65536), (256 << 10, 1 << 20, 4 << 20), (64, 256, 1024)];
        for (seed, len) in [(1, 0), (2, 100), (3, 4097), (4, 300_001), (5, 2_000_000), (6, 9_000_001), (7, 17 << 20)] {
            let src = runs_and_noise(len, seed, 70_000, 5);
            for &(min, avg, max) in &sizes {
                let want: Vec<usize> = FastCDC::new(&src, min, avg, max).map(|c| c.length).collect();
                let got = cuts(&Cdc::new(min, avg, max), &src);
                assert!(
                    got == want,
                    "length {len}, sizes {min}/{avg}/{max}: {} cuts, fastcdc {}",
                    got.len(),
                    want.len()
                );
            }
        }
        let zeros = vec![0u8; 9 << 20];
        let c = Cdc::new(256 << 10, 1 << 20, 4 << 20);
        assert_eq!(cuts(&c, &zeros), [4 << 20, 4 << 20, 1 << 20], "no cut in a run: the largest chunks");
    }
}
