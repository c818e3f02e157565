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
use crate::dialect::DialectKind;
use crate::error::ApiError;
use crate::forward::{forward, relay, send_timed, upstream_request};
use crate::ownership;
use crate::state::{AppState, Snapshot};

/// Paths whose multipart form names a model (transcription, translation, image edits):
/// read whole like a JSON body. Other multipart bodies (file uploads) stream.
const MODEL_FORMS: &[&str] = &["/v1/audio/", "/v1/images/"];

/// Forwards a request that is not tracked, after its admission.
pub async fn handle(
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
        return ApiError::listing_not_allowed(format!(
                "{} would list every team's objects of the shared upstream account; fetch your own by id",
            parts.uri.path()
        ))
        .into_response_for(dialect);
    }
    let mut named: Vec<String> = ownership::path_objects(parts.uri.path())
        .map(str::to_owned)
        .collect();
    let body = match admission.key.as_ref() {
        None => body.map_err(Into::into).boxed_unsync(),
        Some(_) if !reads_whole(&parts.method, parts.uri.path(), &parts.headers) => {
            Charged::new(body, admission.clone(), Arc::clone(&state.limiter)).boxed_unsync()
        }
        Some(_) => {
            // Read for its model and the objects it names: one buffer.
            let bytes = match read_body(body, &snap.config.limits, &parts.headers).await {
                Ok(chunks) => chunks.contiguous().clone(),
                Err(err) => return err.into_response_for(dialect),
            };
            admission.charge_read(&state.limiter, bytes.len());
            if let Some(model) = named_model(&parts.headers, &bytes) {
                if let Err(err) = admission.check_model(&model) {
                    return err.into_response_for(dialect);
                }
            }
            named.extend(ownership::body_objects(&bytes));
            full(bytes)
        }
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
    if let Some(object) = ownership::created_object(&body) {
        if let Err(err) = state.ownership.record(&admission.tenant, &object).await {
            // Unrecorded, the object would be refused to its own tenant: say so now.
            tracing::warn!(object = %object, error = %err, "cannot record an upstream object's owner");
            return ApiError::storage(err.to_string()).into_response_for(dialect);
        }
    }
    crate::forward::buffered(head, body)
}

/// The largest answer read to learn the id of the object it created.
const MAX_CREATED_BODY: usize = 4 << 20;

/// True when a body is read whole to be checked: any body but a multipart upload that
/// names no model.
fn reads_whole(method: &Method, path: &str, headers: &http::HeaderMap) -> bool {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return false;
    }
    let multipart = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().starts_with("multipart/"));
    !multipart || MODEL_FORMS.iter().any(|prefix| path.starts_with(prefix))
}

/// The model a body names: a JSON object's `model`, or a multipart form's `model`
/// field.
pub fn named_model(headers: &http::HeaderMap, body: &[u8]) -> Option<String> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if let Some(boundary) = multipart_boundary(content_type) {
        return form_field(body, boundary.as_bytes(), b"model");
    }
    #[derive(serde::Deserialize)]
    struct Named {
        model: Option<serde_json::Value>,
    }
    let named: Named = serde_json::from_slice(body).ok()?;
    match named.model? {
        serde_json::Value::String(model) => Some(model),
        // Not a name the allow-list can pass: checked as its JSON text, so refused.
        other => Some(other.to_string()),
    }
}

fn multipart_boundary(content_type: &str) -> Option<&str> {
    if !content_type.to_ascii_lowercase().starts_with("multipart/") {
        return None;
    }
    content_type.split(';').find_map(|part| {
        let (name, value) = part.trim().split_once('=')?;
        name.eq_ignore_ascii_case("boundary")
            .then(|| value.trim_matches('"'))
    })
}

/// The value of the form field `name` in a multipart body.
fn form_field(body: &[u8], boundary: &[u8], name: &[u8]) -> Option<String> {
    let mut delimiter = b"--".to_vec();
    delimiter.extend_from_slice(boundary);
    let mut parts = split(body, &delimiter).into_iter().skip(1);
    parts.find_map(|part| {
        let head_end = find(part, b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&part[..head_end]).to_ascii_lowercase();
        let wanted = format!("name=\"{}\"", String::from_utf8_lossy(name));
        let disposition = head
            .lines()
            .find(|line| line.trim_start().starts_with("content-disposition"))?;
        let names_it = disposition.split(';').any(|param| param.trim() == wanted);
        if !names_it {
            return None;
        }
        let value = &part[head_end + 4..];
        let value = value.strip_suffix(b"\r\n").unwrap_or(value);
        Some(String::from_utf8_lossy(value).into_owned())
    })
}

fn split<'a>(haystack: &'a [u8], needle: &[u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut rest = haystack;
    while let Some(at) = find(rest, needle) {
        out.push(&rest[..at]);
        rest = &rest[at + needle.len()..];
    }
    out.push(rest);
    out
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

pin_project_lite::pin_project! {
    /// A streamed upload, charged to its key's `tpm` by the bytes it held when it ends.
    struct Charged {
        #[pin]
        inner: Incoming,
        admission: Admission,
        limiter: Arc<RateLimiter>,
        read: usize,
        charged: bool,
    }

    impl PinnedDrop for Charged {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if !*this.charged {
                this.admission.charge_read(this.limiter, *this.read);
            }
        }
    }
}

impl Charged {
    fn new(inner: Incoming, admission: Admission, limiter: Arc<RateLimiter>) -> Self {
        Self {
            inner,
            admission,
            limiter,
            read: 0,
            charged: false,
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
            Some(Ok(frame)) => *this.read += frame.data_ref().map_or(0, Bytes::len),
            None => {
                this.admission.charge_read(this.limiter, *this.read);
                *this.charged = true;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_found_in_json_and_in_a_form() {
        let mut headers = http::HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        assert_eq!(
            named_model(
                &headers,
                br#"{"input":"x","model":"text-embedding-3-large"}"#
            )
            .as_deref(),
            Some("text-embedding-3-large")
        );
        assert_eq!(
            named_model(&headers, br#"{"model":["a"]}"#).as_deref(),
            Some("[\"a\"]")
        );
        assert_eq!(named_model(&headers, b"not json"), None);
        headers.insert(
            header::CONTENT_TYPE,
            "multipart/form-data; boundary=XyZ".parse().unwrap(),
        );
        let form = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF\r\n--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--XyZ--\r\n";
        assert_eq!(named_model(&headers, form).as_deref(), Some("whisper-1"));
    }
}
