//! The phases of every proxied request once `router` has admitted it (`auth`). Tracking
//! is a set of optional phases: a `POST` to a path its dialect tracks (chat completions,
//! Messages, Responses) takes them all ([`tracked`]); every other request skips the
//! marked ones ([`passthrough`]). The phases every request takes are one function each,
//! shared by both, so a check added there holds on every path.
//!
//! 1. **intake**: refuse what needs no body (a listing through a shared key, a `POST`
//!    of a tenant at its quota), then take the body in: read whole within
//!    `limits.max_body_bytes` and charged by its bytes, or streamed and charged as it
//!    arrives;
//! 2. **parse**: what the body claims. A tracked body in its dialect's shape (pins,
//!    `max_messages`, the strategy header, the window's reserve); any other body read
//!    whole, its model and the objects it names;
//! 3. **authorize**: the model against the proxy key, the objects against the tenant;
//! 4. **hook**: the request-stage `[middleware]` hooks, which may refuse, redact,
//!    reroute or tag the request ([`hooks`]; an untracked `POST` read whole is shown
//!    whole and may be refused or redacted, [`hooks::on_untracked`]; the view's run in
//!    **send**, the reply's after **reply**);
//! 5. **identify** *(tracked)*: the conversation, within the request's tenant;
//! 6. **track** *(tracked)*: log the new originals before anything goes upstream;
//! 7. **fit** *(tracked)*: project the model view, and compact it past the trigger;
//! 8. **send**: the upstream's credentials, then forward. A tracked request that meets a
//!    context-length answer (an error body, a reply that stopped for the window, an
//!    error event opening a stream) is compacted tighter and retried;
//! 9. **reply**: relay the answer. A tracked reply is logged on the way
//!    ([`tracked::reply`]); what a `POST` through a shared key created becomes the
//!    tenant's.
//!
//! Each phase returns `Result<_, Halt>`; [`handle`] is the one place where a halt
//! becomes the client's answer.

mod authorize;
mod halt;
mod hooks;
mod intake;
mod passthrough;
mod tracked;
mod upload;

use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use opentelemetry::context::FutureExt as _;

use crate::access_log::RequestLog;
use crate::auth::Admission;
use crate::body::ProxyBody;
use crate::dialect::DialectKind;
use crate::state::{AppState, Snapshot};

/// Marks a request a WebSocket made from a `response.create`. An extension of the
/// request, so no client can claim it.
#[derive(Debug, Clone)]
pub(crate) struct HeldOnSocket {
    /// The upstream's own socket, when it serves one: the request goes on it, and a
    /// chain held with `store: false` is held there. Without one, the request is a
    /// `POST`, and such a chain, on the client's socket only, is sent from the record.
    pub(crate) upstream: Option<Arc<crate::upstream_socket::UpstreamSocket>>,
}

/// Which phases a request takes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Route {
    /// Every phase, for a `POST` its dialect tracks.
    Tracked(DialectKind),
    /// The phases every request takes, answered in the path's dialect's shape.
    Passthrough(DialectKind),
}

impl Route {
    /// The route of `POST`-or-not `path`.
    pub(crate) fn of(method: &http::Method, path: &str) -> Self {
        let tracking = (method == http::Method::POST)
            .then(|| DialectKind::tracking(path))
            .flatten();
        match tracking {
            Some(dialect) => Route::Tracked(dialect),
            None => Route::Passthrough(DialectKind::for_path(path)),
        }
    }

    /// The dialect whose shape every answer of this request takes.
    fn dialect(self) -> DialectKind {
        match self {
            Route::Tracked(dialect) | Route::Passthrough(dialect) => dialect,
        }
    }
}

/// Runs an admitted request through its route's phases.
pub(crate) async fn handle(
    state: &AppState,
    snap: Arc<Snapshot>,
    request: Request<Incoming>,
    log: &mut RequestLog,
    admission: Admission,
    route: Route,
) -> Response<ProxyBody> {
    let traced = open_span(
        state,
        (request.method(), request.uri().path(), request.headers()),
        route,
        log,
        &admission,
    );
    // Every content-keyed cache the request reads is its tenant's.
    let scope = crate::cache_scope::of(admission.tenant.as_str());
    let ran = crate::cache_scope::within(scope, async {
        match route {
            Route::Tracked(dialect) => {
                tracked::run(state, snap, request, log, admission, dialect).await
            }
            Route::Passthrough(dialect) => {
                passthrough::run(state, snap, request, log, admission, dialect).await
            }
        }
    });
    let ran = match traced {
        Some(cx) => ran.with_context(cx).await,
        None => ran.await,
    };
    halt::answered(ran, route.dialect())
}

/// Runs an admitted tracked request of `dialect` whose body was read already (a
/// WebSocket's `response.create`) through its phases.
pub(crate) async fn handle_read(
    state: &AppState,
    snap: Arc<Snapshot>,
    request: (http::request::Parts, crate::base::chunks::Chunks),
    log: &mut RequestLog,
    admission: Admission,
    dialect: DialectKind,
) -> Response<ProxyBody> {
    let traced = open_span(
        state,
        (&request.0.method, dialect.get().path(), &request.0.headers),
        Route::Tracked(dialect),
        log,
        &admission,
    );
    let scope = crate::cache_scope::of(admission.tenant.as_str());
    let ran = crate::cache_scope::within(scope, async {
        tracked::run_read(state, snap, request, log, admission, dialect).await
    });
    let ran = match traced {
        Some(cx) => ran.with_context(cx).await,
        None => ran.await,
    };
    halt::answered(ran, dialect)
}

/// Opens the span of a request (its method, path and headers) when tracing is on,
/// hands it to `log`, which ends it with the response, and returns the context the
/// request's work runs in.
fn open_span(
    state: &AppState,
    (method, path, headers): (&http::Method, &str, &http::HeaderMap),
    route: Route,
    log: &mut RequestLog,
    admission: &Admission,
) -> Option<opentelemetry::Context> {
    let telemetry = state.telemetry.as_ref()?;
    let tracked = matches!(route, Route::Tracked(_));
    let span = telemetry.request_span(headers, method, path, route.dialect().name(), tracked);
    let cx = span.context().clone();
    log.trace(span);
    log.set_tenant(&admission.tenant);
    Some(cx)
}

/// `inner` through the view-stage hooks of `tenant`'s requests of `model` in `dialect`:
/// a compaction the admin API runs sends the history to the provider as a request's
/// summary call would, so the same hooks keep from it what they keep from the view.
pub(crate) fn view_hooked_summary_client(
    state: &AppState,
    snap: &Snapshot,
    tenant: &crate::tenant::TenantId,
    model: &str,
    dialect: DialectKind,
    inner: Arc<dyn handoff_plugin_api::ModelClient>,
) -> Arc<dyn handoff_plugin_api::ModelClient> {
    // A proxy key's conversations belong to the tenant named after it.
    let keyed = snap
        .config
        .auth
        .keys
        .iter()
        .any(|key| key.name == tenant.as_str());
    let caller = hooks::Caller {
        tenant: tenant.clone(),
        keyed,
        path: dialect.get().path().to_owned(),
    };
    hooks::summary_client(state, snap, &caller, model, dialect, inner)
}
