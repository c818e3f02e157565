//! The part of a request body that repeats a recent body, not read again.
//!
//! A client re-sends its whole conversation every turn, so a long body is mostly an
//! earlier one plus a few messages, and scanning the repeated part again was most of
//! a long request's CPU. After a body is read, a [`Memo`] keeps where each element of
//! its list (`messages`, `input`) lay, the element's facts, and the digests of the
//! body's bytes up to the last element's end: one per whole block
//! ([`Chunks::blocks`], taken as the body arrived or when first needed) and one of the
//! bytes after them. A later body whose bytes agree up to some element's end takes
//! those elements from the memo: the digests compared are the new body's own, nothing
//! is assumed. serde then reads the body with those elements cut out (the fields, and
//! the elements after them), and a body the cut reading refuses is read whole, so
//! every error names its true place.
//!
//! Only bodies of at least [`DIGESTED_FROM`] bytes are remembered: a shorter one is
//! read faster than it is looked up. Memos are found by a hash of the body's leading
//! blocks' digests at a few lengths, the longest first, with a few memos under each, so
//! sessions that share a system prompt or a tool list still find their own. The
//! shortest lead is a quarter of that length: an agent whose list opens its body
//! re-sends a list that ends before 32 KB for its first turns, in a body longer than
//! that (Codex's `input` ends near 20 KB, before its tools; Claude Code's first
//! `messages` near 11 KB, before its prompt and tools).

use std::borrow::Cow;
use std::cell::{Cell, OnceCell};
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde_json::value::RawValue;
use twox_hash::XxHash3_64;

use super::message::Facts;
use super::repeated::{self, Held, HELD_FROM};
use super::{json_body, DialectError, DialectKind, Message, RawMessage};
use crate::base::chunks::{Chunks, BLOCK, DIGESTED_FROM, DIGESTED_WHOLE_FROM};

/// The lengths of the leading bytes a memo is found by; a memo is kept under each one
/// its list reaches. Every session of one agent may share the shortest ones (Codex's
/// prompt is its first 17.7 KB), and a lead keeps only [`WAYS`] memos: the longer
/// ones tell sessions apart.
const LEADS: [usize; 6] = [
    DIGESTED_FROM / 4,
    DIGESTED_FROM / 2,
    DIGESTED_FROM,
    DIGESTED_WHOLE_FROM,
    2 << 20,
    16 << 20,
];

// A body shorter than the first lead past `DIGESTED_FROM` has its blocks past that
// digested late (`Chunks::reading`): its leads must all lie within it.
const _: () = assert!(LEADS[2] == DIGESTED_FROM && LEADS[3] == DIGESTED_WHOLE_FROM);

/// Memos kept under one lead hash.
const WAYS: u8 = 4;

/// Elements remembered, all memos together, and the bytes they may hold, unless
/// [`size_prefix_cache`] said otherwise before the first long body.
static ELEMENTS: AtomicUsize = AtomicUsize::new(1_000_000);
static BYTES: AtomicUsize = AtomicUsize::new(32 << 20);

/// Sets how many elements the memos hold in all (`store.prefix_cache_entries`) and
/// the bytes they may hold (half of `store.message_cache_bytes`); only the first long
/// body reads them, so call it at start.
pub fn size_prefix_cache(elements: usize, bytes: usize) {
    ELEMENTS.store(elements.max(1), Ordering::Relaxed);
    BYTES.store(bytes.max(1), Ordering::Relaxed);
}

/// One element of a remembered list.
#[derive(Clone)]
struct Mark {
    /// Where its bytes lay in the body.
    span: Range<usize>,
    facts: Arc<Facts>,
}

/// A body's list as read: its elements in order, and the digests of the bytes up to
/// the last one's end.
struct Memo {
    marks: Box<[Mark]>,
    /// The digest of each whole block before the last element's end.
    blocks: Box<[u128]>,
    /// The digest of the bytes from those blocks' end to the last element's end.
    rest: u128,
    /// Which of a lead's [`WAYS`] it is kept under.
    way: u8,
    /// The first element that is history a provider's compaction minted, if any: a
    /// body that reuses past it carries one, found without a look at each element.
    compacted_at: Option<usize>,
}

