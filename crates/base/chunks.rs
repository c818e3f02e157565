//! A body kept as the frames it arrived in.
//!
//! A long request body is hundreds of KB, re-sent every turn and mostly bytes handoff
//! has read before. Joining its frames into one buffer copied the whole body on every
//! request, 14% of a long request's CPU. [`Chunks`] keeps the frames as hyper delivered
//! them: a range inside one frame is shared, not copied, and the frames are joined only
//! for a reader that needs one buffer, and then once.
//!
//! A body being read also digests each whole [`BLOCK`] of its bytes as its frames
//! arrive, while they are still in cache ([`Chunks::reading`]): what a later reader
//! compares to find the bytes a body repeats from an earlier one, without reading
//! those bytes again. A mid-sized body digests only its leading blocks so; the rest
//! are digested if a reader asks for them.

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::ops::Range;
use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};
use twox_hash::XxHash3_128;

/// The bytes each block digest covers.
pub const BLOCK: usize = 4 << 10;

/// A body shorter than this has no block digests: it is read faster than compared.
pub const DIGESTED_FROM: usize = 32 << 10;

/// A body declared shorter than this has its blocks digested as they arrive only up to
/// [`DIGESTED_FROM`], the longest lead such a body is looked up by; the rest when a
/// reader asks. An agent's mid-sized body often ends with a prompt and a tool list
/// that no memo compares (Claude Code's first turns: 77 of 87 KB after the list).
/// A longer body is a long conversation, its list most of it: digested as it arrives,
/// while the kernel's copy is still in cache.
pub const DIGESTED_WHOLE_FROM: usize = 8 * DIGESTED_FROM;

/// A body as a list of frames, read as one run of bytes.
#[derive(Debug, Clone, Default)]
pub struct Chunks {
    /// The frames, none empty.
    parts: Vec<Bytes>,
    /// Where each frame ends in the body.
    ends: Vec<usize>,
    /// The frames joined, once a reader needed one buffer.
    joined: OnceLock<Bytes>,
    /// True when each block is digested as its frames arrive.
    digesting: bool,
    /// How far blocks are digested as the frames arrive (the rest on demand).
    digest_to: usize,
    /// The digest of each whole block so far, once the body is [`DIGESTED_FROM`] long.
    blocks: Vec<u128>,
}

impl From<Bytes> for Chunks {
    fn from(bytes: Bytes) -> Self {
        let mut chunks = Self::default();
        chunks.push(bytes);
        chunks
    }
}

impl From<Vec<u8>> for Chunks {
    fn from(bytes: Vec<u8>) -> Self {
        Self::from(Bytes::from(bytes))
    }
}

impl Chunks {
    /// An empty body that digests its blocks as frames are pushed: all of them, or
    /// only the leading ones when its `declared` length is under
    /// [`DIGESTED_WHOLE_FROM`].
    pub fn reading(declared: Option<u64>) -> Self {
        let short = declared.is_some_and(|length| length < DIGESTED_WHOLE_FROM as u64);
        Self {
            digesting: true,
            digest_to: if short { DIGESTED_FROM } else { usize::MAX },
            ..Self::default()
        }
    }

    /// Appends a frame.
    pub fn push(&mut self, part: Bytes) {
        if part.is_empty() {
            return;
        }
        let end = self.len() + part.len();
        self.parts.push(part);
        self.ends.push(end);
        self.joined = OnceLock::new();
        if self.digesting && end >= DIGESTED_FROM {
            let whole = end.min(self.digest_to) / BLOCK;
            while self.blocks.len() < whole {
                let digest = self.block_digest(self.blocks.len());
                self.blocks.push(digest);
            }
        }
    }

