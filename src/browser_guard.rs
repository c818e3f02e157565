//! What a web page could make a browser send, refused before anything is routed: a
//! request addressed to a name that is not this listener's (a page that rebinds its own
//! DNS name to 127.0.0.1 reaches a local proxy, and with it the upstream key), and a
//! request from a page whose origin is not allowed. Browsers always send `Host` and,
//! on every cross-site request that can carry a body, `Origin`; other clients need
//! neither, and a request without them passes.

use http::{header, Request};

use crate::config::Config;
use crate::error::ApiError;

/// Refuses a request whose addressed host is not one of the listener's names: the
/// request target's authority (absolute form, h2's `:authority`) and `Host` must both
/// be allowed, and agree when both are present.
pub(crate) fn check_host<B>(config: &Config, request: &Request<B>) -> Result<(), ApiError> {
    let from_target = request.uri().authority().map(|a| a.as_str());
    let from_header = match request.headers().get(header::HOST) {
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| ApiError::host_not_allowed("the Host header is not a host name"))?,
        ),
        None => None,
    };
    if let (Some(target), Some(header)) = (from_target, from_header) {
        if !host_of(target).eq_ignore_ascii_case(&host_of(header)) {
            return Err(ApiError::host_not_allowed(format!(
                "the request target names {target:?} and Host names {header:?}"
            )));
        }
    }
    for addressed in from_target.into_iter().chain(from_header) {
        let host = host_of(addressed);
        if !is_allowed_host(&config.allowed_hosts, &host) {
            return Err(ApiError::host_not_allowed(format!(
                "this proxy is not addressed as {host:?}; add it to allowed_hosts to serve it under that name"
            )));
        }
    }
    Ok(())
}

/// Refuses a request that carries an `Origin` not in `allowed_origins`: a web page's.
pub(crate) fn check_origin<B>(config: &Config, request: &Request<B>) -> Result<(), ApiError> {
    let Some(origin) = request.headers().get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("(not text)");
    let allowed = config
        .allowed_origins
        .iter()
        .any(|allowed| allowed == "*" || same_origin(allowed, origin));
    if allowed {
        Ok(())
    } else {
        Err(ApiError::origin_not_allowed(format!(
            "requests from web pages are refused, and {origin:?} is not in allowed_origins"
        )))
    }
}

/// True when two serialised origins are the same (scheme and host compare without
/// case; a trailing `/` is not part of an origin).
fn same_origin(a: &str, b: &str) -> bool {
    a.trim_end_matches('/')
        .eq_ignore_ascii_case(b.trim_end_matches('/'))
}

/// True when `host` (no port) is an IP address, a loopback name, or allowed by name.
/// An IP address cannot be rebound, so every one passes: what the listener accepts by
/// address is the `listen` setting's business.
fn is_allowed_host(allowed: &[String], host: &str) -> bool {
    let host = host.trim_end_matches('.');
    if host.eq_ignore_ascii_case("localhost") || ends_with_ignore_case(host, ".localhost") {
        return true;
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    allowed.iter().any(|name| {
        let name = name.trim_end_matches('.');
        name == "*"
            || name.eq_ignore_ascii_case(host)
            || name.strip_prefix('.').is_some_and(|domain| {
                domain.eq_ignore_ascii_case(host)
                    || ends_with_ignore_case(host, &format!(".{domain}"))
            })
    })
}

fn ends_with_ignore_case(text: &str, suffix: &str) -> bool {
    text.len() >= suffix.len()
        && text.as_bytes()[text.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
}

/// The host part of a `Host` value or of an origin's authority: no port or path, lower
/// case; an IPv6 literal keeps its brackets. User info stays, so no name with it passes.
pub(crate) fn host_of(authority: &str) -> String {
    let authority = authority.split('/').next().unwrap_or(authority);
    if let Some(rest) = authority.strip_prefix('[') {
        return format!("[{}]", rest.split(']').next().unwrap_or(rest)).to_ascii_lowercase();
    }
    authority
        .split(':')
        .next()
        .unwrap_or(authority)
        .to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(hosts: &[&str], origins: &[&str]) -> Config {
        Config {
            allowed_hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            allowed_origins: origins.iter().map(|o| (*o).to_owned()).collect(),
            ..Config::default()
        }
    }

    fn request(target: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder().uri(target);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn addresses_and_loopback_names_pass_and_other_names_only_when_allowed() {
        let plain = config(&[], &[]);
        for host in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "app.localhost:1",
            "[::1]:8080",
            "10.1.2.3",
            "localhost.",
        ] {
            assert!(
                check_host(&plain, &request("/v1/models", &[("host", host)])).is_ok(),
                "{host}"
            );
        }
        for host in [
            "rebind.example:8080",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "evil.example@localhost",
        ] {
            let refused = check_host(&plain, &request("/v1/models", &[("host", host)]));
            assert_eq!(
                refused.unwrap_err().code,
                Some("host_not_allowed"),
                "{host}"
            );
        }
        let named = config(&["proxy.internal", ".corp.example"], &[]);
        for host in ["proxy.internal:80", "corp.example", "a.b.corp.example"] {
            assert!(
                check_host(&named, &request("/", &[("host", host)])).is_ok(),
                "{host}"
            );
        }
        assert!(check_host(&named, &request("/", &[("host", "xcorp.example")])).is_err());
        assert!(check_host(
            &config(&["*"], &[]),
            &request("/", &[("host", "any.example")])
        )
        .is_ok());
    }

    #[test]
    fn an_absolute_target_must_name_an_allowed_host_that_host_agrees_with() {
        let plain = config(&[], &[]);
        let foreign = request("http://evil.example/handoff/metrics", &[]);
        assert!(check_host(&plain, &foreign).is_err());
        let split = request("http://localhost/v1/models", &[("host", "127.0.0.1")]);
        assert!(check_host(&plain, &split).is_err());
        let agreed = request(
            "http://localhost:8080/v1/models",
            &[("host", "localhost:8080")],
        );
        assert!(check_host(&plain, &agreed).is_ok());
    }

    #[test]
    fn only_listed_origins_pass() {
        let none = config(&[], &[]);
        assert!(check_origin(&none, &request("/", &[])).is_ok());
        for origin in ["http://evil.example", "null", "http://localhost:8080"] {
            let refused = check_origin(&none, &request("/", &[("origin", origin)]));
            assert_eq!(
                refused.unwrap_err().code,
                Some("origin_not_allowed"),
                "{origin}"
            );
        }
        let app = config(&[], &["https://App.example.com"]);
        assert!(check_origin(
            &app,
            &request("/", &[("origin", "https://app.example.com")])
        )
        .is_ok());
        assert!(
            check_origin(&app, &request("/", &[("origin", "http://app.example.com")])).is_err()
        );
    }
}
