use super::*;
use crate::base::chunks::Chunks;
use crate::dialect::anthropic::AnthropicMessages;
use crate::dialect::openai::OpenAiChat;
use crate::dialect::ChatRequest;
use crate::dialect::Parsing;

/// The original bytes of the value `held` holds under `key`.
fn value<'t>(held: &Held, original: &'t [u8], key: &str) -> Option<&'t [u8]> {
    original.get(held.span(key)?)
}

fn members(text: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    top_members(text.as_bytes(), |key, start| {
        let end = value_end(text.as_bytes(), start)?;
        out.push((
            String::from_utf8_lossy(key).into_owned(),
            text[start..end].to_owned(),
        ));
        Some(end)
    })
    .then_some(out)
}

#[test]
fn members_are_found_past_strings_that_look_like_structure() {
    let text = r#" { "a" : "x\"}],{\\" , "tools":[{"d":"]}\"["},[1,{}]] ,"n":-1.5e3,"t":true,"o":{"k":[]}}"#;
    let found = members(text).unwrap();
    let keys: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a", "tools", "n", "t", "o"]);
    assert_eq!(found[0].1, r#""x\"}],{\\""#);
    assert_eq!(found[1].1, r#"[{"d":"]}\"["},[1,{}]]"#);
    assert_eq!(found[2].1, "-1.5e3");
    assert_eq!(found[4].1, r#"{"k":[]}"#);
    assert_eq!(members("{}").unwrap(), vec![]);
    for broken in [
        "[1]",
        r#"{"a":[1}"#,
        r#"{"a" 1}"#,
        r#"{"a":"x}"#,
        r#"{"a":1"#,
    ] {
        assert!(members(broken).is_none(), "{broken}");
    }
}

#[test]
fn only_values_serde_read_before_are_held_and_offsets_map_back() {
    let tools = format!(r#"[{{"name":"a","description":"{}"}}]"#, "t".repeat(2000));
    let system = format!(r#""{}""#, "s".repeat(1500));
    let text = format!(r#"{{"system":{system},"messages":[{{"role":"user"}}],"tools":{tools}}}"#);
    assert!(
        hold(text.as_bytes(), &["system", "tools"]).is_none(),
        "nothing read yet"
    );
    remember(&tools);
    let held = hold(text.as_bytes(), &["system", "tools"]).unwrap();
    assert_eq!(
        held.text,
        format!(r#"{{"system":{system},"messages":[{{"role":"user"}}],"tools":[]}}"#)
    );
    assert_eq!(
        value(&held, text.as_bytes(), "tools"),
        Some(tools.as_bytes())
    );
    assert_eq!(value(&held, text.as_bytes(), "system"), None);

    remember(&system);
    let held = hold(text.as_bytes(), &["system", "tools"]).unwrap();
    assert_eq!(
        held.text,
        r#"{"system":"","messages":[{"role":"user"}],"tools":[]}"#
    );
    let user = held.text.find(r#"{"role""#).unwrap();
    assert_eq!(
        &text[held.original_offset(user)..][..15],
        r#"{"role":"user"}"#
    );
    // Not a key it was asked for; a value one byte off is not the one read.
    assert!(hold(text.as_bytes(), &["instructions"]).is_none());
    let other = text.replace("tttt\"", "tttu\"");
    assert!(hold(other.as_bytes(), &["tools"]).is_none());
}

/// True when `part` lies inside `body`'s one buffer: shared, not copied.
fn shares(body: &Chunks, part: Option<&[u8]>) -> bool {
    let (whole, part) = (body.contiguous(), part.unwrap_or_default());
    let start = whole.as_ptr() as usize;
    let at = part.as_ptr() as usize;
    !part.is_empty() && at >= start && at + part.len() <= start + whole.len()
}

/// An Anthropic body with a system prompt and tools named after `tag`, and `rest`
/// after the tools.
fn agent_body(tag: &str, messages: &str, rest: &str) -> Chunks {
    let tools = format!(
        r#"[{{"name":"{tag}","description":"{}","input_schema":{{"type":"object"}}}}]"#,
        "d\\\"]}".repeat(400)
    );
    let system = format!(r#""{tag} {}""#, "s".repeat(2000));
    Chunks::from(
        format!(r#"{{"model":"m","messages":{messages},"system":{system},"tools":{tools}{rest}}}"#)
            .into_bytes(),
    )
}

#[test]
fn a_repeated_system_and_tools_read_as_the_first_time_and_errors_keep_their_place() {
    let messages = r#"[{"role":"user","content":"hi"},{"role":"assistant","content":"yes"},{"role":"user","content":"go"}]"#;
    let first = AnthropicMessages
        .parse_body(&agent_body("held-a", messages, ""))
        .unwrap();
    let body = agent_body("held-a", messages, r#","max_tokens":7"#);
    let held = hold(body.contiguous(), &["system", "tools"]).expect("both repeat the first body's");
    assert!(
        held.text.contains(r#""system":"","tools":[]"#),
        "{}",
        held.text
    );

    let again = AnthropicMessages.parse_body(&body).unwrap();
    assert_eq!(again.tools, first.tools);
    assert!(again
        .tools
        .as_deref()
        .unwrap()
        .starts_with(br#"[{"name":"held-a""#));
    assert!(
        shares(&body, again.tools.as_deref()),
        "held tools are not copied"
    );
    assert_eq!(again.max_output, Some(7));
    let raws = |request: &ChatRequest| -> Vec<String> {
        request
            .messages
            .iter()
            .map(|m| m.raw.get().to_owned())
            .collect()
    };
    assert_eq!(raws(&again), raws(&first));
    assert!(
        raws(&again)[0].contains("held-a ssss"),
        "the system prompt is the first message"
    );

    // Broken after the held values: the error is the whole body's, at its true place.
    let broken = agent_body("held-a", messages, r#","max_tokens":7,"#);
    let whole: Result<serde_json::Value, _> = serde_json::from_slice(broken.contiguous());
    let column = whole.unwrap_err().column();
    let err = AnthropicMessages
        .parse_body(&broken)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("column {column}")),
        "{err} (column {column})"
    );
}

#[test]
fn bytes_beside_held_values_that_are_not_utf8_are_refused_where_they_are() {
    let messages = r#"[{"role":"user","content":"fine"}]"#;
    AnthropicMessages
        .parse_body(&agent_body("held-e", messages, ""))
        .unwrap();
    let fine = agent_body("held-e", messages, "");
    assert!(hold(fine.contiguous(), &["system", "tools"]).is_some());
    for at in ["fine", "\"tools\""] {
        let mut broken = fine.contiguous().to_vec();
        let place = fine
            .contiguous()
            .windows(at.len())
            .position(|window| window == at.as_bytes())
            .unwrap();
        // Inside a message, and inside the key between the held values.
        broken[place + 1] = 0xff;
        let whole = serde_json::from_slice::<serde_json::Value>(&broken).unwrap_err();
        assert!(hold(&broken, &["system", "tools"]).is_none(), "{at}");
        let err = AnthropicMessages
            .parse_body(&Chunks::from(broken))
            .unwrap_err()
            .to_string();
        assert!(err.ends_with(&whole.to_string()), "{err} / {whole}");
    }
}

#[test]
fn a_text_cut_inside_its_list_is_held_as_the_joined_text_would_be() {
    let tools = format!(
        r#"[{{"name":"cut-a","description":"{}"}}]"#,
        "t".repeat(2000)
    );
    let system = format!(r#""cut-a {}""#, "s".repeat(1500));
    remember(&tools);
    remember(&system);
    let elements = [
        r#"{"role":"user","content":"a ]}\" ["}"#,
        r#"{"role":"user","content":[{"x":"}"}]}"#,
    ];
    let text = format!(
        r#"{{"model":"m","messages":[{},{}],"system":{system},"tools":{tools},"n":1}}"#,
        elements[0], elements[1]
    );
    let first = text.find(elements[0]).unwrap();
    let second = text.find(elements[1]).unwrap();
    let close = second + elements[1].len();
    // The first element cut (the list goes on), or both (the tail opens at `]`).
    for tail_from in [second, close] {
        let (head, tail) = (&text.as_bytes()[..first], &text.as_bytes()[tail_from..]);
        let joined = [head, tail].concat();
        let whole = hold(&joined, &["system", "tools"]).unwrap();
        let cut = hold_after_list(head, tail, &["system", "tools"]).unwrap();
        assert_eq!(cut.text, whole.text);
        assert!(
            cut.text.contains(r#""system":"","tools":[],"n":1}"#),
            "{}",
            cut.text
        );
        for key in ["system", "tools"] {
            assert_eq!(cut.span(key), whole.span(key), "{key}");
            assert_eq!(cut.digest(key), whole.digest(key), "{key}");
        }
        assert_eq!(value(&cut, &joined, "tools"), Some(tools.as_bytes()));
    }
    // A tail that never closes its list, or holds nothing, gives nothing.
    let head = &text.as_bytes()[..first];
    assert!(hold_after_list(head, &text.as_bytes()[second..close], &["tools"]).is_none());
    assert!(hold_after_list(head, &text.as_bytes()[second..], &["other"]).is_none());
}

#[test]
fn a_value_is_held_only_at_the_top_level_under_its_key() {
    let first = agent_body("held-b", "[]", "");
    AnthropicMessages.parse_body(&first).unwrap();
    let text = std::str::from_utf8(first.contiguous()).unwrap();
    let tools = &text[text.find(r#""tools":"#).unwrap() + 8..text.len() - 1];
    // The same bytes inside a message, and under another key, are read as usual.
    let inside = format!(r#"{{"model":"m","messages":[{{"role":"user","content":{tools}}}]}}"#);
    assert!(hold(inside.as_bytes(), &["tools"]).is_none());
    let other = format!(r#"{{"model":"m","messages":[],"metadata":{tools}}}"#);
    assert!(hold(other.as_bytes(), &["tools"]).is_none());
    let top = format!(r#"{{"model":"m","messages":[],"tools":{tools}}}"#);
    assert!(hold(top.as_bytes(), &["tools"]).is_some());
}

#[test]
fn a_long_body_takes_its_repeated_messages_and_values_both() {
    let turn = |n: usize| {
        format!(
            r#"{{"role":"user","content":"{n} {}"}},{{"role":"assistant","content":"ok {n}"}}"#,
            "w".repeat(1000)
        )
    };
    let list = |turns: usize| format!("[{}]", (0..turns).map(turn).collect::<Vec<_>>().join(","));
    let first = AnthropicMessages
        .parse_body(&agent_body("held-c", &list(40), ""))
        .unwrap();
    let longer = agent_body("held-c", &list(41), "");
    let again = AnthropicMessages.parse_body(&longer).unwrap();
    assert_eq!(again.tools, first.tools);
    // Held in the text cut around the reused messages, and found in the body past them.
    assert!(shares(&longer, again.tools.as_deref()));
    assert_eq!(again.messages.len(), first.messages.len() + 2);
    let text = std::str::from_utf8(longer.contiguous()).unwrap();
    let span = again.list.clone().unwrap();
    assert!(text[span].starts_with(r#"[{"role":"user","content":"0 www"#));
    for message in &again.messages[1..] {
        let raw = message.raw.get();
        assert!(
            text.contains(raw) && raw.starts_with('{') && raw.ends_with('}'),
            "{raw}"
        );
    }
}

#[test]
fn messages_after_a_held_value_keep_their_places() {
    let tools = format!(
        r#"[{{"type":"function","function":{{"name":"held-d","description":"{}"}}}}]"#,
        "x".repeat(3000)
    );
    let body = |turns: usize| {
        let list: Vec<String> = (0..turns)
            .map(|n| format!(r#"{{"role":"user","content":"{n} {}"}}"#, "v".repeat(900)))
            .collect();
        Chunks::from(format!(r#"{{"tools":{tools},"messages":[{}]}}"#, list.join(",")).into_bytes())
    };
    for turns in [3, 4, 50, 51] {
        let body = body(turns);
        let request = OpenAiChat.parse_body(&body).unwrap();
        let text = std::str::from_utf8(body.contiguous()).unwrap();
        assert_eq!(request.tools.as_deref(), Some(tools.as_bytes()));
        assert!(
            turns == 3 || shares(&body, request.tools.as_deref()),
            "{turns}"
        );
        let span = request.list.clone().expect("the list's place");
        assert!(text[span.clone()].starts_with(r#"[{"role":"user","content":"0 vvv"#));
        assert_eq!(span.end, text.len() - 1);
    }
}
