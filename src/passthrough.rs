//! Every path that is not tracked, admitted as a tracked one is: a body that can name a
//! model is read (within `limits.max_body_bytes`) and checked against the key's model
//! allow-list, and charged to its `tpm` by the bytes it held; an upload streams and is
//! charged as it goes. Without proxy keys there is nothing to check, and bodies stream.
//! Through a shared upstream key, the upstream objects a request names must be its
//! tenant's ([`crate::ownership`]), and those a response creates become so.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{header, Method, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use crate::access_log::RequestLog;
use crate::auth::{Admission, RateLimiter};
use crate::body::{full, BoxError, ProxyBody};
use crate::body_read::read_body;
use crate::dialect::{DialectKind, ErrorResponse};
use crate::error::ApiError;
use crate::forward::{forward, relay, send_timed, upstream_request};
use crate::named_model::{self, Reading};
use crate::ownership;
use crate::state::{AppState, Snapshot};

/// Forwards a request that is not tracked, after its admission.
pub(crate) async fn handle(
    state: &AppState,
    snap: Arc<Snapshot>,
    request: Request<Incoming>,
    log: &mut RequestLog,
    admission: Admission,
    dialect: DialectKind,
) -> Response<ProxyBody> {
    let (mut parts, body) = request.into_parts();
    let shared = snap.credentials.shares_upstream_key();
    if shared && ownership::is_listing(&parts.method, parts.uri.path()) {
        admission.refund(&state.limiter, admission.reserved_tokens);
        return ApiError::listing_not_allowed(format!(
                "{} would list every team's objects of the shared upstream account; fetch your own by id",
            parts.uri.path()
        ))
        .into_response_for(dialect);
    }
    if parts.method == Method::POST {
        // What a POST creates is recorded: a tenant at its quota creates nothing more.
        if let Err(err) = state.check_quota(&snap, &admission.tenant).await {
            admission.refund(&state.limiter, admission.reserved_tokens);
            crate::body_read::drain(body, snap.config.limits.max_body_bytes);
            return err.into_response_for(dialect);
        }
    }
    let mut named: Vec<String> = ownership::path_objects(parts.uri.path())
        .map(str::to_owned)
        .collect();
    let body = match admission.key.as_ref() {
        None => body.map_err(Into::into).boxed_unsync(),
        Some(_) => match reading(&parts.method, parts.uri.path(), &parts.headers) {
            Err(err) => {
                admission.refund(&state.limiter, admission.reserved_tokens);
                crate::body_read::drain(body, snap.config.limits.max_body_bytes);
                return err.into_response_for(dialect);
            }
            Ok(Reading::Streamed) => {
                Charged::new(body, admission.clone(), Arc::clone(&state.limiter)).boxed_unsync()
            }
            Ok(Reading::Whole) => {
                // Read for its model and the objects it names: one buffer.
                let bytes = match read_body(body, &snap.config.limits, &parts.headers).await {
                    Ok(chunks) => chunks.contiguous().clone(),
                    Err(err) => return err.into_response_for(dialect),
                };
                if let Err(err) = admission.settle_read(&state.limiter, bytes.len()) {
                    return err.into_response_for(dialect);
                }
                let checked = match named_model::named_model(&parts.headers, &bytes).await {
                    Ok(Some(model)) => admission.check_model(&model),
                    Ok(None) => Ok(()),
                    Err(err) => Err(err),
                };
                if let Err(err) = checked {
                    return err.into_response_for(dialect);
                }
                named.extend(ownership::body_objects(&bytes));
                full(bytes)
            }
        },
    };
    if shared {
        if let Err(err) = state.check_owned(&admission.tenant, &named).await {
            return err.into_response_for(dialect);
        }
    }
    let upstream = snap.dialect_upstream(dialect);
    snap.credentials
        .rewrite(&mut parts.headers, dialect, upstream);
    if !(shared && parts.method == Method::POST) {
        return forward(upstream, parts, body, log).await;
    }
    // What this POST creates (a file, a batch…) becomes the tenant's.
    let request = match upstream_request(upstream, parts.method, &parts.uri, parts.headers, body) {
        Ok(request) => request,
        Err(err) => return err.into_response_for(dialect),
    };
    let response = match send_timed(upstream, request, log).await {
        Ok(response) => response,
        Err(err) => return err.into_response_for(dialect),
    };
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(response.status().is_success() && json) {
        return relay(upstream, response, None);
    }
    let (head, incoming) = response.into_parts();
    let body = match Limited::new(incoming, MAX_CREATED_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) => {
            return ApiError::bad_gateway(format!("reading the upstream's answer: {err}"))
                .into_response_for(dialect)
        }
    };
    // Only a new object: an answer that names one the request named (a conversation
    // updated, a file attached) creates nothing, and another tenant's stays theirs.
    let created = ownership::created_object(&body).filter(|object| !named.contains(object));
    if let Some(object) = created {
        match state.ownership.record(&admission.tenant, &object).await {
            Ok(ownership::Recorded::Owned) => {}
            Ok(ownership::Recorded::OthersAlready(owner)) => {
                // Not shown either: the answer is another tenant's object.
                tracing::warn!(object = %object, owner = %owner, tenant = %admission.tenant, "an upstream answer named another tenant's object as created; not recorded");
                return ApiError::not_found(format!(
                    "No such object: {object:?} (not created through this key)"
                ))
                .into_response_for(dialect);
            }
            Err(err) => {
                // Unrecorded, the object would be refused to its own tenant: say so now.
                tracing::warn!(object = %object, error = %err, "cannot record an upstream object's owner");
                return ApiError::storage(err.to_string()).into_response_for(dialect);
            }
        }
    }
    crate::forward::buffered(head, body)
}