/// A memo's place: the dialect, which of [`LEADS`], the way, the lead's hash.
type Key = (u8, u8, u8, u64);

/// Weighs a memo by the bytes it holds, the facts of its elements included (shared
/// with the facts cache, but kept alive by the memo once that cache lets them go),
/// and each element at least a share of the budget, so the element limit holds too.
#[derive(Clone)]
struct ByBytes {
    /// The budget over the element limit.
    per_element: u64,
}

impl quick_cache::Weighter<Key, Arc<Memo>> for ByBytes {
    fn weight(&self, _key: &Key, memo: &Arc<Memo>) -> u64 {
        let facts: u64 = memo.marks.iter().map(|mark| mark.facts.bytes()).sum();
        let own = std::mem::size_of::<Memo>()
            + memo.marks.len() * std::mem::size_of::<Mark>()
            + memo.blocks.len() * std::mem::size_of::<u128>();
        let least = (memo.marks.len() as u64 + memo.blocks.len() as u64 / 4 + 1)
            .saturating_mul(self.per_element);
        (own as u64 + facts).max(least)
    }
}

struct Memos {
    /// Seeds the lead hashes, per process, as [`Chunks`] seeds its digests.
    seed: u64,
    cache: quick_cache::sync::Cache<Key, Arc<Memo>, ByBytes>,
}

/// Empties the memos of recent bodies: an erased conversation's leave no trace here.
pub(crate) fn clear() {
    memos().cache.clear();
}

fn memos() -> &'static Memos {
    static MEMOS: OnceLock<Memos> = OnceLock::new();
    MEMOS.get_or_init(|| {
        let elements = ELEMENTS.load(Ordering::Relaxed);
        let bytes = BYTES.load(Ordering::Relaxed) as u64;
        Memos {
            seed: RandomState::new().hash_one(0x7072_6566_6978_u64),
            // About a hundred elements a memo, as a starting size.
            cache: quick_cache::sync::Cache::with_weighter(
                (elements / 100).max(16),
                bytes,
                ByBytes {
                    per_element: (bytes / elements as u64).max(1),
                },
            ),
        }
    })
}

/// How many of `memo`'s leading elements `body` (whose block digests are `blocks`)
/// repeats byte for byte, with every byte before them.
fn agreed(memo: &Memo, body: &Chunks, blocks: &[u128]) -> usize {
    let same = memo
        .blocks
        .iter()
        .zip(blocks)
        .take_while(|(was, is)| was == is)
        .count();
    let last = memo.marks.last().map_or(0, |mark| mark.span.end);
    let from = same * BLOCK;
    if same == memo.blocks.len() && body.digest(from..last) == Some(memo.rest) {
        return memo.marks.len();
    }
    memo.marks
        .iter()
        .take_while(|mark| mark.span.end <= from)
        .count()
}

/// The elements a body takes from a memo, and the text serde reads instead.
struct Reuse {
    memo: Arc<Memo>,
    /// How many leading elements are the memo's.
    count: usize,
    /// Their bytes in this body, until [`Reading::messages`] moves them into its
    /// messages: a clone each would cost two atomic operations a message.
    raws: Cell<Vec<Bytes>>,
    /// The bytes cut out of the body: the reused elements and the comma after them.
    cut: Range<usize>,
    /// The body without `cut`, copied only when serde reads it as it is (nothing after
    /// the list is held out); checked as UTF-8 where serde reads it ([`Reading::json`]).
    text: OnceCell<Vec<u8>>,
}

