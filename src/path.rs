//! The request path, checked once before routing: a path that a server or the
//! upstream's own router could read as another one is refused, so that routing, the
//! key's limits and the upstream's `base_url` prefix all see the same path.

use crate::error::ApiError;

/// Refuses a path with dot segments (`.`, `..`), percent-encoded dots, slashes or
/// backslashes, backslashes, `;` parameters or empty segments (`//`, a trailing `/`).
pub fn check(path: &str) -> Result<(), ApiError> {
    let refuse = |why: &str| {
        Err(ApiError::invalid_request(
            "invalid_path",
            format!("the path {path:?} {why}; send the path in its plain form"),
        ))
    };
    if path == "/" {
        return Ok(());
    }
    let Some(rest) = path.strip_prefix('/') else {
        return refuse("does not start with /");
    };
    // One pass over the bytes, every request: no lowercased copy, no search per code.
    let bytes = path.as_bytes();
    for (at, byte) in bytes.iter().enumerate() {
        match byte {
            b'%' => {
                let encoded = bytes.get(at + 1..at + 3).is_some_and(|code| {
                    [b"2e", b"2f", b"5c"]
                        .iter()
                        .any(|known| code.eq_ignore_ascii_case(*known))
                });
                if encoded {
                    return refuse("has an encoded dot, slash or backslash");
                }
            }
            b'\\' | b';' => return refuse("has a backslash or a ';' parameter"),
            _ => {}
        }
    }
    for segment in rest.split('/') {
        match segment {
            "" => return refuse("has an empty segment"),
            "." | ".." => return refuse("has a dot segment"),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn plain_paths_pass_and_every_disguise_is_refused() {
        for good in [
            "/",
            "/v1/chat/completions",
            "/v1/files/file-abc/content",
            "/v1/models/gpt-4o",
        ] {
            assert!(check(good).is_ok(), "{good}");
        }
        for bad in [
            "/v1/../../outside",
            "/v1/./chat/completions",
            "/v1/%2e%2e/outside",
            "/v1/%2E./outside",
            "/v1/chat%2fcompletions",
            "/v1/chat/completions/",
            "/v1//chat/completions",
            "/v1/chat/completions;x",
            "/v1\\..\\outside",
            "/..",
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
    }
}
