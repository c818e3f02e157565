//! Who may use the proxy, as which tenant, and with which upstream credential.
//!
//! With `[[auth.keys]]` configured, every request to the upstream must present one of
//! them (`Authorization: Bearer`, or its API's key header such as `x-api-key`); its
//! name is the tenant, and its model allow-list and rate limits apply. Without keys,
//! every caller is served and its tenant is derived from its credential. Either way,
//! when `upstream.api_key_env` is set the upstream sees that key only: a client's key
//! never goes upstream then.
//! Keys are compared by SHA-256, so the config never holds one.

mod limit;
mod secrets;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderMap};
use sha2::{Digest, Sha256};

pub(crate) use limit::{too_large, Exceeded, RateLimiter, Want, WantKind};
pub(crate) use secrets::Secrets;

use crate::config::Config;
use crate::dialect::{credential, presented_key};
use crate::dialect::{DialectKind, KeyHeader};
use crate::error::ApiError;
use crate::tenant::{ServerSecret, TenantId};
use crate::upstream::Upstream;

/// Why the key table could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyError {
    /// A key's or the upstream's variable is unset.
    #[error("{key}: the variable {variable} is not set")]
    Unset {
        /// The config key.
        key: String,
        /// The variable.
        variable: String,
    },
}

/// The value of the key variable `variable` in `secrets`, named by the config key `field`.
pub(crate) fn read_key(secrets: &Secrets, field: &str, variable: &str) -> Result<String, KeyError> {
    let value = secrets.get(variable).ok_or_else(|| KeyError::Unset {
        key: field.to_owned(),
        variable: variable.to_owned(),
    })?;
    crate::redact::register_secret(&value);
    Ok(value)
}

/// One proxy key, as the config describes it.
#[derive(Debug)]
pub(crate) struct ProxyKey {
    /// Its tenant.
    pub tenant: TenantId,
    /// Models it may use; all when empty.
    pub models: Vec<String>,
    /// Requests per minute.
    pub rpm: Option<u32>,
    /// Estimated input tokens per minute.
    pub tpm: Option<u64>,
    /// A request over a minute's `tpm` waits and owes, rather than being refused.
    pub tpm_oversize: bool,
    /// Path prefixes it may use.
    pub paths: Vec<String>,
}