    /// The digest of each whole block, when the body is [`DIGESTED_FROM`] long:
    /// those taken as it was read, and the others taken now.
    pub fn blocks(&self) -> Cow<'_, [u128]> {
        let taken = self.blocks_read();
        let whole = self.whole_blocks();
        if taken.len() == whole {
            return taken;
        }
        let mut blocks = taken.into_owned();
        blocks.extend((blocks.len()..whole).map(|block| self.block_digest(block)));
        Cow::Owned(blocks)
    }

    /// The block digests taken as the body was read (all of them, for a body that was
    /// not read frame by frame): a prefix of [`Chunks::blocks`], got without hashing
    /// any byte when the body was read.
    pub fn blocks_read(&self) -> Cow<'_, [u128]> {
        // A body read frame by frame digests no block before DIGESTED_FROM bytes.
        if self.digesting {
            return Cow::Borrowed(&self.blocks);
        }
        Cow::Owned(
            (0..self.whole_blocks())
                .map(|block| self.block_digest(block))
                .collect(),
        )
    }

    /// How many whole blocks a body of this length has digests for.
    fn whole_blocks(&self) -> usize {
        if self.len() < DIGESTED_FROM {
            0
        } else {
            self.len() / BLOCK
        }
    }

    /// The digest of the bytes of `range`, seeded per process, whichever frames hold
    /// them; `None` past the end.
    pub fn digest(&self, range: Range<usize>) -> Option<u128> {
        if range.start > range.end || range.end > self.len() {
            return None;
        }
        Some(match self.single(range.clone()) {
            Some(bytes) => keyed_hash(bytes),
            None => {
                let mut hasher = XxHash3_128::with_seed(block_seed());
                self.pieces(range).for_each(|piece| hasher.write(piece));
                hasher.finish_128()
            }
        })
    }

    /// The digest of block `block`, which the body holds whole.
    fn block_digest(&self, block: usize) -> u128 {
        self.digest(block * BLOCK..(block + 1) * BLOCK)
            .unwrap_or_default()
    }

    /// The body's length in bytes.
    pub fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    /// True for a body of no bytes.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The frames, in order.
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// The whole body as one buffer: the frame itself when there is one, else the
    /// frames joined (the first call copies them, later ones share that copy).
    pub fn contiguous(&self) -> &Bytes {
        self.joined.get_or_init(|| match self.parts.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            parts => {
                let mut joined = BytesMut::with_capacity(self.len());
                for part in parts {
                    joined.extend_from_slice(part);
                }
                joined.freeze()
            }
        })
    }

    /// The body in one buffer, when it is one already: a single frame, or joined.
    fn whole(&self) -> Option<&Bytes> {
        match self.parts.as_slice() {
            [one] => Some(one),
            _ => self.joined.get(),
        }
    }

    /// The bytes of `range` as one buffer: shared when they lie in one frame (or the
    /// body was joined), copied otherwise; `None` past the end.
    pub fn slice(&self, range: Range<usize>) -> Option<Bytes> {
        if range.start > range.end || range.end > self.len() {
            return None;
        }
        if let Some(whole) = self.whole() {
            return Some(whole.slice(range));
        }
        if range.is_empty() {
            return Some(Bytes::new());
        }
        let part = self.part_at(range.start);
        let start = self.start_of(part);
        match self.parts.get(part) {
            Some(bytes) if range.end - start <= bytes.len() => {
                Some(bytes.slice(range.start - start..range.end - start))
            }
            _ => {
                let mut copy = Vec::with_capacity(range.len());
                self.pieces(range)
                    .for_each(|piece| copy.extend_from_slice(piece));
                Some(Bytes::from(copy))
            }
        }
    }

    /// The bytes of `range` when they lie in one frame (or the body was joined).
    pub fn single(&self, range: Range<usize>) -> Option<&[u8]> {
        if let Some(whole) = self.whole() {
            return whole.get(range);
        }
        if range.is_empty() {
            return (range.end <= self.len()).then_some(&[][..]);
        }
        let part = self.part_at(range.start);
        let start = self.start_of(part);
        self.parts
            .get(part)?
            .get(range.start - start..range.end.checked_sub(start)?)
    }

    /// The slices of the frames that `range` covers, in order; empty past the end.
    pub fn pieces(&self, range: Range<usize>) -> impl Iterator<Item = &[u8]> + '_ {
        self.spans(range)
            .filter_map(|(bytes, within)| bytes.get(within))
    }

    /// The frames that `range` covers, each with the part of it in `range`; none past
    /// the end.
    fn spans(&self, range: Range<usize>) -> impl Iterator<Item = (&Bytes, Range<usize>)> + '_ {
        let valid = range.start <= range.end && range.end <= self.len();
        let first = if valid {
            self.part_at(range.start)
        } else {
            self.parts.len()
        };
        self.parts[first..]
            .iter()
            .zip(first..)
            .map(move |(bytes, part)| (bytes, self.start_of(part)))
            .take_while(move |(_, start)| *start < range.end)
            .map(move |(bytes, start)| {
                let from = range.start.saturating_sub(start);
                (bytes, from..(range.end - start).min(bytes.len()))
            })
            .filter(|(_, within)| !within.is_empty())
    }

    /// The byte at `at`.
    pub fn byte(&self, at: usize) -> Option<u8> {
        if let Some(whole) = self.whole() {
            return whole.get(at).copied();
        }
        let part = self.part_at(at);
        self.parts.get(part)?.get(at - self.start_of(part)).copied()
    }

    /// Where the first byte at or after `from` that `matches` lies.
    pub fn position(&self, from: usize, mut matches: impl FnMut(u8) -> bool) -> Option<usize> {
        if let Some(whole) = self.whole() {
            let found = whole.get(from..)?.iter().position(|b| matches(*b))?;
            return Some(from + found);
        }
        let mut at = from;
        for piece in self.pieces(from..self.len()) {
            if let Some(found) = piece.iter().position(|b| matches(*b)) {
                return Some(at + found);
            }
            at += piece.len();
        }
        None
    }

    /// Where the last byte before `end` that `matches` lies.
    pub fn rposition(&self, end: usize, mut matches: impl FnMut(u8) -> bool) -> Option<usize> {
        if let Some(whole) = self.whole() {
            return whole
                .get(..end.min(whole.len()))?
                .iter()
                .rposition(|b| matches(*b));
        }
        let mut at = end.min(self.len());
        while at > 0 {
            let part = self.part_at(at - 1);
            let start = self.start_of(part);
            let piece = self.parts.get(part)?.get(..at - start)?;
            if let Some(found) = piece.iter().rposition(|b| matches(*b)) {
                return Some(start + found);
            }
            at = start;
        }
        None
    }

    /// True when the body holds `bytes` from `start` on.
    pub fn holds_at(&self, start: usize, bytes: &[u8]) -> bool {
        let Some(end) = start
            .checked_add(bytes.len())
            .filter(|end| *end <= self.len())
        else {
            return false;
        };
        if let Some(whole) = self.single(start..end) {
            return whole == bytes;
        }
        let mut rest = bytes;
        self.pieces(start..end).all(|piece| {
            let (head, tail) = rest.split_at(piece.len().min(rest.len()));
            rest = tail;
            head == piece
        })
    }

    /// Appends the bytes of `range` to `out`; false, appending nothing, past the end.
    pub fn copy_into(&self, range: Range<usize>, out: &mut Vec<u8>) -> bool {
        if range.start > range.end || range.end > self.len() {
            return false;
        }
        out.reserve(range.len());
        self.pieces(range)
            .for_each(|piece| out.extend_from_slice(piece));
        true
    }

    /// The frames `range` covers, each cut to it and shared, not copied.
    pub fn parts_of(&self, range: Range<usize>) -> Vec<Bytes> {
        self.spans(range)
            .map(|(bytes, within)| bytes.slice(within))
            .collect()
    }

    /// The slices of `ranges`, ascending, each as [`Chunks::slice`] gives it; `None` if
    /// one lies past the end. The frames are walked once, not searched per range: a
    /// long body's reused messages are a few hundred ranges (55 k instructions a
    /// request searched).
    pub fn slices(&self, ranges: impl Iterator<Item = Range<usize>>) -> Option<Vec<Bytes>> {
        let mut out = Vec::with_capacity(ranges.size_hint().0);
        let mut part = 0;
        for range in ranges {
            while self.ends.get(part).is_some_and(|end| *end <= range.start) {
                part += 1;
            }
            let start = self.start_of(part);
            out.push(match self.parts.get(part) {
                Some(bytes)
                    if self.joined.get().is_none()
                        && start <= range.start
                        && range.start < range.end
                        && range.end - start <= bytes.len() =>
                {
                    bytes.slice(range.start - start..range.end - start)
                }
                _ => self.slice(range)?,
            });
        }
        Some(out)
    }

    /// The frame that holds byte `at` (`parts.len()` past the end).
    fn part_at(&self, at: usize) -> usize {
        self.ends.partition_point(|end| *end <= at)
    }

    /// Where frame `part` starts in the body.
    fn start_of(&self, part: usize) -> usize {
        part.checked_sub(1)
            .and_then(|before| self.ends.get(before))
            .copied()
            .unwrap_or(0)
    }
}