impl Reuse {
    /// The cut that takes `memo`'s first `count` elements out of `body`, if what
    /// follows them is the list going on or ending.
    fn new(body: &Chunks, memo: Arc<Memo>, count: usize) -> Option<Self> {
        let start = memo.marks.first()?.span.start;
        let end = memo.marks.get(count.checked_sub(1)?)?.span.end;
        let next = |from: usize| {
            let at = body.position(from, |b| !b.is_ascii_whitespace())?;
            Some((at, body.byte(at)?))
        };
        let cut_end = match next(end)? {
            // `[a, ]` is not JSON; cut, it would read as `[ ]`.
            (comma, b',') if next(comma + 1)?.1 != b']' => comma + 1,
            (close, b']') => close,
            _ => return None,
        };
        let raws = body.slices(memo.marks[..count].iter().map(|mark| mark.span.clone()))?;
        Some(Self {
            memo,
            count,
            raws: Cell::new(raws),
            cut: start..cut_end,
            text: OnceCell::new(),
        })
    }

    /// The body without the cut, as one run of bytes.
    fn text(&self, body: &Chunks) -> &[u8] {
        self.text.get_or_init(|| {
            let mut text = Vec::with_capacity(body.len() - self.cut.len());
            body.copy_into(0..self.cut.start, &mut text);
            body.copy_into(self.cut.end..body.len(), &mut text);
            text
        })
    }

    /// [`repeated::hold`] of the text, read in place: the body before the cut, and
    /// after it when that lies in one frame. `Err` when it cannot be read in place (the
    /// part before the cut is long enough to hold a value itself, or the part after it
    /// spans frames), so the text is to be copied and held whole.
    fn hold_in_place(&self, body: &Chunks, keys: &[&'static str]) -> Result<Option<Held>, ()> {
        let head = body
            .single(0..self.cut.start)
            .filter(|head| head.len() < HELD_FROM);
        match (head, body.single(self.cut.end..body.len())) {
            (Some(head), Some(tail)) => Ok(repeated::hold_after_list(head, tail, keys)),
            _ => Err(()),
        }
    }
}

/// A request body being read, with the elements it repeats from a recent body
/// already known.
pub(super) struct Reading<'b> {
    body: &'b Chunks,
    kind: DialectKind,
    /// The body's block digests taken as it was read.
    blocks_read: Cow<'b, [u128]>,
    /// All of them, taken once when a reader needs more than those.
    blocks_all: OnceCell<Cow<'b, [u128]>>,
    /// The body's hash of each of [`LEADS`] it is long enough for, hashed when needed.
    leads: [OnceCell<u64>; LEADS.len()],
    reuse: Option<Reuse>,
    /// The cut text was refused and the body was read whole: nothing is reused.
    whole: Cell<bool>,
    /// Where the list lay, `[` to `]`, once its messages were read.
    span: Cell<Option<(usize, usize)>>,
    /// The text serde read with the values it repeats held out, when it had some.
    held: OnceCell<Held>,
    /// A message read is history a provider's compaction minted.
    compacted: Cell<bool>,
}

impl<'b> Reading<'b> {
    /// Starts reading `body` in `kind`, finding the memo it repeats the most of.
    pub(super) fn new(body: &'b Chunks, kind: DialectKind) -> Self {
        let mut reading = Self {
            body,
            kind,
            blocks_read: body.blocks_read(),
            blocks_all: OnceCell::new(),
            leads: Default::default(),
            reuse: None,
            whole: Cell::new(false),
            span: Cell::new(None),
            held: OnceCell::new(),
            compacted: Cell::new(false),
        };
        // A short body never touches the memos (nor makes them, on a small-only load).
        if body.len() < DIGESTED_FROM {
            return reading;
        }
        let memos = memos();
        for lead in (0..LEADS.len()).rev() {
            let Some(hash) = reading.lead(lead) else {
                continue;
            };
            let mut best: Option<(usize, Arc<Memo>)> = None;
            for way in 0..WAYS {
                let Some(memo) = memos.cache.get(&(kind as u8, lead as u8, way, hash)) else {
                    continue;
                };
                let count = agreed(&memo, body, reading.blocks(memo.blocks.len()));
                let all = count == memo.marks.len();
                if count > best.as_ref().map_or(0, |(most, _)| *most) {
                    best = Some((count, memo));
                }
                if all {
                    break;
                }
            }
            if let Some((count, memo)) = best {
                reading.reuse = Reuse::new(body, memo, count);
                if reading.reuse.is_some() {
                    break;
                }
            }
        }
        reading
    }

