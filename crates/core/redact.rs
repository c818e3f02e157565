//! Keeping secrets and terminal tricks out of what handoff writes for people: error
//! texts that quote key fragments (an upstream's 401 does), URLs with credentials, and
//! client-set strings carrying control characters.

use std::borrow::Cow;
use std::sync::{OnceLock, RwLock};

use regex::Regex;

/// What a scrubbed secret is replaced by.
pub(crate) const REDACTED: &str = "[redacted]";

fn key_pattern() -> Option<&'static Regex> {
    static PATTERN: OnceLock<Option<Regex>> = OnceLock::new();
    PATTERN
        .get_or_init(|| {
            // Provider key shapes (sk-…, sk-ant-…, sk-proj-…, xai-…, gsk_…, AIza…, hf_…),
            // masked ones included (sk-proj-****abcd), and bearer tokens of any shape.
            Regex::new(
                r"(?i)\bbearer\s+[^\s,;]+|\b(?:sk|pk|rk|xai|gsk|hf|key)[-_][A-Za-z0-9_*\-.]{4,}|\bAIza[0-9A-Za-z_\-]{10,}",
            )
            .ok()
        })
        .as_ref()
}

/// Values shorter than this are not scrubbed by value: they would match ordinary text.
const MIN_SECRET: usize = 8;

/// The credential values handoff was configured with (proxy keys, upstream keys),
/// scrubbed by value from everything it writes, whatever their shape.
fn known() -> &'static RwLock<Vec<String>> {
    static KNOWN: OnceLock<RwLock<Vec<String>>> = OnceLock::new();
    KNOWN.get_or_init(RwLock::default)
}

/// Adds `value` to the secrets scrubbed by value everywhere.
pub fn register_secret(value: &str) {
    if value.len() < MIN_SECRET {
        return;
    }
    if let Ok(mut known) = known().write() {
        if !known.iter().any(|k| k == value) {
            known.push(value.to_owned());
        }
    }
}

/// `text` with every key-shaped token and every registered secret replaced by
/// [`REDACTED`].
pub fn scrub_secrets(text: &str) -> Cow<'_, str> {
    let shaped = match key_pattern() {
        Some(pattern) => pattern.replace_all(text, REDACTED),
        None => Cow::Borrowed(text),
    };
    let Ok(known) = known().read() else {
        return shaped;
    };
    match scrub_values(&shaped, known.iter().map(String::as_str)) {
        Cow::Borrowed(_) => shaped,
        Cow::Owned(scrubbed) => Cow::Owned(scrubbed),
    }
}

/// `text` with each of `values` (at least 8 bytes long) replaced by [`REDACTED`], in
/// its own spelling and URL-encoded ([`encoded_forms`]).
pub(crate) fn scrub_values<'t, 'v>(
    text: &'t str,
    values: impl IntoIterator<Item = &'v str>,
) -> Cow<'t, str> {
    let mut out = Cow::Borrowed(text);
    for value in values.into_iter().filter(|v| v.len() >= MIN_SECRET) {
        if out.contains(value) {
            out = Cow::Owned(out.replace(value, REDACTED));
        }
        if out.contains('%') {
            for form in encoded_forms(value) {
                if out.contains(&form) {
                    out = Cow::Owned(out.replace(&form, REDACTED));
                }
            }
        }
    }
    out
}

/// The ways a URL carries `value`: escaping what is not alphanumeric, or every byte,
/// with upper- or lower-case hex (an upstream that quotes the URL it was called with
/// quotes the key in one of them).
fn encoded_forms(value: &str) -> Vec<String> {
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
    let some = utf8_percent_encode(value, NON_ALPHANUMERIC).to_string();
    let every: String = value.bytes().map(|b| format!("%{b:02X}")).collect();
    let mut forms = Vec::with_capacity(4);
    for form in [some, every] {
        let lower = lower_hex(&form);
        for form in [form, lower] {
            if form != value && !forms.contains(&form) {
                forms.push(form);
            }
        }
    }
    forms
}