/// The seeded xxh3-128 of `bytes`, as [`Chunks::digest`] gives it: for in-memory keys
/// that no one outside this process can aim a collision at.
pub fn keyed_hash(bytes: &[u8]) -> u128 {
    XxHash3_128::oneshot_with_seed(block_seed(), bytes)
}

/// The seed of every body's digests: one per process, so no one can craft bytes whose
/// digests agree with another body's.
fn block_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| RandomState::new().hash_one(0x626c_6f63_6b73_u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &[u8] = b"{\"messages\": [ {\"a\":1} , {\"b\":2} ]}  ";

    /// `TEXT` cut at each of `cuts`.
    fn cut(cuts: &[usize]) -> Chunks {
        let mut chunks = Chunks::default();
        let mut at = 0;
        for &to in cuts.iter().chain(std::iter::once(&TEXT.len())) {
            chunks.push(Bytes::from_static(&TEXT[at..to]));
            at = to;
        }
        chunks
    }

    /// Every way of cutting `TEXT` in up to three places.
    fn cuttings() -> Vec<Chunks> {
        let n = TEXT.len();
        let mut all = vec![cut(&[])];
        for a in 0..=n {
            all.push(cut(&[a]));
            for b in a..=n {
                all.push(cut(&[a, b]));
                if b % 5 == 0 {
                    all.extend((b..=n).step_by(3).map(|c| cut(&[a, b, c])));
                }
            }
        }
        all
    }

    #[test]
    fn every_reading_agrees_with_the_bytes_however_they_are_cut() {
        let n = TEXT.len();
        let space = |b: u8| b.is_ascii_whitespace();
        for chunks in cuttings() {
            assert_eq!(chunks.len(), n);
            for start in 0..=n {
                assert_eq!(chunks.byte(start), TEXT.get(start).copied());
                assert_eq!(
                    chunks.position(start, space),
                    TEXT[start..]
                        .iter()
                        .position(|b| space(*b))
                        .map(|p| p + start)
                );
                assert_eq!(
                    chunks.rposition(start, space),
                    TEXT[..start].iter().rposition(|b| space(*b))
                );
                for end in start..=n {
                    let want = &TEXT[start..end];
                    assert_eq!(chunks.slice(start..end).as_deref(), Some(want));
                    let pieces: Vec<u8> = chunks.pieces(start..end).flatten().copied().collect();
                    assert_eq!(pieces, want);
                    let parts: Vec<u8> = chunks.parts_of(start..end).concat();
                    assert_eq!(parts, want);
                    if let Some(single) = chunks.single(start..end) {
                        assert_eq!(single, want);
                    }
                    assert!(chunks.holds_at(start, want));
                    let mut out = b"x".to_vec();
                    assert!(chunks.copy_into(start..end, &mut out));
                    assert_eq!(&out[1..], want);
                }
            }
            assert!(!chunks.holds_at(1, &TEXT[..2]));
            // Joined last: until then every reading above went through the frames.
            assert_eq!(&chunks.contiguous()[..], TEXT);
        }
    }

    #[test]
    fn ranges_past_the_end_read_nothing() {
        for chunks in [cut(&[]), cut(&[7]), cut(&[3, 20])] {
            let n = chunks.len();
            assert_eq!(chunks.slice(0..n + 1), None);
            assert_eq!(chunks.single(n..n + 1), None);
            assert_eq!(chunks.pieces(n - 1..n + 1).count(), 0);
            assert!(chunks.parts_of(0..n + 1).is_empty());
            assert!(!chunks.holds_at(n, b"x"));
            assert!(!chunks.copy_into(2..n + 1, &mut Vec::new()));
            assert_eq!(chunks.byte(n), None);
        }
        assert!(Chunks::default().is_empty());
        assert_eq!(Chunks::default().contiguous().len(), 0);
    }

    #[test]
    fn a_range_in_one_frame_is_shared_and_a_spanning_one_copied() {
        let chunks = cut(&[10]);
        let inside = chunks.slice(2..8).unwrap_or_default();
        assert_eq!(inside.as_ptr(), chunks.parts()[0][2..].as_ptr());
        assert!(chunks.single(8..12).is_none());
        // Once joined, every range is a slice of the joined buffer.
        let joined = chunks.contiguous().as_ptr();
        let spanning = chunks.slice(8..12).unwrap_or_default();
        assert_eq!(spanning.as_ptr(), joined.wrapping_add(8));
    }
}