    /// The body's first `count` block digests, or all it has when fewer: those taken as
    /// it was read when they are enough (a mid-sized body's prompt and tools after its
    /// list are then never hashed as blocks).
    fn blocks(&self, count: usize) -> &[u128] {
        let blocks = if self.blocks_read.len() >= count {
            &self.blocks_read
        } else {
            self.blocks_all.get_or_init(|| self.body.blocks())
        };
        &blocks[..count.min(blocks.len())]
    }

    /// The body's hash of `LEADS[lead]` leading bytes (of their blocks' digests), if it
    /// has that many.
    fn lead(&self, lead: usize) -> Option<u64> {
        if LEADS[lead] > self.body.len() {
            return None;
        }
        let count = LEADS[lead] / BLOCK;
        let digests = Some(self.blocks(count)).filter(|digests| digests.len() == count)?;
        // Per tenant: no body finds (or times) another tenant's memo.
        let seed = memos().seed ^ crate::cache_scope::current();
        Some(*self.leads[lead].get_or_init(|| {
            let mut bytes = Vec::with_capacity(digests.len() * 16);
            digests
                .iter()
                .for_each(|digest| bytes.extend_from_slice(&digest.to_le_bytes()));
            XxHash3_64::oneshot_with_seed(seed, &bytes)
        }))
    }

    /// The body read as `W`: without the reused elements when there are some, so the
    /// list `W` holds is what follows them, and with the values under `keys` that
    /// repeat ones read before held out ([`Reading::member`] gives them).
    pub(super) fn json<'s, W: serde::Deserialize<'s>>(
        &'s self,
        keys: &[&'static str],
    ) -> Result<W, serde_json::Error> {
        if !self.whole.get() {
            let held = match &self.reuse {
                // Held in place: the prompt and tools after the list are not copied.
                Some(reuse) => reuse
                    .hold_in_place(self.body, keys)
                    .unwrap_or_else(|()| repeated::hold(reuse.text(self.body), keys)),
                None => repeated::hold(self.body.contiguous(), keys),
            };
            let held = held.map(|held| self.held.get_or_init(|| held));
            // Held values repeat bytes serde read: only the text around them is checked.
            let checked = match held {
                Some(held) => Some(held.text.as_str()),
                None => self
                    .text()
                    .and_then(|text| simdutf8::basic::from_utf8(text).ok()),
            };
            match checked.map(serde_json::from_str) {
                Some(Ok(wire)) => return Ok(wire),
                // The body as it came: its error is the answer.
                Some(Err(err)) if held.is_none() && self.reuse.is_none() => return Err(err),
                // A cut or held text refused, or not UTF-8: the body read whole names
                // the true place.
                _ => self.whole.set(true),
            }
        }
        json_body(self.body.contiguous())
    }

    /// The bytes serde reads before any value is held out: the cut text (copied now if
    /// it was not), or the body; `None` once the body is read whole.
    fn text(&self) -> Option<&[u8]> {
        if self.whole.get() {
            return None;
        }
        Some(match &self.reuse {
            Some(reuse) => reuse.text(self.body),
            None => self.body.contiguous(),
        })
    }

    /// Where the value held under `key` lies in the body, when one is.
    fn held_span(&self, key: &str) -> Option<Range<usize>> {
        let held = self.held.get().filter(|_| !self.whole.get())?;
        let span = held.span(key)?;
        let cut = self.reuse.as_ref().map_or(0..0, |reuse| reuse.cut.clone());
        // A held value is a top-level member: wholly before the cut or after it.
        let start = in_body(&cut, span.start)?;
        Some(start..start.checked_add(span.len())?)
    }

    /// The top-level value under `key` as the body holds it: the held one, else what
    /// serde read (`parsed`), which a later body that repeats it need not have read.
    /// UTF-8 either way; a held value is not checked again.
    pub(super) fn member(&self, key: &str, parsed: Option<Box<RawValue>>) -> Option<Cow<'_, [u8]>> {
        if let Some(span) = self.held_span(key) {
            return match self.body.single(span.clone()) {
                Some(value) => Some(Cow::Borrowed(value)),
                // Across frames: the one copy `slice` makes.
                None => self
                    .body
                    .slice(span)
                    .map(|value| Cow::Owned(Vec::from(value))),
            };
        }
        parsed.map(|raw| {
            repeated::remember(raw.get());
            Cow::Owned(Box::<str>::from(raw).into_string().into_bytes())
        })
    }

