//! Head+tail shortening with a visible mark of what was left out.

/// Characters kept from the start of an over-long tool body.
pub const TOOL_BODY_HEAD: usize = 2000;
/// Characters kept from the end of an over-long tool body.
pub const TOOL_BODY_TAIL: usize = 2000;

/// `text` cut to its first `head` and last `tail` characters with the omitted count
/// marked between them; unchanged when it is short enough.
pub fn cap_head_tail(text: &str, head: usize, tail: usize) -> String {
    let total = text.chars().count();
    if total <= head + tail {
        return text.to_owned();
    }
    let omitted = total - head - tail;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(total - tail).collect();
    format!("{start}\n[... {omitted} characters omitted by handoff ...]\n{end}")
}

/// A tool body shortened to 2,000 + 2,000 characters.
pub fn shorten_tool_body(text: &str) -> String {
    cap_head_tail(text, TOOL_BODY_HEAD, TOOL_BODY_TAIL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_bodies_keep_head_and_tail_and_say_how_much_is_gone() {
        let body = format!(
            "{}{}{}",
            "a".repeat(2000),
            "b".repeat(6000),
            "c".repeat(2000)
        );
        let short = shorten_tool_body(&body);
        assert!(short.starts_with(&"a".repeat(2000)));
        assert!(short.ends_with(&"c".repeat(2000)));
        assert!(short.contains("6000 characters omitted"));
        assert_eq!(shorten_tool_body("short"), "short");
    }
}
