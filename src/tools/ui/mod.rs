//! The web audit view at `GET /handoff/ui`: one self-contained page (HTML, CSS and
//! JavaScript embedded in the binary, no request to any other host) that reads the
//! admin API. It follows the admin rules like every `/handoff/*` path.

use http::header::{self, HeaderValue};
use http::Response;

use crate::body::{full, ProxyBody};

/// The page, compiled in.
const PAGE: &str = include_str!("page.html");

/// The page's response; its own Content-Security-Policy keeps it to this origin.
pub(crate) fn page() -> Response<ProxyBody> {
    let mut response = Response::new(full(PAGE));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
