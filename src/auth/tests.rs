#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use http::{HeaderMap, HeaderValue, StatusCode};
use sha2::{Digest, Sha256};

use super::{Credentials, RateLimiter, Reservation};

const NO_BODY: Reservation = Reservation {
    tokens: 0,
    declared: true,
};
use crate::config::from_toml;
use crate::dialect::DialectKind;
use crate::tenant::ServerSecret;
use crate::upstream::Upstream;

fn hex(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn keyed(extra: &str) -> Credentials {
    let config = from_toml(&format!(
        "[[auth.keys]]\nname = \"team-a\"\nsha256 = {:?}\nmodels = [\"m\"]\n{extra}\n[[auth.keys]]\nname = \"team-b\"\nsha256 = {:?}\n",
        hex("hk-a"),
        hex("hk-b")
    ))
    .unwrap();
    Credentials::build(&config, &Default::default()).unwrap()
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.insert(
            http::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}

fn secret() -> ServerSecret {
    ServerSecret::from_bytes([1; 32])
}

#[test]
fn without_keys_each_credential_is_its_own_tenant_in_either_header() {
    let open = Credentials::build(&from_toml("").unwrap(), &Default::default()).unwrap();
    let limiter = RateLimiter::default();
    let tenant = |pairs: &[(&str, &str)]| {
        open.admit(&secret(), &limiter, &headers(pairs), NO_BODY)
            .unwrap()
            .tenant
    };
    let bearer = tenant(&[("authorization", "Bearer sk-one")]);
    assert_eq!(bearer, tenant(&[("x-api-key", "sk-one")]));
    // Azure OpenAI's clients send the key in `api-key`: theirs, not the anonymous one.
    assert_eq!(bearer, tenant(&[("api-key", "sk-one")]));
    assert_ne!(tenant(&[("api-key", "sk-two")]), tenant(&[]));
    assert_ne!(bearer, tenant(&[("authorization", "Bearer sk-two")]));
    assert!(
        !bearer.as_str().contains("sk-one"),
        "a tenant never shows its key"
    );
}

#[test]
fn with_keys_a_request_needs_a_known_key_and_gets_its_tenant_and_models() {
    let credentials = keyed("");
    let limiter = RateLimiter::default();
    let admit =
        |pairs: &[(&str, &str)]| credentials.admit(&secret(), &limiter, &headers(pairs), NO_BODY);
    let missing = admit(&[]).unwrap_err();
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    assert_eq!(missing.code, Some("invalid_api_key"));
    let unknown = admit(&[("authorization", "Bearer hk-c")]).unwrap_err();
    assert_eq!(unknown.status, StatusCode::UNAUTHORIZED);
    assert!(!unknown.message.contains("hk-c"), "{}", unknown.message);
    let a = admit(&[("authorization", "Bearer hk-a")]).unwrap();
    assert_eq!(a.tenant.as_str(), "team-a");
    let key = a.key.unwrap();
    assert!(key.allows("m") && !key.allows("other"));
    let b = admit(&[("x-api-key", "hk-b")]).unwrap();
    assert_eq!(b.tenant.as_str(), "team-b");
    assert!(b.key.unwrap().allows("anything"));
    assert_eq!(
        admit(&[("api-key", "hk-b")]).unwrap().tenant.as_str(),
        "team-b"
    );
}

#[test]
fn a_key_over_its_rate_is_told_when_to_come_back() {
    let credentials = keyed("rpm = 2");
    let limiter = RateLimiter::default();
    let a = headers(&[("authorization", "Bearer hk-a")]);
    for _ in 0..2 {
        credentials.admit(&secret(), &limiter, &a, NO_BODY).unwrap();
    }
    let limited = credentials
        .admit(&secret(), &limiter, &a, NO_BODY)
        .unwrap_err();
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(limited.retry_after.is_some_and(|s| s >= 1), "{limited:?}");
    // Another key's budget is its own.
    let b = headers(&[("authorization", "Bearer hk-b")]);
    credentials.admit(&secret(), &limiter, &b, NO_BODY).unwrap();
}

#[test]
fn a_proxy_key_never_goes_upstream_and_the_upstream_key_goes_where_the_dialect_takes_it() {
    let config = from_toml("").unwrap();
    let plain = Upstream::new(&config.upstream).unwrap();
    let keyed_upstream = Upstream::new(&config.upstream)
        .unwrap()
        .with_key(Some("sk-upstream"))
        .unwrap();
    let credentials = keyed("");
    for dialect in [DialectKind::OpenAiChat, DialectKind::Anthropic] {
        let mut sent = headers(&[
            ("authorization", "Bearer hk-a"),
            ("x-api-key", "hk-a"),
            ("api-key", "hk-a"),
        ]);
        credentials.rewrite(&mut sent, dialect, &plain);
        assert!(sent.is_empty(), "{dialect:?}: {sent:?}");
    }
    let mut openai = headers(&[("authorization", "Bearer hk-a")]);
    credentials.rewrite(&mut openai, DialectKind::OpenAiChat, &keyed_upstream);
    assert_eq!(openai["authorization"], "Bearer sk-upstream");
    let mut anthropic = headers(&[("x-api-key", "hk-a")]);
    credentials.rewrite(&mut anthropic, DialectKind::Anthropic, &keyed_upstream);
    assert_eq!(anthropic["x-api-key"], "sk-upstream");
    assert!(anthropic.get("authorization").is_none());
    // Without proxy keys or an upstream key, the client's own credential goes on.
    let open = Credentials::build(&config, &Default::default()).unwrap();
    let mut own = headers(&[("x-api-key", "sk-client")]);
    open.rewrite(&mut own, DialectKind::Anthropic, &plain);
    assert_eq!(own["x-api-key"], "sk-client");
}
