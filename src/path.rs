//! The request path, made canonical once before routing. Every percent-escape is
//! decoded, and the path is spelled again in one form: unreserved characters and the
//! path's own delimiters as themselves, everything else escaped in upper case. Routing,
//! the key's allow-list, object ownership, the logs and the upstream all read that one
//! form, so no server behind handoff can read the path as another one than was checked.
//! A path that cannot be decoded to one meaning is refused.

use std::borrow::Cow;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::error::ApiError;

/// What is escaped in the canonical form: everything but RFC 3986's unreserved
/// characters and the sub-delimiters, `:` and `@` a segment may hold (`;` never passes).
const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'!')
    .remove(b'$')
    .remove(b'&')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')')
    .remove(b'*')
    .remove(b'+')
    .remove(b',')
    .remove(b'=')
    .remove(b':')
    .remove(b'@');

/// The canonical form of `path`, borrowed when it already is. Refuses dot segments,
/// empty segments (`//`, a trailing `/`), backslashes and `;` parameters in any
/// spelling; an escaped `/` or `.`; NUL and control characters; a `%` not followed by
/// two hex digits; escapes that do not decode to UTF-8 (overlong forms included).
pub(crate) fn canonical(path: &str) -> Result<Cow<'_, str>, ApiError> {
    let refuse = |why: &str| {
        Err(ApiError::invalid_request(
            "invalid_path",
            format!(
                "the path {:?} {why}; send the path in its plain form",
                path.escape_debug().to_string()
            ),
        ))
    };
    if path == "/" {
        return Ok(Cow::Borrowed(path));
    }
    let Some(rest) = path.strip_prefix('/') else {
        return refuse("does not start with /");
    };
    let mut out = String::with_capacity(path.len());
    for segment in rest.split('/') {
        let decoded = match decode(segment) {
            Ok(decoded) => decoded,
            Err(why) => return refuse(why),
        };
        match &*decoded {
            "" => return refuse("has an empty segment"),
            "." | ".." => return refuse("has a dot segment"),
            _ => {}
        }
        if let Some(bad) = decoded
            .chars()
            .find(|c| matches!(c, '/' | '\\' | ';') || c.is_control())
        {
            return refuse(match bad {
                '/' => "has an encoded slash",
                '\\' | ';' => "has a backslash or a ';' parameter",
                _ => "has a control character",
            });
        }
        out.push('/');
        out.extend(utf8_percent_encode(&decoded, ESCAPED));
    }
    if out == path {
        Ok(Cow::Borrowed(path))
    } else {
        Ok(Cow::Owned(out))
    }
}

/// One segment with its escapes decoded. An escaped dot is refused whatever follows
/// it: a server that decodes twice, or per segment after splitting, reads it as one.
fn decode(segment: &str) -> Result<Cow<'_, str>, &'static str> {
    let bytes = segment.as_bytes();
    let mut at = 0;
    while let Some(found) = memchr::memchr(b'%', &bytes[at..]) {
        let escape = at + found;
        let hex = bytes.get(escape + 1..escape + 3);
        if !hex.is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)) {
            return Err("has a '%' not followed by two hex digits");
        }
        if hex.is_some_and(|hex| hex.eq_ignore_ascii_case(b"2e")) {
            return Err("has an encoded dot");
        }
        at = escape + 3;
    }
    percent_decode_str(segment)
        .decode_utf8()
        .map_err(|_| "has escapes that are not UTF-8")
}

#[cfg(test)]
mod tests {
    use super::canonical;

    #[test]
    fn plain_paths_are_their_own_canonical_form() {
        for good in [
            "/",
            "/v1/chat/completions",
            "/v1/files/file-abc/content",
            "/v1/models/gpt-4o",
            "/v1/models/ft:gpt-4o:acme@2024",
        ] {
            assert!(
                matches!(canonical(good), Ok(std::borrow::Cow::Borrowed(_))),
                "{good}"
            );
        }
    }

    #[test]
    fn every_spelling_of_an_id_is_read_as_the_id() {
        for (spelt, plain) in [
            ("/v1/responses/%72esp_A1", "/v1/responses/resp_A1"),
            ("/v1/responses/resp%5FA1", "/v1/responses/resp_A1"),
            ("/v1/responses/resp%5fA1", "/v1/responses/resp_A1"),
            (
                "/%76%31/%72%65%73%70%6F%6E%73%65%73/%72%65%73%70%5F%41%31",
                "/v1/responses/resp_A1",
            ),
            ("/v1/files/%66ile-A2/content", "/v1/files/file-A2/content"),
            ("/%68andoff/metrics", "/handoff/metrics"),
            // What must stay escaped is escaped in one form, upper case.
            ("/v1/x/a%20b", "/v1/x/a%20b"),
            ("/v1/x/a%3fb", "/v1/x/a%3Fb"),
            ("/v1/x/%C3%A9", "/v1/x/%C3%A9"),
            ("/v1/x/%2B", "/v1/x/+"),
            ("/v1/x/%25", "/v1/x/%25"),
        ] {
            assert_eq!(canonical(spelt).unwrap(), plain, "{spelt}");
        }
    }

    #[test]
    fn what_cannot_mean_one_path_is_refused() {
        for bad in [
            "/v1/../../outside",
            "/v1/./chat/completions",
            "/v1/%2e%2e/outside",
            "/v1/%2E./outside",
            "/v1/file%2Etxt",
            "/v1/chat%2fcompletions",
            "/v1/chat%2Fcompletions",
            "/v1/chat/completions/",
            "/v1//chat/completions",
            "/v1/chat/completions;x",
            "/v1/chat/completions%3Bx",
            "/v1\\..\\outside",
            "/v1%5c..%5Coutside",
            "/..",
            "/v1/a%00b",
            "/v1/a%0Ab",
            "/v1/a%7Fb",
            "/v1/a%",
            "/v1/a%4",
            "/v1/a%zz",
            "/v1/%C0%AE%C0%AE/outside",
            "/v1/%C0%AF",
            "/v1/%E0%80%AE",
            "/v1/%FF",
            "/v1/%ED%A0%80",
            "v1/chat/completions",
        ] {
            assert!(canonical(bad).is_err(), "{bad}");
        }
    }
}
