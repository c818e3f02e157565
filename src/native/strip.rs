//! The asks taken off a request handoff serves: the body's members that ask the API to
//! compact or edit its context (`context_management`, `compaction`), and the beta
//! flags that switch them on, so that an upstream without them reads a request it
//! knows. Everything else stays byte for byte.

use http::{HeaderMap, HeaderValue};
use serde_json::value::RawValue;

/// The beta flags of the asks handoff serves: an upstream without the feature may
/// refuse the flag as it refuses the field.
const BETAS: &[&str] = &["context-management-", "compact-", "compaction-"];

/// `body` without its top-level members named `names` (every occurrence, however the
/// key is spelled in JSON), the rest byte for byte; `None` when it has none of them.
pub(crate) fn without_members(body: &[u8], names: &[&str]) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    // One member out per pass: a duplicated key leaves another behind for the next.
    while let Some(span) = member_span(out.as_deref().unwrap_or(body), names) {
        let current = out.as_deref().unwrap_or(body);
        let mut next = Vec::with_capacity(current.len());
        next.extend_from_slice(&current[..span.0]);
        next.extend_from_slice(&current[span.1..]);
        out = Some(next);
    }
    out
}

/// The byte range of one `"name": value` member of `body` named in `names`, with the
/// comma that separated it from its neighbour.
fn member_span(body: &[u8], names: &[&str]) -> Option<(usize, usize)> {
    let members: Vec<(String, &RawValue)> = serde_json::from_slice::<Members<'_>>(body).ok()?.0;
    let (_, value) = members
        .iter()
        .find(|(key, _)| names.contains(&key.as_str()))?;
    // The raw value borrows from `body`: its place there is its address's offset.
    let start = (value.get().as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start + value.get().len();
    // Back over `: ` to the key's closing quote, then to its opening one: the key
    // decodes to a name without quotes, so its spelling holds no bare `"`.
    let colon = start - body[..start].iter().rev().position(|b| *b == b':')? - 1;
    let close = colon - body[..colon].iter().rev().position(|b| *b == b'"')? - 1;
    let open = close - body[..close].iter().rev().position(|b| *b == b'"')? - 1;
    let after = end + body[end..].iter().position(|b| !b.is_ascii_whitespace())?;
    if body[after] == b',' {
        let next = after + 1;
        let next = next
            + body[next..]
                .iter()
                .take_while(|b| b.is_ascii_whitespace())
                .count();
        return Some((open, next));
    }
    // The last member: the comma before it goes instead.
    let before = open
        - body[..open]
            .iter()
            .rev()
            .position(|b| !b.is_ascii_whitespace())?
        - 1;
    Some(if body[before] == b',' {
        (before, end)
    } else {
        (open, end)
    })
}

/// A JSON object's members in their order, their values unparsed.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Members<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Members<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Self::Value, M::Error> {
                let mut members = Vec::new();
                while let Some((key, value)) = map.next_entry::<String, &'de RawValue>()? {
                    members.push((key, value));
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// Takes the beta flags of the asks handoff serves out of `anthropic-beta` and
/// `openai-beta`; a header left with no flag goes.
pub(crate) fn strip_betas(headers: &mut HeaderMap) {
    for name in ["anthropic-beta", "openai-beta"] {
        let values: Vec<String> = (headers.get_all(name).iter())
            .filter_map(|v| v.to_str().ok())
            .map(str::to_owned)
            .collect();
        if values.is_empty() {
            continue;
        }
        let kept: Vec<&str> = (values.iter())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|flag| !flag.is_empty() && !BETAS.iter().any(|beta| flag.starts_with(beta)))
            .collect();
        headers.remove(name);
        if let Ok(value) = HeaderValue::from_str(&kept.join(",")) {
            if !kept.is_empty() {
                headers.insert(name, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stripped(body: &str) -> String {
        let out = without_members(body.as_bytes(), &["context_management", "compaction"]);
        String::from_utf8(out.unwrap_or_else(|| body.as_bytes().to_vec())).unwrap_or_default()
    }

    #[test]
    fn the_asks_go_and_every_other_byte_stays() {
        assert_eq!(
            stripped(r#"{"model":"m", "context_management" : {"edits":[]}, "messages":[]}"#),
            r#"{"model":"m", "messages":[]}"#
        );
        assert_eq!(
            stripped(
                r#"{"model":"m","messages":[{"a":"context_management"}],"context_management":[{"type":"compaction"}]}"#
            ),
            r#"{"model":"m","messages":[{"a":"context_management"}]}"#
        );
        // Another spelling of the key, and the key twice: both go.
        assert_eq!(
            stripped(r#"{"\u0063ompaction":{},"model":"m","compaction":null}"#),
            r#"{"model":"m"}"#
        );
        assert_eq!(stripped(r#"{"context_management":1}"#), "{}");
        assert!(without_members(br#"{"model":"m"}"#, &["compaction"]).is_none());
    }

    #[test]
    fn only_the_served_betas_go() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "anthropic-beta",
            HeaderValue::from_static(
                "context-management-2025-06-27, interleaved-thinking-2025-05-14,compact-2026-01-12",
            ),
        );
        headers.insert(
            "openai-beta",
            HeaderValue::from_static("compaction-2026-09-04"),
        );
        strip_betas(&mut headers);
        assert_eq!(
            headers.get("anthropic-beta").and_then(|v| v.to_str().ok()),
            Some("interleaved-thinking-2025-05-14")
        );
        assert!(headers.get("openai-beta").is_none());
    }
}
