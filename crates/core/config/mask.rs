//! Masking of secrets in config output, so that `check-config` and `/handoff/config`
//! can be pasted into a bug report.

use serde_json::Value;

use super::Config;
use std::borrow::Cow;

use crate::redact::{looks_like_secret, shown_url};

const MASK: &str = "********";

/// The config as JSON with every secret replaced by a mask.
pub fn masked(config: &Config) -> Value {
    let mut value = serde_json::to_value(config).unwrap_or(Value::Null);
    mask_value(&mut value);
    // An exporter's headers are a backend's credentials, whatever they are called.
    if let Some(Value::Object(headers)) = value.pointer_mut("/tracing/headers") {
        headers
            .values_mut()
            .for_each(|v| *v = Value::String(MASK.to_owned()));
    }
    value
}

fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase().replace('-', "_");
    key == "token"
        || key.ends_with("_token")
        || key.contains("api_key")
        || key.contains("apikey")
        || key.contains("secret")
        || key.contains("password")
        || key == "authorization"
        || key == "sha256"
}

fn mask_value(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if is_secret_key(key) && !child.is_null() {
                    *child = Value::String(MASK.to_owned());
                } else {
                    mask_value(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mask_value),
        Value::String(text) => {
            // By value too: a key pasted under an innocent name is still a key.
            if looks_like_secret(text) {
                *text = MASK.to_owned();
            } else if let Cow::Owned(clean) = shown_url(text) {
                *text = clean;
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_token_and_url_credentials_are_masked() {
        let mut config = Config::default();
        config.admin.token = Some("hunter2".into());
        config.upstream.base_url = "https://me:sk-live@example.com/v1".into();
        config
            .compaction
            .summary_request_extra
            .insert("api_key".into(), "sk-extra".into());
        config
            .compaction
            .summary_request_extra
            .insert("api-key".into(), "plain-value-1".into());
        config
            .compaction
            .summary_request_extra
            .insert("user".into(), "sk-ant-api03-pasted".into());
        let text = masked(&config).to_string();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!text.contains("sk-live"), "{text}");
        assert!(!text.contains("sk-extra"), "{text}");
        assert!(
            !text.contains("plain-value-1"),
            "masked by key name: {text}"
        );
        assert!(!text.contains("sk-ant-api03"), "masked by value: {text}");
        assert!(text.contains("example.com/v1"), "{text}");
    }
}
