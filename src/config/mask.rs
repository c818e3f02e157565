//! Masking of secrets in config output, so that `check-config` and `/handoff/config`
//! can be pasted into a bug report.

use serde_json::Value;

use super::Config;

const MASK: &str = "********";

/// The config as JSON with every secret replaced by a mask.
pub fn masked(config: &Config) -> Value {
    let mut value = serde_json::to_value(config).unwrap_or(Value::Null);
    mask_value(&mut value);
    value
}

fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key == "token"
        || key.ends_with("_token")
        || key.contains("api_key")
        || key.contains("apikey")
        || key.contains("secret")
        || key.contains("password")
        || key == "authorization"
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
            if let Some(clean) = mask_url_userinfo(text) {
                *text = clean;
            }
        }
        _ => {}
    }
}

/// `https://user:pass@host/x` becomes `https://********@host/x`.
fn mask_url_userinfo(text: &str) -> Option<String> {
    let (scheme, rest) = text.split_once("://")?;
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let at = rest[..authority_end].rfind('@')?;
    Some(format!("{scheme}://{MASK}{}", &rest[at..]))
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
        let text = masked(&config).to_string();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!text.contains("sk-live"), "{text}");
        assert!(!text.contains("sk-extra"), "{text}");
        assert!(text.contains("example.com/v1"), "{text}");
    }
}