impl ProxyKey {
    /// True when the key may use `path`: one of its paths, or below one.
    pub(crate) fn allows_path(&self, path: &str) -> bool {
        self.paths.iter().any(|allowed| {
            let allowed = allowed.trim_end_matches('/');
            path == allowed
                || path
                    .strip_prefix(allowed)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
    }

    /// True when the key may use `model`.
    pub(crate) fn allows(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }
}

/// The credentials of one config: the proxy keys by digest, and the upstream key.
#[derive(Debug, Default)]
pub(crate) struct Credentials {
    keys: HashMap<[u8; 32], Arc<ProxyKey>>,
    /// `upstream.api_key_env` is set: handoff holds the upstream key (each upstream
    /// carries its own value, [`Upstream::key`]).
    holds_upstream_key: bool,
}

impl Credentials {
    /// Builds the table from `config`, reading the variables it names from `secrets`.
    pub(crate) fn build(config: &Config, secrets: &Secrets) -> Result<Self, KeyError> {
        let read = |key: String, variable: &str| {
            secrets.get(variable).ok_or_else(|| KeyError::Unset {
                key,
                variable: variable.to_owned(),
            })
        };
        let mut keys = HashMap::new();
        for (index, key) in config.auth.keys.iter().enumerate() {
            let digest = match (&key.sha256, &key.key_env) {
                (Some(hex), _) => from_hex(hex),
                (None, Some(variable)) => {
                    let value = read(format!("auth.keys[{index}].key_env"), variable)?;
                    crate::redact::register_secret(&value);
                    Some(Sha256::digest(value.as_bytes()).into())
                }
                (None, None) => None,
            };
            let (Some(digest), Ok(tenant)) = (digest, TenantId::parse(&key.name)) else {
                continue; // refused by config validation already
            };
            keys.insert(
                digest,
                Arc::new(ProxyKey {
                    tenant,
                    models: key.models.clone(),
                    rpm: key.rpm,
                    tpm: key.tpm,
                    tpm_oversize: key.tpm_oversize,
                    paths: key.paths.clone().unwrap_or_else(|| {
                        crate::dialect::key_paths()
                            .into_iter()
                            .map(str::to_owned)
                            .collect()
                    }),
                }),
            );
        }
        // Read here too, so that an unset variable is this table's error.
        if let Some(variable) = &config.upstream.api_key_env {
            read_key(secrets, "upstream.api_key_env", variable)?;
        }
        Ok(Self {
            keys,
            holds_upstream_key: config.upstream.api_key_env.is_some(),
        })
    }

    /// True when callers must present a proxy key.
    pub(crate) fn requires_keys(&self) -> bool {
        !self.keys.is_empty()
    }

    /// True when many proxy keys share one upstream key: their upstream objects live
    /// in one account, and handoff keeps them apart.
    pub(crate) fn shares_upstream_key(&self) -> bool {
        self.requires_keys() && self.holds_upstream_key
    }

    /// Who a request is: its proxy key (checked against rate limits) and tenant.
    pub(crate) fn admit(
        &self,
        secret: &ServerSecret,
        limiter: &RateLimiter,
        headers: &HeaderMap,
        reservation: Reservation,
    ) -> Result<Admission, ApiError> {
        if !self.requires_keys() {
            return Ok(Admission {
                tenant: secret.tenant_for(&credential(headers)),
                key: None,
                reserved_tokens: 0,
            });
        }
        let presented = presented_key(headers).ok_or_else(|| {
            ApiError::invalid_api_key(
                "no API key: send your handoff key as Authorization: Bearer <key> or in your API's key header (x-api-key…)",
            )
        })?;
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let key = self.keys.get(&digest).ok_or_else(|| {
            ApiError::invalid_api_key("incorrect API key provided; this proxy does not know it")
        })?;
        let kind = match (reservation.declared, key.tpm_oversize) {
            (false, _) => WantKind::Estimate,
            (true, true) => WantKind::OversizeAllowed,
            (true, false) => WantKind::Declared,
        };
        let want = Want {
            tokens: reservation.tokens,
            kind,
        };
        let reserved_tokens = limiter
            .admit(key.tenant.as_str(), key.rpm, key.tpm, want, Instant::now())
            .map_err(|hit| rate_limited(key, &hit))?;
        Ok(Admission {
            tenant: key.tenant.clone(),
            key: Some(Arc::clone(key)),
            reserved_tokens,
        })
    }

    /// Replaces the client's credentials by `upstream`'s own key when it has one, and
    /// drops them when they were a proxy key or handoff holds keys: neither may reach
    /// an upstream. The key goes where `dialect` expects it ([`crate::dialect::Credentials::key_header`]).
    ///
    /// [`crate::dialect::Credentials::key_header`]: crate::dialect::Credentials::key_header
    pub(crate) fn rewrite(
        &self,
        headers: &mut HeaderMap,
        dialect: DialectKind,
        upstream: &Upstream,
    ) {
        if self.holds_upstream_key || self.requires_keys() || upstream.key().is_some() {
            headers.remove(header::AUTHORIZATION);
            for name in crate::dialect::key_headers() {
                headers.remove(*name);
            }
        }
        match (dialect.get().key_header(), upstream.key()) {
            (KeyHeader::Named(name), Some((_, key))) => {
                headers.insert(name, key.clone());
            }
            (KeyHeader::Bearer, Some((value, _))) => {
                headers.insert(header::AUTHORIZATION, value.clone());
            }
            (_, None) => {}
        }
    }
}

/// A request that may go on: its tenant, and the proxy key it presented.
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    /// The tenant its conversations belong to.
    pub tenant: TenantId,
    /// The key, when keys are configured.
    pub key: Option<Arc<ProxyKey>>,
    /// The input tokens reserved for it at admission: its declared length's, or for a
    /// body of unknown length what the bucket held, up to [`CHUNKED_RESERVE_TOKENS`].
    pub reserved_tokens: u64,
}

/// The tokens a body of unknown length (chunked, or h2 without `content-length`)
/// reserves until its size is known: 64 KiB of text.
pub(crate) const CHUNKED_RESERVE_TOKENS: u64 = 16 * 1024;

/// What a request reserves of its key's `tpm` before it is admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reservation {
    /// Estimated input tokens: a quarter of the body's bytes.
    pub tokens: u64,
    /// True when the body declared its length; otherwise `tokens` is an estimate,
    /// capped at the key's minute, and the body is refused only once it is read.
    pub declared: bool,
}

/// What a request reserves: its declared length's tokens, [`CHUNKED_RESERVE_TOKENS`]
/// for a body of unknown length, none for a request without a body.
pub(crate) fn reservation(method: &http::Method, headers: &HeaderMap) -> Reservation {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let bodiless = matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS | http::Method::DELETE
    );
    match declared {
        Some(bytes) => Reservation {
            tokens: bytes / 4,
            declared: true,
        },
        None if bodiless => Reservation {
            tokens: 0,
            declared: true,
        },
        None => Reservation {
            tokens: CHUNKED_RESERVE_TOKENS,
            declared: false,
        },
    }
}

