//! The two lexing steps a scan of JSON text needs without parsing it: skipping
//! whitespace and finding where a string ends. Both read bytes as serde does.

/// The first byte at or after `at` that is not JSON whitespace.
pub fn skip_space(text: &[u8], mut at: usize) -> usize {
    while matches!(text.get(at), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        at += 1;
    }
    at
}

/// The end of the string whose opening quote is at `at` (or that goes on from
/// `at + 1`): one past its closing quote; `None` when it never closes.
pub fn string_end(text: &[u8], at: usize) -> Option<usize> {
    let mut at = at + 1;
    loop {
        at += memchr::memchr2(b'"', b'\\', text.get(at..)?)?;
        if text[at] == b'"' {
            return Some(at + 1);
        }
        // An escape: whatever follows the backslash cannot close the string.
        at += 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_ends_at_its_first_unescaped_quote() {
        let text = br#""a\"b\\" : 1"#;
        assert_eq!(string_end(text, 0), Some(8));
        assert_eq!(skip_space(text, 8), 9);
        assert_eq!(string_end(br#""open\""#, 0), None);
        // From inside a string, past an escape's backslash.
        assert_eq!(string_end(br#"\u00e9x" "#, 1), Some(8));
    }
}
