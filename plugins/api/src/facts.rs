//! The identifiers of a text: the facts a reader checks a summary by, and the ones a
//! handoff must never lose. One definition serves the summary validator (a summary may
//! not name what it was not shown) and the host's ledger (every identifier of the
//! compacted span survives).
//!
//! The classes, each compared lower-cased without surrounding punctuation:
//! - **paths and file names**: a `/` between word characters, or a name with a short
//!   extension (`src/main.rs`, `notes.txt`);
//! - **ids**: letters and digits together, four or more characters (`usr_001`,
//!   `FACT-007`, `a1b2c3`, `E0308`);
//! - **numbers** of three or more digits (`8080`, `1234.56`): amounts, ports, codes;
//! - **`backtick` quotes** of 3 to 80 characters on one line.

/// A token without surrounding punctuation; lower-cased only once it is kept (the
/// classes below do not depend on case, and most words are not kept).
fn trimmed(token: &str) -> &str {
    token
        .trim_matches(|c: char| {
            !(c.is_alphanumeric() || c == '/' || c == '_' || c == '-' || c == '.')
        })
        .trim_end_matches('.')
}

/// True for a path or file name.
fn is_path(token: &str) -> bool {
    let has_slash = token.len() > 2 && token.trim_matches('/').contains('/');
    let extension = token.rsplit_once('.').is_some_and(|(stem, ext)| {
        !stem.is_empty()
            && (1..=5).contains(&ext.len())
            && ext.chars().all(|c| c.is_ascii_alphanumeric())
            && ext.chars().any(|c| c.is_ascii_alphabetic())
            && stem.chars().any(char::is_alphanumeric)
    });
    has_slash || extension
}

/// True for an id: letters and digits together, at least one of each.
fn is_id(token: &str) -> bool {
    token.len() >= 4
        && token.chars().any(|c| c.is_ascii_digit())
        && token.chars().any(|c| c.is_ascii_alphabetic())
        && token
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// True for a number of three or more digits, with an optional sign and decimals.
fn is_number(token: &str) -> bool {
    let digits = token.chars().filter(char::is_ascii_digit).count();
    digits >= 3
        && token
            .trim_start_matches('-')
            .chars()
            .all(|c| c.is_ascii_digit() || c == '.')
        && token.chars().filter(|c| *c == '.').count() <= 1
}

/// The distinct identifiers of `text`, normalised, in order of first appearance.
pub fn identifiers(text: &str) -> Vec<String> {
    let mut found: Vec<String> = text
        .split(|c: char| {
            c.is_whitespace()
                || matches!(
                    c,
                    ',' | ';' | '(' | ')' | '[' | ']' | '{' | '}' | '"' | '\'' | '<' | '>' | '='
                )
        })
        .map(trimmed)
        .filter(|t| !t.is_empty() && (is_path(t) || is_id(t) || is_number(t)))
        .map(str::to_lowercase)
        .collect();
    let mut rest = text;
    while let Some(start) = rest.find('`') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('`') else { break };
        let quoted = after[..end].trim();
        if (3..=80).contains(&quoted.len()) && !quoted.contains('\n') {
            found.push(quoted.to_lowercase());
        }
        rest = &after[end + 1..];
    }
    let mut seen = std::collections::HashSet::new();
    found.retain(|id| seen.insert(id.clone()));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_class_is_found_once_in_order() {
        let text =
            "Opened src/main.rs (id usr_001), port 8080, paid 1234.56; run `cargo test -q`. \
                    Again: SRC/MAIN.RS and usr_001. Small 42 and plain words are not facts.";
        assert_eq!(
            identifiers(text),
            ["src/main.rs", "usr_001", "8080", "1234.56", "cargo test -q"]
        );
    }

    #[test]
    fn json_punctuation_does_not_hide_a_value() {
        assert_eq!(
            identifiers(r#"{"file":"notes.txt","id":"FACT-007"}"#),
            ["notes.txt", "fact-007"]
        );
    }
}
