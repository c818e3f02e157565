//! The phases of a request that is not tracked (every path but a tracked `POST`): the
//! shared intake and authorization, then a forward. With proxy keys, a body that can
//! name a model is read whole for the key to check it ([`named_model`]); any other body
//! streams. Through a shared upstream key, the upstream objects a request names must be
//! its tenant's ([`crate::ownership`]), and those a `POST` creates become so.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, request, Method, Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use super::authorize::{authorize, Claims};
use super::halt::Halt;
use super::hooks;
use super::intake::{self, Received};
use crate::access_log::RequestLog;
use crate::auth::Admission;
use crate::body::{full, ProxyBody};
use crate::dialect::DialectKind;
use crate::error::ApiError;
use crate::forward::{forward, relay, send_timed, upstream_request};
use crate::named_model;
use crate::ownership;
use crate::state::{AppState, Snapshot};

/// The largest answer read to learn the id of the object it created.
const MAX_CREATED_BODY: usize = 4 << 20;

/// Forwards an admitted request that is not tracked.
pub(super) async fn run(
    state: &AppState,
    snap: Arc<Snapshot>,
    request: Request<Incoming>,
    log: &mut RequestLog,
    admission: Admission,
    dialect: DialectKind,
) -> Result<Response<ProxyBody>, Halt> {
    let (mut parts, body) = request.into_parts();
    let received = intake::any(state, &snap, &parts, body, &admission).await?;
    let (claims, body) = parse(&snap, &parts, received).await?;
    authorize(state, &snap, &admission, &claims).await?;
    let body = match body {
        Parsed::Streamed(body) => body,
        Parsed::Whole(bytes) if parts.method == Method::POST => {
            let hooked = hook(state, &snap, &parts, &admission, dialect, &claims, &bytes).await?;
            match hooked {
                Some(redacted) => {
                    // The body the client sent is not the one sent on.
                    parts.headers.remove(header::CONTENT_LENGTH);
                    full(redacted)
                }
                None => full(bytes),
            }
        }
        Parsed::Whole(bytes) => full(bytes),
    };
    match send(&snap, parts, body, dialect, log).await? {
        Sent::Relayed(response) => Ok(response),
        Sent::Read(head, body) => {
            reply(state, &claims, &admission, &body).await?;
            Ok(crate::forward::buffered(head, body))
        }
    }
}

/// A body after **parse**.
enum Parsed {
    /// Read whole.
    Whole(Bytes),
    /// Streamed as it arrives.
    Streamed(ProxyBody),
}

/// Phase 2, **parse**: the model a body read whole names, and the objects the path and
/// such a body name (only looked for through a shared upstream key).
async fn parse(
    snap: &Snapshot,
    parts: &request::Parts,
    received: Received,
) -> Result<(Claims, Parsed), ApiError> {
    let shared = snap.credentials.shares_upstream_key();
    let path = parts.uri.path();
    let mut claims = Claims {
        path_model: DialectKind::for_path(path).get().path_model(path),
        ..Claims::default()
    };
    if shared {
        claims.objects = ownership::path_objects(path);
    }
    let body = match received {
        Received::Streamed(body) => Parsed::Streamed(body),
        Received::Whole(chunks) => {
            // Read for its model and the objects it names: one buffer.
            let bytes = chunks.contiguous().clone();
            claims.model = named_model::named_model(&parts.headers, &bytes).await?;
            if parts.method == Method::POST {
                claims.batch = named_model::batch(path, &bytes);
            }
            if shared {
                let named = ownership::body_objects(&bytes);
                claims.objects.extend(named.objects);
                claims.unknown_ids = named.unknown;
            }
            Parsed::Whole(bytes)
        }
    };
    Ok((claims, body))
}

/// Phase 4, **hook**, of a `POST` read whole: the request-stage hooks of the models it
/// names see its text, and may refuse it or take texts out of it (the body redacted).
async fn hook(
    state: &AppState,
    snap: &Snapshot,
    parts: &request::Parts,
    admission: &Admission,
    dialect: DialectKind,
    claims: &Claims,
    body: &Bytes,
) -> Result<Option<Bytes>, ApiError> {
    let caller = hooks::Caller {
        tenant: admission.tenant.clone(),
        keyed: admission.key.is_some(),
        path: parts.uri.path().to_owned(),
    };
    let batch = claims.batch.as_ref();
    let untracked = hooks::Untracked {
        models: (claims.model.iter().chain(&claims.path_model))
            .chain(batch.map_or(&[][..], |batch| batch.models.as_slice()))
            .map(String::as_str)
            .collect(),
        from_file: batch.is_some_and(|batch| batch.from_file),
    };
    hooks::on_untracked(state, snap, &caller, dialect, &untracked, body).await
}

/// What **send** got back.
enum Sent {
    /// An answer relayed as it comes.
    Relayed(Response<ProxyBody>),
    /// The answer to a `POST` through a shared key, read whole for what it created.
    Read(http::response::Parts, Bytes),
}

/// Phase 8, **send**: the upstream's credentials, then the forward. A successful JSON
/// answer to a `POST` through a shared key is read whole, for **reply** to learn what it
/// created.
async fn send(
    snap: &Snapshot,
    mut parts: request::Parts,
    body: ProxyBody,
    dialect: DialectKind,
    log: &mut RequestLog,
) -> Result<Sent, ApiError> {
    let upstream = snap.dialect_upstream(dialect);
    snap.credentials
        .rewrite(&mut parts.headers, dialect, upstream);
    if !(snap.credentials.shares_upstream_key() && parts.method == Method::POST) {
        return Ok(Sent::Relayed(forward(upstream, parts, body, log).await));
    }
    let request = upstream_request(upstream, parts.method, &parts.uri, parts.headers, body)?;
    let response = send_timed(upstream, request, log).await?;
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(response.status().is_success() && json) {
        return Ok(Sent::Relayed(relay(upstream, response, None)));
    }
    let (head, incoming) = response.into_parts();
    let body = Limited::new(incoming, MAX_CREATED_BODY)
        .collect()
        .await
        .map_err(|err| ApiError::bad_gateway(format!("reading the upstream's answer: {err}")))?
        .to_bytes();
    Ok(Sent::Read(head, body))
}

/// Phase 9, **reply**, of a `POST` through a shared key: the object its answer created
/// becomes the tenant's. Only a new one: an answer that names an object the request
/// named (a conversation updated, a file attached) creates nothing, and another
/// tenant's stays theirs.
async fn reply(
    state: &AppState,
    claims: &Claims,
    admission: &Admission,
    body: &Bytes,
) -> Result<(), ApiError> {
    let created = ownership::created_object(body).filter(|object| !claims.objects.contains(object));
    let Some(object) = created else {
        return Ok(());
    };
    match state.ownership.record(&admission.tenant, &object).await {
        Ok(ownership::Recorded::Owned) => Ok(()),
        Ok(ownership::Recorded::OthersAlready(owner)) => {
            // Not shown either: the answer is another tenant's object.
            tracing::warn!(object = %object, owner = %owner, tenant = %admission.tenant, "an upstream answer named another tenant's object as created; not recorded");
            Err(ApiError::not_found(format!(
                "No such object: {object:?} (not created through this key)"
            )))
        }
        Err(err) => {
            // Unrecorded, the object would be refused to its own tenant: say so now.
            tracing::warn!(object = %object, error = %err, "cannot record an upstream object's owner");
            Err(ApiError::storage(err.to_string()))
        }
    }
}