    /// The [`keyed_hash`](crate::base::chunks::keyed_hash) of the value under `key`
    /// when it was held out as a repeat: taken already, so no consumer takes it again.
    pub(crate) fn member_digest(&self, key: &str) -> Option<u128> {
        let held = self.held.get().filter(|_| !self.whole.get())?;
        held.digest(key)
    }

    /// [`Reading::member`] as bytes, shared with the body where they lie in one of its
    /// frames: an agent re-sends its tool list, tens of KB, on every turn.
    pub(crate) fn member_bytes(&self, key: &str, parsed: Option<Box<RawValue>>) -> Option<Bytes> {
        if let Some(span) = self.held_span(key) {
            return self.body.slice(span);
        }
        self.member(key, parsed)
            .map(|value| Bytes::from(value.into_owned()))
    }

    /// The list's messages: the reused ones, then `read` of each element of `list`
    /// (the list [`Reading::json`] gave), indexed in the whole list. Remembers the list
    /// for the next body.
    pub(super) fn messages(
        &self,
        list: &[&RawValue],
        mut read: impl FnMut(usize, RawMessage) -> Result<Message, DialectError>,
    ) -> Result<Vec<Message>, DialectError> {
        let reuse = self.reuse.as_ref().filter(|_| !self.whole.get());
        let reused = reuse.map_or(&[][..], |reuse| &reuse.memo.marks[..reuse.count]);
        let mut messages = Vec::with_capacity(reused.len() + list.len());
        if let Some(reuse) = reuse {
            let mut raws = reuse.raws.take();
            if raws.len() != reused.len() {
                // Read before: cut them again (Reuse::new cut them once, so they fit).
                raws = (self
                    .body
                    .slices(reused.iter().map(|mark| mark.span.clone())))
                .ok_or_else(|| DialectError::Shape {
                    index: 0,
                    rule: "the reused messages no longer fit the body".into(),
                })?;
            }
            messages.extend(reused.iter().zip(raws).map(|(mark, raw)| {
                Message::known(RawMessage::shared(raw), Arc::clone(&mark.facts))
            }));
            if reuse.memo.compacted_at.is_some_and(|at| at < reuse.count) {
                self.compacted.set(true);
            }
        }
        let mut spans = Vec::with_capacity(list.len());
        for (index, element) in list.iter().enumerate() {
            let span = self.span_of(reuse, element.get());
            let raw = match span.clone().and_then(|span| self.body.slice(span)) {
                Some(bytes) => RawMessage::shared(bytes),
                None => RawMessage::from(element.get().to_owned()),
            };
            let message = read(reused.len() + index, raw)?;
            if message.is_compacted_history() {
                self.compacted.set(true);
            }
            messages.push(message);
            spans.push(span);
        }
        let first = reused
            .first()
            .map(|mark| &mark.span)
            .or(spans.first().and_then(Option::as_ref));
        let last = spans
            .last()
            .and_then(Option::as_ref)
            .or(reused.last().map(|mark| &mark.span));
        if let (Some(first), Some(last)) = (first, last) {
            self.span.set(self.list_around(first.start, last.end));
        }
        self.remember(reuse, &messages[reused.len()..], &spans);
        Ok(messages)
    }

    /// True when a message [`Reading::messages`] read is history a provider's
    /// compaction minted ([`Message::is_compacted_history`]).
    pub(super) fn compacted_history(&self) -> bool {
        self.compacted.get()
    }

    /// The list's span in the body, `[` to `]`, once [`Reading::messages`] read a
    /// list with at least one element: what a rewritten body replaces.
    pub(crate) fn list_span(&self) -> Option<Range<usize>> {
        self.span.get().map(|(start, end)| start..end)
    }

