//! Which headers cross the proxy, and how request targets are shown in logs.
//!
//! Credentials are forwarded untouched to the upstream; they are masked only in
//! the copies that are logged, never on the upstream path.

use http::header::{self, HeaderMap, HeaderName};

/// Headers that describe one hop and must not be forwarded (RFC 9110 section 7.6.1).
const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, including every header named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    // One pass over the names, each compared, rather than a hashed removal per hop
    // header: most requests and responses carry none, and then nothing is allocated.
    // Keep-Alive and Proxy-* have no constant in `http`; any Proxy-* is hop-scoped.
    let doomed: Vec<HeaderName> = headers
        .keys()
        .filter(|name| {
            HOP_BY_HOP.contains(name)
                || named.contains(name)
                || *name == "keep-alive"
                || name.as_str().starts_with("proxy-")
        })
        .cloned()
        .collect();
    for name in doomed {
        headers.remove(name);
    }
}

/// Query parameters whose values are credentials, e.g. Azure's `api-key` or `?key=`.
fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name == "key"
        || name.contains("api_key")
        || name.contains("api-key")
        || name.contains("apikey")
        || name.contains("token")
        || name.contains("secret")
        || name.contains("signature")
        || name.contains("password")
        || name == "sig"
        || name == "code"
}

/// The path and query for a log line, with credential-like query values masked.
pub fn loggable_target(path: &str, query: Option<&str>) -> String {
    let Some(query) = query else {
        return path.to_owned();
    };
    let masked: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            // The server reads a name spelt with escapes (`%6Bey`) as the name it spells.
            Some((name, _))
                if is_secret_param(
                    &percent_encoding::percent_decode_str(name).decode_utf8_lossy(),
                ) =>
            {
                format!("{name}=********")
            }
            _ => pair.to_owned(),
        })
        .collect();
    format!("{path}?{}", masked.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn connection_named_and_standard_hop_headers_are_removed() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("x-hop, keep-alive"),
        );
        headers.insert("x-hop", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        headers.insert("anthropic-beta", HeaderValue::from_static("tools-2024"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer sk"));
        headers.append(header::TRAILER, HeaderValue::from_static("x-a"));
        headers.append(header::TRAILER, HeaderValue::from_static("x-b"));
        strip_hop_by_hop(&mut headers);
        let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(headers.contains_key("anthropic-beta"));
        assert!(headers.contains_key(header::AUTHORIZATION));

        let mut clean = HeaderMap::new();
        clean.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        strip_hop_by_hop(&mut clean);
        assert_eq!(clean.len(), 1);
    }

    #[test]
    fn key_shaped_query_values_are_masked() {
        let shown = loggable_target("/v1/x", Some("api-key=sk-1&limit=3&key=abc&access_token=t"));
        assert_eq!(
            shown,
            "/v1/x?api-key=********&limit=3&key=********&access_token=********"
        );
        // A name spelt with escapes is the name it spells.
        assert_eq!(
            loggable_target("/v1beta/models", Some("%6Bey=abc&%6b%65%79=d")),
            "/v1beta/models?%6Bey=********&%6b%65%79=********"
        );
    }
}