/// `encoded` with the hex digits of its escapes in lower case.
fn lower_hex(encoded: &str) -> String {
    let mut out = String::with_capacity(encoded.len());
    let mut hex_left = 0;
    for c in encoded.chars() {
        if c == '%' {
            hex_left = 2;
            out.push(c);
        } else if hex_left > 0 {
            hex_left -= 1;
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Scrubs every string inside `value` with [`scrub_secrets`] and `values`.
pub fn scrub_json(value: &mut serde_json::Value, values: &[String]) {
    match value {
        serde_json::Value::String(text) => {
            let scrubbed = scrub_secrets(text);
            let scrubbed = scrub_values(&scrubbed, values.iter().map(String::as_str)).into_owned();
            if scrubbed != *text {
                *text = scrubbed;
            }
        }
        serde_json::Value::Array(items) => {
            items.iter_mut().for_each(|item| scrub_json(item, values))
        }
        serde_json::Value::Object(map) => {
            map.values_mut().for_each(|item| scrub_json(item, values))
        }
        _ => {}
    }
}

/// True when `text` looks like a credential: masked by value wherever it appears.
pub(crate) fn looks_like_secret(text: &str) -> bool {
    key_pattern().is_some_and(|p| p.find(text).is_some_and(|m| m.start() == 0))
}

/// `https://user:pass@host/x` as `https://********@host/x`; `None` without userinfo.
pub(crate) fn mask_url_userinfo(text: &str) -> Option<String> {
    let (scheme, rest) = text.split_once("://")?;
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let at = rest[..authority_end].rfind('@')?;
    Some(format!("{scheme}://********{}", &rest[at..]))
}

/// `text` with every `password=…` (a URL's query, libpq's `key=value` form, quoted
/// or not) masked; `None` when it has none.
pub(crate) fn mask_passwords(text: &str) -> Option<String> {
    static PATTERN: OnceLock<Option<Regex>> = OnceLock::new();
    let pattern = PATTERN
        .get_or_init(|| {
            Regex::new(
                r"(?i)\b(password|passwd|pwd|sslpassword)(\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s]+)",
            )
            .ok()
        })
        .as_ref()?;
    pattern
        .is_match(text)
        .then(|| pattern.replace_all(text, "${1}${2}********").into_owned())
}

/// A URL (or a database connection string) as it may be shown: credentials masked.
pub fn shown_url(text: &str) -> Cow<'_, str> {
    let userinfo = mask_url_userinfo(text);
    let base = userinfo.as_deref().unwrap_or(text);
    match (mask_passwords(base), userinfo) {
        (Some(masked), _) => Cow::Owned(masked),
        (None, Some(masked)) => Cow::Owned(masked),
        (None, None) => Cow::Borrowed(text),
    }
}

/// `text` without terminal control characters (escape sequences, bells, CRs), so a
/// client-set model or tool name cannot rewrite what `audit` prints.
pub fn strip_controls(text: &str) -> Cow<'_, str> {
    if text.chars().any(char::is_control) {
        Cow::Owned(text.chars().filter(|c| !c.is_control()).collect())
    } else {
        Cow::Borrowed(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_passwords_are_masked_in_every_form() {
        for (text, secret) in [
            ("postgres://u:hunter2pw@db/handoff", "hunter2pw"),
            (
                "postgres://db/handoff?sslmode=require&password=hunter2pw",
                "hunter2pw",
            ),
            (
                "host=db user=u password=hunter2pw dbname=handoff",
                "hunter2pw",
            ),
            (
                "host=db password = 'hunter 2pw' dbname=handoff",
                "hunter 2pw",
            ),
        ] {
            let shown = shown_url(text);
            assert!(!shown.contains(secret), "{shown}");
            assert!(shown.contains("db"), "{shown}");
        }
    }

    #[test]
    fn key_fragments_of_upstream_errors_are_scrubbed() {
        let text = "Incorrect API key provided: sk-proj-****************abcd. You can find your key at https://platform.openai.com";
        let clean = scrub_secrets(text);
        assert!(
            !clean.contains("abcd") && clean.contains(REDACTED),
            "{clean}"
        );
        assert!(clean.contains("platform.openai.com"));
        assert_eq!(
            scrub_secrets("Authorization: Bearer abc.def-123 rejected"),
            format!("Authorization: {REDACTED} rejected")
        );
        assert_eq!(
            scrub_secrets("no secrets, task-force 7"),
            "no secrets, task-force 7"
        );
        assert!(looks_like_secret("sk-ant-api03-xyz1234"));
        assert!(!looks_like_secret("gpt-4o"));
    }

    #[test]
    fn urls_lose_their_credentials_and_names_their_controls() {
        assert_eq!(
            shown_url("https://me:sk-live@example.com/v1"),
            "https://********@example.com/v1"
        );
        assert_eq!(
            shown_url("https://example.com/v1"),
            "https://example.com/v1"
        );
        assert_eq!(strip_controls("gpt\u{1b}[2J-4o\r"), "gpt[2J-4o");
    }

    #[test]
    fn a_secret_in_a_url_is_scrubbed_in_every_escaping() {
        let key = "sk/plain+key=4242";
        for text in [
            "called /v1?key=sk%2Fplain%2Bkey%3D4242 and failed".to_owned(),
            "called /v1?key=sk%2fplain%2bkey%3d4242 and failed".to_owned(),
            format!(
                "called /v1?key={} and failed",
                key.bytes().map(|b| format!("%{b:02x}")).collect::<String>()
            ),
            format!(
                "called /v1?key={} and failed",
                key.bytes().map(|b| format!("%{b:02X}")).collect::<String>()
            ),
        ] {
            let scrubbed = scrub_values(&text, [key]);
            assert_eq!(scrubbed, "called /v1?key=[redacted] and failed", "{text}");
        }
        assert_eq!(scrub_values("100% plain text", [key]), "100% plain text");
    }
}
