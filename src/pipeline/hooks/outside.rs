//! A request's text outside its messages, for the hooks ([`HookRequest::outside`]):
//! each top-level member that holds a string, as `{"field", "value"}`. A model reads
//! tool descriptions, a `prediction` or a schema as surely as a message, so a hook
//! looking for a secret must see them.
//!
//! [`HookRequest::outside`]: handoff_plugin_api::HookRequest::outside

use std::fmt;
use std::sync::Arc;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::error::ApiError;

/// Each top-level member of `body` (one JSON object) that holds a string, but its
/// `model` and those `in_messages` says the messages carry, in body order; a member
/// the body gives twice is shown twice, as an upstream may read either.
pub(super) fn of_body(
    body: &[u8],
    in_messages: impl Fn(&str) -> bool,
) -> Result<Vec<Arc<Value>>, ApiError> {
    let Members(members) = serde_json::from_slice(body).map_err(|err| {
        ApiError::invalid_request(
            "invalid_json",
            format!("the body is not one UTF-8 JSON object: {err}"),
        )
    })?;
    let mut out = Vec::new();
    for (name, raw) in members {
        // A member without a quote holds no string (numbers, booleans, null).
        if name == "model" || in_messages(&name) || !raw.get().contains('"') {
            continue;
        }
        let value: Value = serde_json::from_str(raw.get()).map_err(|err| {
            ApiError::invalid_request("invalid_json", format!("the body's {name:?}: {err}"))
        })?;
        out.push(Arc::new(json!({"field": name, "value": value})));
    }
    Ok(out)
}

/// [`of_body`] of a body already parsed (a summary call's).
pub(super) fn of_value(body: &Value, in_messages: impl Fn(&str) -> bool) -> Vec<Arc<Value>> {
    let Some(members) = body.as_object() else {
        return Vec::new();
    };
    members
        .iter()
        .filter(|(name, value)| *name != "model" && !in_messages(name) && holds_string(value))
        .map(|(name, value)| Arc::new(json!({"field": name, "value": value})))
        .collect()
}

fn holds_string(value: &Value) -> bool {
    match value {
        Value::String(_) => true,
        Value::Array(items) => items.iter().any(holds_string),
        Value::Object(fields) => fields.values().any(holds_string),
        _ => false,
    }
}

/// An object's members in order, their values unparsed, a repeated name kept.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Each;
        impl<'de> Visitor<'de> for Each {
            type Value = Members<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some(member) = map.next_entry::<String, &'de RawValue>()? {
                    out.push(member);
                }
                Ok(Members(out))
            }
        }
        deserializer.deserialize_map(Each)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn every_member_holding_text_is_shown_but_the_model_and_the_messages() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],
            "tools":[{"type":"function","function":{"name":"f","description":"key sk-1"}}],
            "prediction":{"type":"content","content":"old"},"temperature":0.2,
            "tools":[]}"#;
        let shown = of_body(body, |name| name == "messages").unwrap();
        let fields: Vec<&str> = shown.iter().map(|m| m["field"].as_str().unwrap()).collect();
        assert_eq!(
            fields,
            ["tools", "prediction"],
            "an empty repeat holds no text"
        );
        assert_eq!(shown[0]["value"][0]["function"]["description"], "key sk-1");
        let value = json!({"model": "m", "messages": [], "max_tokens": 9, "stop": ["x"]});
        let from_value = of_value(&value, |name| name == "messages");
        assert_eq!(*from_value[0], json!({"field": "stop", "value": ["x"]}));
        assert_eq!(from_value.len(), 1);
    }

    #[test]
    fn a_body_that_is_not_an_object_is_refused() {
        assert!(of_body(b"[1]", |_| false).is_err());
        assert!(of_body(b"{\"a\":", |_| false).is_err());
    }
}