/// The largest answer read to learn the id of the object it created.
const MAX_CREATED_BODY: usize = 4 << 20;

/// How a body is admitted: none to read for a `GET`, `HEAD` or `OPTIONS`; otherwise as
/// [`named_model::reading`] says.
fn reading(method: &Method, path: &str, headers: &http::HeaderMap) -> Result<Reading, ApiError> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(Reading::Streamed);
    }
    named_model::reading(path, headers)
}

pin_project_lite::pin_project! {
    /// A streamed upload, charged to its key's `tpm` as it arrives: past its
    /// reservation each frame takes what it holds, and a frame the key cannot cover
    /// cuts the upload. What the reservation held beyond the body is given back.
    struct Charged {
        #[pin]
        inner: Incoming,
        admission: Admission,
        limiter: Arc<RateLimiter>,
        read: usize,
        // Tokens taken so far, the reservation included.
        taken: u64,
        settled: bool,
    }

    impl PinnedDrop for Charged {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if !*this.settled {
                let used = *this.read as u64 / 4;
                this.admission.refund(this.limiter, this.taken.saturating_sub(used));
            }
        }
    }
}

impl Charged {
    fn new(inner: Incoming, admission: Admission, limiter: Arc<RateLimiter>) -> Self {
        let taken = admission.reserved_tokens;
        Self {
            inner,
            admission,
            limiter,
            read: 0,
            taken,
            settled: false,
        }
    }
}

impl Body for Charged {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let polled = ready!(this.inner.poll_frame(cx));
        match &polled {
            Some(Ok(frame)) => {
                *this.read += frame.data_ref().map_or(0, Bytes::len);
                let used = *this.read as u64 / 4;
                if used > *this.taken {
                    if let Err(err) = this
                        .admission
                        .take_streamed(this.limiter, used - *this.taken)
                    {
                        *this.settled = true;
                        return Poll::Ready(Some(Err(err.into())));
                    }
                    *this.taken = used;
                }
            }
            None => {
                let used = *this.read as u64 / 4;
                this.admission
                    .refund(this.limiter, this.taken.saturating_sub(used));
                *this.settled = true;
            }
            Some(Err(_)) => {}
        }
        Poll::Ready(polled.map(|frame| frame.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