#[cfg(test)]
mod block_tests {
    use super::*;

    /// A body of `len` bytes, varied, cut into frames of `size`.
    fn body(len: usize, size: usize, reading: bool) -> Chunks {
        let text: Vec<u8> = (0..len).map(|i| (i * 31 % 253) as u8).collect();
        let mut chunks = if reading {
            Chunks::reading(None)
        } else {
            Chunks::default()
        };
        for start in (0..len).step_by(size) {
            chunks.push(Bytes::copy_from_slice(
                &text[start..(start + size).min(len)],
            ));
        }
        chunks
    }

    #[test]
    fn blocks_are_the_same_however_the_body_arrived() {
        let len = DIGESTED_FROM + 5 * BLOCK + 123;
        let whole = body(len, len, false).blocks().into_owned();
        assert_eq!(whole.len(), len / BLOCK);
        for size in [1, 7, 1000, BLOCK, BLOCK + 1, 20_000, len] {
            assert_eq!(&*body(len, size, true).blocks(), &whole[..], "{size}");
        }
        // Each block's digest is its bytes' own: equal blocks, equal digests.
        let repeated = Chunks::from(vec![7u8; DIGESTED_FROM]).blocks().into_owned();
        assert!(repeated.windows(2).all(|pair| pair[0] == pair[1]));
        assert_ne!(whole[0], whole[1]);
    }

