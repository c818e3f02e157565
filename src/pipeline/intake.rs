//! Phase 1, **intake**, the same for every request: what can be refused before the body
//! is read is refused with the reservation given back and the body drained on the side;
//! then the body comes in as the request needs it.

use std::sync::Arc;

use http::{request, Method};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::upload::ChargedUpload;
use crate::auth::Admission;
use crate::base::chunks::Chunks;
use crate::body::ProxyBody;
use crate::body_read::{drain, read_body};
use crate::error::ApiError;
use crate::named_model::{self, Reading};
use crate::ownership;
use crate::state::{AppState, Snapshot};

/// A body as it was taken in.
pub(super) enum Received {
    /// Read whole (a tracked request, or one whose model a proxy key must check), in
    /// the frames it arrived in, and charged to the key by its bytes.
    Whole(Chunks),
    /// Streamed to the upstream as it arrives, charged to the key frame by frame.
    Streamed(ProxyBody),
}

/// Takes in a tracked request's body: always read whole.
pub(super) async fn whole(
    state: &AppState,
    snap: &Snapshot,
    parts: &request::Parts,
    body: Incoming,
    admission: &Admission,
) -> Result<Chunks, ApiError> {
    let (_, body) = checked(state, snap, parts, body, admission, true).await?;
    read_whole(state, snap, parts, body, admission).await
}

/// Takes in any other request's body: read whole when a proxy key must see its model
/// or a hook its text, streamed otherwise.
pub(super) async fn any(
    state: &AppState,
    snap: &Snapshot,
    parts: &request::Parts,
    body: Incoming,
    admission: &Admission,
) -> Result<Received, ApiError> {
    let (reading, body) = checked(state, snap, parts, body, admission, false).await?;
    Ok(match reading {
        Reading::Whole => Received::Whole(read_whole(state, snap, parts, body, admission).await?),
        // No key, no tokens to charge: the body goes as it comes.
        Reading::Streamed if admission.key.is_none() => {
            Received::Streamed(body.map_err(Into::into).boxed_unsync())
        }
        Reading::Streamed => Received::Streamed(
            ChargedUpload::new(body, admission.clone(), Arc::clone(&state.limiter)).boxed_unsync(),
        ),
    })
}

/// Reads a body whole, within `limits.max_body_bytes`, and charges the key its bytes.
async fn read_whole(
    state: &AppState,
    snap: &Snapshot,
    parts: &request::Parts,
    body: Incoming,
    admission: &Admission,
) -> Result<Chunks, ApiError> {
    let body = read_body(body, &snap.config.limits, &parts.headers).await?;
    admission.settle_read(&state.limiter, body.len())?;
    Ok(body)
}

/// The refusals that need no body: on one the reservation is given back and the body
/// drained on the side, so a client that sends it all before reading reads the error.
async fn checked(
    state: &AppState,
    snap: &Snapshot,
    parts: &request::Parts,
    body: Incoming,
    admission: &Admission,
    whole: bool,
) -> Result<(Reading, Incoming), ApiError> {
    match before_reading(state, snap, parts, admission, whole).await {
        Ok(reading) => Ok((reading, body)),
        Err(err) => {
            admission.refund(&state.limiter, admission.reserved_tokens);
            drain(body, snap.config.limits.max_body_bytes);
            Err(err)
        }
    }
}

/// The refusals that need no body, and how the body is then read.
async fn before_reading(
    state: &AppState,
    snap: &Snapshot,
    parts: &request::Parts,
    admission: &Admission,
    whole: bool,
) -> Result<Reading, ApiError> {
    let path = parts.uri.path();
    if snap.credentials.shares_upstream_key() && ownership::is_listing(&parts.method, path) {
        return Err(ApiError::listing_not_allowed(format!(
            "{path} would list every team's objects of the shared upstream account; fetch your own by id"
        )));
    }
    if parts.method == Method::POST {
        // What a POST writes (a conversation's lines, an object's owner) is accounted
        // before its body is read: a tenant at its quota writes nothing more.
        state.check_quota(snap, &admission.tenant).await?;
    }
    if whole {
        return Ok(Reading::Whole);
    }
    // A proxy key checks the model a body names; a hook reads the text a `POST` sends.
    let hooked = parts.method == Method::POST && !snap.hooks.is_empty();
    if (admission.key.is_none() && !hooked)
        || matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS)
    {
        return Ok(Reading::Streamed);
    }
    named_model::reading(path, &parts.headers)
}