    /// The `[`…`]` around the elements from `start` to `end`, whitespace between.
    fn list_around(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        let open = self.body.rposition(start, |b| !b.is_ascii_whitespace())?;
        let close = self.body.position(end, |b| !b.is_ascii_whitespace())?;
        (self.body.byte(open)? == b'[' && self.body.byte(close)? == b']')
            .then_some((open, close + 1))
    }

    /// Where `element` (borrowed from the text serde read) lies in the body.
    fn span_of(&self, reuse: Option<&Reuse>, element: &str) -> Option<Range<usize>> {
        let cut = reuse.map_or(0..0, |reuse| reuse.cut.clone());
        let held = self.held.get().filter(|_| !self.whole.get());
        let offset = match held {
            Some(held) => held.original_offset(
                (element.as_ptr() as usize).wrapping_sub(held.text.as_ptr() as usize),
            ),
            // Serde read the text itself: the cut text, or the body.
            None => {
                let text = match reuse {
                    Some(reuse) => reuse.text(self.body),
                    None => self.body.contiguous(),
                };
                (element.as_ptr() as usize).wrapping_sub(text.as_ptr() as usize)
            }
        };
        let start = in_body(&cut, offset)?;
        let span = start..start.checked_add(element.len())?;
        self.body
            .holds_at(span.start, element.as_bytes())
            .then_some(span)
    }

    /// Keeps this body's list for the next body that repeats it.
    fn remember(&self, reuse: Option<&Reuse>, fresh: &[Message], spans: &[Option<Range<usize>>]) {
        let ends = spans.iter().rev().find_map(|span| Some(span.as_ref()?.end));
        if self.body.len() < DIGESTED_FROM || ends.is_none_or(|end| end < LEADS[0]) {
            // No lead to keep it under.
            return;
        }
        let memos = memos();
        let reused = reuse.map_or(&[][..], |reuse| &reuse.memo.marks[..reuse.count]);
        let mut at = reused.last().map_or(0, |mark| mark.span.end);
        let mut marks = Vec::with_capacity(reused.len() + fresh.len());
        marks.extend_from_slice(reused);
        let mut compacted_at = reuse.and_then(|reuse| {
            (reuse.memo.compacted_at).filter(|&compacted| compacted < reuse.count)
        });
        for (message, span) in fresh.iter().zip(spans) {
            let Some(span) = span.clone().filter(|span| span.start >= at) else {
                break;
            };
            at = span.end;
            if compacted_at.is_none() && message.is_compacted_history() {
                compacted_at = Some(marks.len());
            }
            marks.push(Mark {
                span,
                facts: message.shared_facts(),
            });
        }
        let blocks = self.blocks(at / BLOCK);
        let whole = blocks.len();
        let Some(rest) = self.body.digest(whole * BLOCK..at) else {
            return;
        };
        // A body that repeats most of a memo continues its session and takes its way;
        // one that shares only a lead (a system prompt, a tool list) takes its own.
        let way = reuse
            .filter(|reuse| reuse.count * 2 >= reuse.memo.marks.len())
            .map_or((rest as u8) % WAYS, |reuse| reuse.memo.way);
        let memo = Arc::new(Memo {
            marks: marks.into_boxed_slice(),
            blocks: blocks.into(),
            rest,
            way,
            compacted_at,
        });
        for lead in (0..LEADS.len()).take_while(|&lead| LEADS[lead] <= at) {
            let Some(hash) = self.lead(lead) else {
                break;
            };
            let key = (self.kind as u8, lead as u8, way, hash);
            memos.cache.insert(key, Arc::clone(&memo));
        }
    }
}

/// Where byte `offset` of the text serde read before any value was held out lies in
/// the body, when that text is the body without `cut`.
fn in_body(cut: &Range<usize>, offset: usize) -> Option<usize> {
    if offset >= cut.start {
        offset.checked_add(cut.len())
    } else {
        Some(offset)
    }
}

#[cfg(test)]
#[path = "prefix_tests.rs"]
mod tests;