    #[test]
    fn a_mid_sized_body_digests_its_leading_blocks_as_it_arrives_and_the_rest_when_asked() {
        let len = DIGESTED_FROM + 9 * BLOCK + 5;
        let whole = body(len, len, false).blocks().into_owned();
        let mut declared = Chunks::reading(Some(len as u64));
        let text = body(len, len, false).contiguous().clone();
        for start in (0..len).step_by(3000) {
            declared.push(text.slice(start..(start + 3000).min(len)));
        }
        assert_eq!(declared.blocks_read().len(), DIGESTED_FROM / BLOCK);
        assert_eq!(&*declared.blocks_read(), &whole[..DIGESTED_FROM / BLOCK]);
        assert_eq!(&*declared.blocks(), &whole[..]);
        // A long one, or one of unknown length, digests every block as it arrives.
        let long = DIGESTED_WHOLE_FROM as u64;
        for length in [Some(long), None] {
            let mut chunks = Chunks::reading(length);
            chunks.push(text.clone());
            assert_eq!(&*chunks.blocks_read(), &whole[..], "{length:?}");
        }
    }

    #[test]
    fn a_short_body_has_no_blocks() {
        assert!(body(DIGESTED_FROM - 1, 100, true).blocks().is_empty());
        assert!(body(DIGESTED_FROM - 1, 100, false).blocks().is_empty());
    }

    #[test]
    fn slices_are_the_bytes_of_their_ranges_across_frames() {
        let chunks = body(10_000, 777, false);
        let text = chunks.contiguous().clone();
        // Read again unjoined: a joined body slices its join, not its frames.
        let chunks = body(10_000, 777, false);
        let ranges = [
            0..5,
            5..800,
            800..2000,
            2000..2000,
            2100..2200,
            9_990..10_000,
        ];
        let sliced = chunks.slices(ranges.iter().cloned()).unwrap_or_default();
        let want: Vec<&[u8]> = ranges.iter().map(|range| &text[range.clone()]).collect();
        assert_eq!(sliced, want);
        assert!(chunks.slices([0..10, 9_999..10_001].into_iter()).is_none());
    }
}
