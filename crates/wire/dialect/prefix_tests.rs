use crate::dialect::Parsing;
use bytes::Bytes;
use serde_json::{json, Value};

use super::*;
use crate::dialect::ChatRequest;

/// A chat body of `turns` turns, each tool result `size` bytes, opened by a system
/// message naming `session` (so tests running at once never share a memo).
fn body(session: &str, turns: usize, size: usize) -> Value {
    let mut messages = vec![json!({"role": "system", "content": format!("session {session}")})];
    for turn in 0..turns {
        let id = format!("call_{turn}");
        messages.push(json!({"role": "user", "content": format!("step {turn}")}));
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "read", "arguments": "{}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": "x".repeat(size)}));
    }
    // Keys print sorted: `max_tokens` comes before the list, the others after it.
    json!({"max_tokens": 100, "model": "m", "messages": messages, "stream": false})
}

fn bytes(value: &Value) -> Chunks {
    Chunks::from(Bytes::from(value.to_string()))
}

/// `value`'s text cut into frames of `size` bytes, as a body may arrive.
fn frames(value: &Value, size: usize) -> Chunks {
    let text = Bytes::from(value.to_string());
    let mut chunks = Chunks::reading(None);
    for start in (0..text.len()).step_by(size) {
        chunks.push(text.slice(start..(start + size).min(text.len())));
    }
    chunks
}

/// `value`'s text in frames of `size` bytes, its length declared as a client's
/// `Content-Length` declares it.
fn declared(value: &Value, size: usize) -> Chunks {
    let text = Bytes::from(value.to_string());
    let mut chunks = Chunks::reading(Some(text.len() as u64));
    for start in (0..text.len()).step_by(size) {
        chunks.push(text.slice(start..(start + size).min(text.len())));
    }
    chunks
}

/// What reading `body` gives: each message's bytes and digest, and how many came from
/// a memo.
fn read(body: &Chunks) -> (Vec<(String, crate::base::digest::MessageDigest)>, usize) {
    let reading = Reading::new(body, DialectKind::OpenAiChat);
    #[derive(serde::Deserialize)]
    struct Wire<'a> {
        #[serde(borrow)]
        messages: Vec<&'a RawValue>,
    }
    let wire: Wire<'_> = reading.json(&[]).expect("reads");
    let reused = reading.reuse.as_ref().map_or(0, |reuse| reuse.count);
    let messages = reading
        .messages(&wire.messages, |index, raw| {
            Message::from_raw(index, raw, DialectKind::OpenAiChat)
        })
        .expect("messages");
    let seen = messages
        .iter()
        .map(|m| (m.raw.get().to_owned(), m.digest()))
        .collect();
    (seen, reused)
}

/// Each message's bytes and digest, read from scratch.
fn expected(body: &Value) -> Vec<(String, crate::base::digest::MessageDigest)> {
    body["messages"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|m| (m.to_string(), crate::base::digest::message_digest(m)))
        .collect()
}

#[test]
fn a_long_body_sent_again_takes_every_message_from_its_memo() {
    let first = body("again", 40, 2000);
    let (seen, reused) = read(&bytes(&first));
    assert_eq!((seen, reused), (expected(&first), 0));
    let (seen, reused) = read(&bytes(&first));
    assert_eq!(reused, 121, "system + 40 turns of three");
    assert_eq!(seen, expected(&first));
}

#[test]
fn the_next_turn_reuses_the_last_body_and_reads_only_what_it_added() {
    let mut next = body("grows", 40, 2000);
    read(&bytes(&next));
    let list = next["messages"].as_array_mut().expect("a list");
    list.push(json!({"role": "assistant", "content": "done"}));
    list.push(json!({"role": "user", "content": "and now?"}));
    let (seen, reused) = read(&bytes(&next));
    assert_eq!(reused, 121);
    assert_eq!(seen, expected(&next));
    // And the turn after reuses that one whole.
    let (_, reused) = read(&bytes(&next));
    assert_eq!(reused, 123);
}