/// The 429 for a key whose limit `hit` was reached.
fn rate_limited(key: &ProxyKey, hit: &Exceeded) -> ApiError {
    let unit = if hit.limit == "rpm" {
        "requests"
    } else {
        "input tokens"
    };
    let message = if hit.oversize {
        format!(
            "the request alone is larger than key {}'s {} {unit} per minute; send less, or set tpm_oversize on the key",
            key.tenant, hit.per_minute
        )
    } else {
        format!(
            "rate limit of key {} reached: {} {unit} per minute; retry in {:.1} s",
            key.tenant,
            hit.per_minute,
            hit.retry_after.as_secs_f64()
        )
    };
    ApiError::rate_limited(message, hit.retry_after)
}

impl Admission {
    /// Settles the reservation once a body read whole held `read` bytes: gives back
    /// what it did not use, or takes what it held beyond, refusing the request (before
    /// anything is sent) when the key's `tpm` cannot cover it.
    pub(crate) fn settle_read(&self, limiter: &RateLimiter, read: usize) -> Result<(), ApiError> {
        let Some(key) = &self.key else {
            return Ok(());
        };
        let tokens = read as u64 / 4;
        let tenant = key.tenant.as_str();
        let now = Instant::now();
        if tokens <= self.reserved_tokens {
            limiter.refund(tenant, key.tpm, self.reserved_tokens - tokens, now);
            return Ok(());
        }
        let extra = tokens - self.reserved_tokens;
        match key.tpm {
            Some(per_minute) if tokens > per_minute && key.tpm_oversize => {
                limiter.charge(tenant, key.tpm, extra, now);
                Ok(())
            }
            Some(per_minute) if tokens > per_minute => {
                limiter.refund(tenant, key.tpm, self.reserved_tokens, now);
                Err(rate_limited(key, &too_large(per_minute)))
            }
            _ => limiter.take(tenant, key.tpm, extra, now).map_err(|hit| {
                limiter.refund(tenant, key.tpm, self.reserved_tokens, now);
                rate_limited(key, &hit)
            }),
        }
    }

    /// Takes `tokens` more for a streamed body that passed its reservation; `Err` when
    /// the key's `tpm` cannot cover them (the stream is then cut).
    pub(crate) fn take_streamed(&self, limiter: &RateLimiter, tokens: u64) -> Result<(), ApiError> {
        let Some(key) = &self.key else {
            return Ok(());
        };
        if key.tpm_oversize {
            limiter.charge(key.tenant.as_str(), key.tpm, tokens, Instant::now());
            return Ok(());
        }
        limiter
            .take(key.tenant.as_str(), key.tpm, tokens, Instant::now())
            .map_err(|hit| rate_limited(key, &hit))
    }

    /// Gives back `tokens` of the reservation a streamed body did not use.
    pub(crate) fn refund(&self, limiter: &RateLimiter, tokens: u64) {
        if let Some(key) = &self.key {
            limiter.refund(key.tenant.as_str(), key.tpm, tokens, Instant::now());
        }
    }

    /// 403 when the key may not use `path`.
    pub(crate) fn check_path(&self, path: &str) -> Result<(), ApiError> {
        match &self.key {
            Some(key) if !key.allows_path(path) => Err(ApiError::path_not_allowed(format!(
                "key {} may not use {path}; allowed: [{}] ([[auth.keys]] paths)",
                key.tenant,
                key.paths.join(", ")
            ))),
            _ => Ok(()),
        }
    }

    /// 403 when the key has a model list and the request runs models handoff cannot
    /// read (`what`: a batch over an uploaded file, whose lines name them).
    pub(crate) fn check_unread_models(&self, what: &str) -> Result<(), ApiError> {
        match &self.key {
            Some(key) if !key.models.is_empty() => Err(ApiError::model_not_allowed(format!(
                "key {} may use only the models [{}], and {what} names models handoff does not read: refused for this key",
                key.tenant,
                key.models.join(", ")
            ))),
            _ => Ok(()),
        }
    }

    /// 403 when the key may not use `model`.
    pub(crate) fn check_model(&self, model: &str) -> Result<(), ApiError> {
        match &self.key {
            Some(key) if !key.allows(model) => Err(ApiError::model_not_allowed(format!(
                "key {} may not use model {model:?}; allowed: [{}]",
                key.tenant,
                key.models.join(", ")
            ))),
            _ => Ok(()),
        }
    }
}

fn from_hex(hex: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if hex.len() != 64 {
        return None;
    }
    for (slot, pair) in out.iter_mut().zip(hex.as_bytes().chunks(2)) {
        *slot = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests;