/// How many of `before`'s messages `after` repeats with every byte before them, in
/// whole blocks: what a memo of `before` may give `after`.
fn repeated(before: &Value, after: &Value) -> usize {
    let (was, is) = (before.to_string(), after.to_string());
    let same = was
        .bytes()
        .zip(is.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    let agreed = same / crate::base::chunks::BLOCK * crate::base::chunks::BLOCK;
    let mut at = 0;
    before["messages"]
        .as_array()
        .expect("a list")
        .iter()
        .take_while(|message| {
            let text = message.to_string();
            at = was[at..]
                .find(&text)
                .map_or(usize::MAX, |found| at + found + text.len());
            at <= agreed
        })
        .count()
}

#[test]
fn a_message_edited_in_the_middle_ends_the_reuse_there() {
    let first = body("edited", 40, 2000);
    read(&bytes(&first));
    let mut edited = first.clone();
    edited["messages"][60]["content"] = json!("x".repeat(1999) + "y");
    let (seen, reused) = read(&bytes(&edited));
    // Up to the block the edit falls in: a few messages short of the edited one.
    assert_eq!(reused, repeated(&first, &edited));
    assert!((55..=60).contains(&reused), "{reused}");
    assert_eq!(seen, expected(&edited));
}

#[test]
fn a_field_changed_before_the_list_reuses_nothing() {
    let first = body("before", 40, 2000);
    read(&bytes(&first));
    let mut other = first.clone();
    other["max_tokens"] = json!(200);
    let (seen, reused) = read(&bytes(&other));
    assert_eq!(reused, 0);
    assert_eq!(seen, expected(&other));
}

#[test]
fn a_field_changed_after_the_list_still_reuses_every_message() {
    let first = body("after", 40, 2000);
    read(&bytes(&first));
    let mut other = first.clone();
    other["stream"] = json!(true);
    let (seen, reused) = read(&bytes(&other));
    assert_eq!(reused, 121);
    assert_eq!(seen, expected(&other));
}

#[test]
fn a_short_body_is_not_remembered() {
    let short = body("short", 2, 100);
    read(&bytes(&short));
    assert_eq!(read(&bytes(&short)).1, 0);
}

/// The error the dialect gives for `text`, and the one serde gives reading it whole.
fn errors(text: impl Into<Vec<u8>>) -> (String, String) {
    let text = text.into();
    let whole = serde_json::from_slice::<Value>(&text).expect_err("not JSON");
    // In two frames: the error's place is the body's, not a frame's.
    let text = Bytes::from(text);
    let mut body = Chunks::from(text.slice(..text.len() / 2));
    body.push(text.slice(text.len() / 2..));
    let dialect = crate::dialect::openai::OpenAiChat
        .parse_body(&body)
        .map(|_: ChatRequest| ())
        .expect_err("refused");
    (dialect.to_string(), whole.to_string())
}

#[test]
fn a_broken_tail_after_reused_messages_is_refused_where_it_breaks() {
    let first = body("broken", 40, 2000);
    let text = first.to_string();
    crate::dialect::openai::OpenAiChat
        .parse_body(&Chunks::from(Bytes::from(text.clone())))
        .expect("reads");
    // A trailing comma: cut out with the messages before it, it would read as `[]`.
    let cut = text.rfind(']').expect("the list ends");
    let trailing = format!("{}, ]{}", &text[..cut], &text[cut + 1..]);
    let (dialect, whole) = errors(trailing);
    assert!(dialect.ends_with(&whole), "{dialect} / {whole}");
    // Broken JSON after the reused messages names its place in the whole body.
    let broken = format!("{},{{\"role\":]{}", &text[..cut], &text[cut + 1..]);
    let (dialect, whole) = errors(broken);
    assert!(dialect.ends_with(&whole), "{dialect} / {whole}");
    // A byte that is not UTF-8 in what serde reads past the reused messages.
    let mut invalid = text.as_bytes()[..cut].to_vec();
    invalid.extend_from_slice(br#",{"role":"user","content":"bad "#);
    invalid.push(0xff);
    invalid.extend_from_slice(br#""}"#);
    invalid.extend_from_slice(&text.as_bytes()[cut..]);
    let (dialect, whole) = errors(invalid);
    assert!(whole.contains("invalid unicode"), "{whole}");
    assert!(dialect.ends_with(&whole), "{dialect} / {whole}");
}

#[test]
fn a_body_in_frames_reads_as_the_same_body_in_one() {
    for (session, size) in [
        ("frames-7", 7),
        ("frames-1000", 1000),
        ("frames-4099", 4099),
    ] {
        let mut body = body(session, 40, 2000);
        let (seen, reused) = read(&frames(&body, size));
        assert_eq!((seen, reused), (expected(&body), 0), "{size}");
        // Sent again in other frames, every message comes from the memo.
        let (seen, reused) = read(&frames(&body, size + 13));
        assert_eq!(reused, 121, "{size}");
        assert_eq!(seen, expected(&body), "{size}");
        // The next turn, in one frame, reuses what the framed body left.
        let list = body["messages"].as_array_mut().expect("a list");
        list.push(json!({"role": "user", "content": "and now?"}));
        let (seen, reused) = read(&bytes(&body));
        assert_eq!(reused, 121, "{size}");
        assert_eq!(seen, expected(&body), "{size}");
        // An edit in the middle (past the lead the memo is found by), in frames, ends
        // the reuse where it is.
        let before = body.clone();
        body["messages"][60]["content"] = json!("y".repeat(2000));
        let (seen, reused) = read(&frames(&body, size));
        assert_eq!(reused, repeated(&before, &body), "{size}");
        assert!((55..=60).contains(&reused), "{reused}");
        assert_eq!(seen, expected(&body), "{size}");
    }
}

#[test]
fn a_list_that_ends_before_32_kb_in_a_longer_body_is_remembered() {
    let tools = json!([{"type": "function", "function": {
        "name": "shell", "description": "t".repeat(24_000)}}]);
    // The list opens the body and ends near 20 KB (Codex's shape) or 11 KB (Claude
    // Code's first turns); the tools follow it.
    for (session, turns) in [("early-20", 6), ("early-11", 3)] {
        let mut first = body(session, turns, 3000);
        first["tools"] = tools.clone();
        let text = first.to_string();
        let list_end = text.find(r#""stream""#).expect("after the list");
        assert!((LEADS[0]..DIGESTED_FROM).contains(&list_end), "{list_end}");
        assert!(text.len() > DIGESTED_FROM);
        assert_eq!(read(&bytes(&first)).1, 0);
        let all = 1 + 3 * turns;
        let (seen, reused) = read(&bytes(&first));
        assert_eq!((seen, reused), (expected(&first), all), "{session}");
        // The next turn reads only what it added.
        first["messages"]
            .as_array_mut()
            .expect("a list")
            .push(json!({"role": "user", "content": "next"}));
        let (seen, reused) = read(&bytes(&first));
        assert_eq!((seen, reused), (expected(&first), all), "{session}");
    }
    // A list that ends before the shortest lead is not remembered.
    let mut short = body("early-short", 1, 3000);
    short["tools"] = tools;
    assert!(short.to_string().find(r#""stream""#) < Some(LEADS[0]));
    read(&bytes(&short));
    assert_eq!(read(&bytes(&short)).1, 0);
}

#[test]
fn values_after_the_list_are_held_without_copying_the_text_around_them() {
    let mut first = body("in-place", 40, 1000);
    first["tools"] = json!([{"type": "function", "function": {
        "name": "in-place", "description": "t".repeat(4000)}}]);
    let dialect = crate::dialect::openai::OpenAiChat;
    dialect.parse_body(&bytes(&first)).expect("reads");
    first["messages"]
        .as_array_mut()
        .expect("a list")
        .push(json!({"role": "user", "content": "next"}));
    let tools = first["tools"].to_string();
    // In one frame, the text after the cut is read in place; in frames, it is copied.
    // (The second reading finds the memo the first one left, one message longer.)
    let readings = [
        (bytes(&first), true, 121),
        (frames(&first, 4099), false, 122),
    ];
    for (body, in_place, reused) in readings {
        let reading = Reading::new(&body, DialectKind::OpenAiChat);
        #[derive(serde::Deserialize)]
        struct Wire<'a> {
            #[serde(borrow)]
            messages: Vec<&'a RawValue>,
        }
        let wire: Wire<'_> = reading.json(&["tools"]).expect("reads");
        let messages = reading
            .messages(&wire.messages, |index, raw| {
                Message::from_raw(index, raw, DialectKind::OpenAiChat)
            })
            .expect("messages");
        let reuse = reading.reuse.as_ref().expect("the memo's messages");
        assert_eq!(reuse.count, reused);
        assert_eq!(reuse.text.get().is_none(), in_place, "{in_place}");
        let held = reading.member_bytes("tools", None).expect("held");
        assert_eq!(held, tools.as_bytes(), "{in_place}");
        let seen: Vec<_> = messages
            .iter()
            .map(|m| (m.raw.get().to_owned(), m.digest()))
            .collect();
        assert_eq!(seen, expected(&first), "{in_place}");
    }
}

#[test]
fn a_mid_sized_body_finds_its_memo_with_the_blocks_past_its_leads_digested_late() {
    // About 100 KB: under the length whose blocks are all digested as they arrive, so
    // the blocks past the first 32 KB are digested when the memo is compared and kept.
    let first = body("late", 40, 2300);
    let length = first.to_string().len();
    assert!(length > 3 * DIGESTED_FROM && length < crate::base::chunks::DIGESTED_WHOLE_FROM);
    let (seen, reused) = read(&declared(&first, 16_384));
    assert_eq!((seen, reused), (expected(&first), 0));
    let mut next = first.clone();
    if let Some(messages) = next["messages"].as_array_mut() {
        messages.push(json!({"role": "user", "content": "and then?"}));
    }
    let (seen, reused) = read(&declared(&next, 16_384));
    assert_eq!(reused, 121, "system + 40 turns of three");
    assert_eq!(seen, expected(&next));
}
