//! The proxy's own endpoints under `/handoff/`. Everything but health is served to
//! loopback clients only, or to clients that present `admin.token`.

use std::net::SocketAddr;

use http::{header, HeaderValue, Request, Response};
use hyper::body::Incoming;
use serde_json::json;

use crate::audit::{from_listing, summarize, ConversationSummary, Tree};
use crate::body::{json, ProxyBody};
use crate::browser_guard::host_of;

use crate::compaction::budget::RequestBudget;
use crate::compaction::job::Job;
use crate::compaction::Reason;
use crate::conversation::{ConversationId, Tracked};
use crate::dialect::KeyHeader;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::ConversationLog;
use crate::store::{resolve_in, Store};
use crate::tenant::TenantId;

mod query;
mod rescue;
mod upkeep;

use query::query_param;
use rescue::resolve_error;

/// The header that carries the upstream credential of a manual compaction (the
/// request's own `Authorization` is the admin token).
pub(crate) const UPSTREAM_AUTHORIZATION: &str = "x-handoff-upstream-authorization";

/// The header that carries the upstream key for a manual compaction of a conversation
/// whose API takes a bare key in a header of its own (Anthropic's `x-api-key`).
pub(crate) const UPSTREAM_API_KEY: &str = "x-handoff-upstream-api-key";

/// Handles a `/handoff/*` request.
pub(crate) async fn handle(
    state: &AppState,
    request: Request<Incoming>,
    peer: SocketAddr,
) -> Response<ProxyBody> {
    let path = request.uri().path();
    if path == "/handoff/health" {
        return ok_json(&json!({"status": "ok", "version": env!("CARGO_PKG_VERSION")}));
    }
    if let Err(err) = authorize(state, &request, peer) {
        return err.into_response();
    }
    if path == "/handoff/ui" && request.method() == http::Method::GET {
        return crate::tools::ui::page();
    }
    if path == "/handoff/config" {
        let snap = state.snapshot();
        let value = json!({
            "config": crate::config::masked(&snap.config),
            "loaded_at": snap.loaded_at,
            "reload": state.reload_status(),
            "file": state.config_file().map(|p| p.display().to_string()),
        });
        return ok_json(&value);
    }
    if path == "/handoff/spend" && request.method() == http::Method::GET {
        return ok_json(&spend(&state.metrics));
    }
    if path == "/handoff/metrics" {
        let mut response = Response::new(crate::body::full(state.metrics.render()));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        );
        return response;
    }
    let upkeep = upkeep::handle(state, request.method(), path, request.uri().query(), peer).await;
    if let Some(answer) = upkeep {
        return match answer {
            Ok(value) => ok_json(&value),
            Err(err) => err.into_response(),
        };
    }
    if request.method() == http::Method::POST {
        let compact = path
            .strip_prefix("/handoff/conversations/")
            .and_then(|rest| rest.strip_suffix("/compact"));
        if let Some(id) = compact {
            let tenant = query_param(request.uri().query(), "tenant");
            return match compact_now(state, id, tenant.as_deref(), request.headers()).await {
                Ok(value) => ok_json(&value),
                Err(err) => err.into_response(),
            };
        }
    }
    if request.method() != http::Method::GET {
        return ApiError::not_found(format!("no {} endpoint at {path}", request.method()))
            .into_response();
    }
    if let Some((id, number)) = request_path(path) {
        let tenant = query_param(request.uri().query(), "tenant");
        return match request_as_sent(state, id, tenant.as_deref(), number).await {
            Ok(bytes) => {
                let mut response = Response::new(crate::body::full(bytes));
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                response
            }
            Err(err) => err.into_response(),
        };
    }
    let answer = match path.strip_prefix("/handoff/conversations") {
        Some("" | "/") => list_conversations(state, request.uri().query()).await,
        Some(rest) => match rest.strip_prefix('/') {
            Some(id) if !id.contains('/') => {
                let tenant = query_param(request.uri().query(), "tenant");
                conversation(state, id, tenant.as_deref()).await
            }
            Some(rest) if rest.ends_with("/timeline") => {
                let id = rest.trim_end_matches("/timeline");
                let query = request.uri().query();
                let tenant = query_param(query, "tenant");
                match page_of(query) {
                    Ok(page) => timeline(state, id, tenant.as_deref(), page).await,
                    Err(err) => Err(err),
                }
            }
            _ => Err(ApiError::not_found(format!(
                "no handoff endpoint at {path}"
            ))),
        },
        None => Err(ApiError::not_found(format!(
            "no handoff endpoint at {path}"
        ))),
    };
    match answer {
        Ok(value) => ok_json(&value),
        Err(err) => err.into_response(),
    }
}

/// The conversation and the number of `/handoff/conversations/{id}/requests/{n}`.
fn request_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/handoff/conversations/")?;
    let (id, number) = rest.split_once("/requests/")?;
    (!id.contains('/') && !number.contains('/')).then_some((id, number))
}

/// A request as the client sent it, for the admin API and the web view.
#[derive(serde::Serialize)]
struct AsSent<'a> {
    number: usize,
    requests: usize,
    model: &'a str,
    dialect: &'a str,
    stream: bool,
    server_held: bool,
    /// The list the client sent, each message's bytes as it sent them.
    messages: &'a [&'a serde_json::value::RawValue],
    /// The pinned messages that stood for top-level fields (`system`, `instructions`).
    top_level: &'a [&'a serde_json::value::RawValue],
    /// For a server-held request: the history the upstream held for it.
    held: &'a [&'a serde_json::value::RawValue],
    /// The replies logged for it.
    reply: &'a [&'a serde_json::value::RawValue],
    /// How many messages it carried in another form than the log held for them.
    forms: usize,
    /// What it asked of the provider's own context management, as sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    asked: Option<&'a crate::base::line::Asked>,
}

/// `GET /handoff/conversations/{id}/requests/{n}`: request `n` (from 1, in log order)
/// exactly as the client sent it, and its reply, as `audit replay --request N` gives
/// it. Serialised here so each message keeps its bytes.
async fn request_as_sent(
    state: &AppState,
    id: &str,
    tenant: Option<&str>,
    number: &str,
) -> Result<Vec<u8>, ApiError> {
    let number: usize = number.parse().map_err(|_| {
        ApiError::invalid_request(
            "invalid_request_number",
            format!("{number:?} is not a request number; requests are numbered from 1"),
        )
    })?;
    let (_, log) = read_existing(state, id, tenant).await?;
    let tree = Tree::new(&log);
    let forms = crate::audit::Forms::read(&log, &tree);
    let sent = crate::audit::sent_requests(&log, &tree, &forms);
    let total = sent.len();
    let request = match sent.get(number.wrapping_sub(1)) {
        Some(Ok(request)) => request,
        Some(Err(problem)) => {
            return Err(ApiError::internal(format!(
                "request {number} cannot be rebuilt: {}",
                problem.reason
            )))
        }
        None => {
            return Err(ApiError::not_found(format!(
                "no request {number}: the conversation has {total} request(s), numbered from 1"
            )))
        }
    };
    let answer = AsSent {
        number,
        requests: total,
        model: &request.request.model,
        dialect: crate::dialect::DialectKind::from_name(request.request.dialect.as_deref()).name(),
        stream: request.request.stream,
        server_held: request.request.server_held == Some(true),
        messages: &request.messages,
        top_level: &request.top_level,
        held: &request.held,
        reply: &request.reply,
        forms: request.request.forms.len() + request.request.inline_forms.len(),
        asked: request.request.asked.as_deref(),
    };
    serde_json::to_vec(&answer).map_err(|err| ApiError::internal(err.to_string()))
}

/// `POST /handoff/conversations/{id}/compact`: compacts the latest branch now, with the
/// configured chain. Model strategies use this request's credentials.
async fn compact_now(
    state: &AppState,
    id: &str,
    tenant: Option<&str>,
    headers: &http::HeaderMap,
) -> Result<serde_json::Value, ApiError> {
    let (id, log) = read_conversation(state, id, tenant).await?;
    let tree = Tree::new(&log);
    let body = tree
        .latest_request_body()
        .ok_or_else(|| ApiError::not_found(format!("no conversation {id}")))?;
    let request = tree
        .dialect()
        .get()
        .parse(body.as_bytes())
        .map_err(crate::rescue::dialect)?;
    let snap = state.snapshot();
    let upstream = snap.upstream_in(request.dialect, &request.model);
    // The budget the latest request was decided with: the log keeps its messages, not
    // its `max_tokens` or `tools`, which its decision recorded.
    let decided = crate::audit::request_figures(&log)
        .iter()
        .rev()
        .find_map(|figure| figure.decision)
        .map(|d| (d.reserved, d.tools));
    let budget = match decided {
        Some((reserved, tools)) => {
            RequestBudget::recorded(&snap.config, &request.model, reserved, tools)
        }
        None => RequestBudget::new(&snap.config, &request, &state.tokens),
    };
    let budget = budget.ok_or_else(|| {
        ApiError::invalid_request(
            "compaction_unavailable",
            format!(
                "compaction is disabled or model {:?} has no context_window in config",
                request.model
            ),
        )
    })?;
    let mut tracked = Tracked::compute(id.clone(), &request);
    tracked.compactions = state
        .tracker
        .compactions(&id)
        .await
        .map_err(|err| ApiError::storage(err.to_string()))?;
    let calibration = state
        .tracker
        .calibration(&id)
        .await
        .map_err(|err| ApiError::storage(err.to_string()))?;
    // The caller's Authorization is the admin token: it must never go upstream.
    let mut client_headers = http::HeaderMap::new();
    if let Some(value) = headers.get(UPSTREAM_AUTHORIZATION) {
        client_headers.insert(header::AUTHORIZATION, value.clone());
    }
    if let (Some(value), KeyHeader::Named(name)) = (
        headers.get(UPSTREAM_API_KEY),
        request.dialect.get().key_header(),
    ) {
        client_headers.insert(name, value.clone());
    }
    if upstream.key().is_some() {
        // The upstream's configured key wins, where the dialect expects it.
        snap.credentials
            .rewrite(&mut client_headers, request.dialect, upstream);
    }
    // The API's version and account headers, as a chat request's summary carries them.
    for name in crate::dialect::summary_headers() {
        if crate::dialect::credential_headers().contains(&name) {
            continue;
        }
        if let Some(value) = headers.get(name) {
            client_headers.insert(name, value.clone());
        }
    }
    tracked.calibration = calibration;
    let client = crate::compaction::model_client::summary_client(
        &snap.config,
        &budget.info.summary_model,
        request.dialect,
        upstream.clone(),
        None,
        client_headers,
    );
    let client = crate::pipeline::view_hooked_summary_client(
        state,
        &snap,
        id.tenant(),
        &request.model,
        request.dialect,
        client,
    );
    let chain = snap.registry.select(&snap.config, &request.model, None);
    let mut job = Job::new(
        &state.tracker,
        &request,
        &tracked,
        &snap.config.compaction,
        &budget,
        client,
        chain,
    );
    job.reason = Reason::Manual;
    job.prices = Some(&snap.config.prices);
    let view = state
        .compactor
        .compact(&job)
        .await
        .map_err(rescue::compact_error)?;
    let record = view
        .compaction
        .as_ref()
        .map(|adopted| serde_json::to_value(&adopted.record).unwrap_or_default())
        .unwrap_or_default();
    let aimed = json!({
        "from": if decided.is_some() { "decision" } else { "config" },
        "window": budget.model.context_window,
        "reserved": budget.model.context_window.saturating_sub(budget.input_budget),
        "input_budget": budget.input_budget,
        "trigger": budget.threshold,
        "tools_tokens": budget.tools_tokens,
    });
    Ok(json!({
        "conversation": id.to_string(),
        "tenant": id.tenant().to_string(),
        "compaction": record,
        "budget": aimed,
    }))
}

/// [`read_conversation`], with 404 for a conversation that has no line.
async fn read_existing(
    state: &AppState,
    id: &str,
    tenant: Option<&str>,
) -> Result<(ConversationId, ConversationLog), ApiError> {
    let (id, log) = read_conversation(state, id, tenant).await?;
    if log.lines.is_empty() && log.problems.is_empty() {
        return Err(ApiError::not_found(format!("no conversation {id}")));
    }
    Ok((id, log))
}

/// A conversation's log by its (checked) id and tenant; the tenant is needed only
/// when the id exists under several.
async fn read_conversation(
    state: &AppState,
    id: &str,
    tenant: Option<&str>,
) -> Result<(ConversationId, ConversationLog), ApiError> {
    let id = resolve_in(state.tracker.store().as_ref(), id, tenant)
        .await
        .map_err(resolve_error)?;
    let log = state
        .tracker
        .store()
        .read(&id)
        .await
        .map_err(|err| ApiError::storage(err.to_string()))?;
    Ok((id, log))
}

/// Largest page of `GET /handoff/conversations`.
const MAX_PAGE: usize = 500;

/// `GET /handoff/conversations?limit=N&after=ID`, in id order.
async fn list_conversations(
    state: &AppState,
    query: Option<&str>,
) -> Result<serde_json::Value, ApiError> {
    let mut limit = 50;
    let mut after = None;
    let mut tenant = None;
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        match pair.split_once('=') {
            Some(("limit", value)) => {
                limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n))
                    .ok_or_else(|| {
                        ApiError::invalid_request(
                            "invalid_limit",
                            format!("limit must be 1 to {MAX_PAGE}"),
                        )
                    })?;
            }
            Some(("after", value)) => after = Some(value.to_owned()),
            Some(("tenant", value)) => {
                tenant =
                    Some(TenantId::parse(value).map_err(|err| {
                        ApiError::invalid_request("invalid_tenant", err.to_string())
                    })?);
            }
            _ => {}
        }
    }
    let store = state.tracker.store();
    let after = match after {
        Some(cursor) => Some(list_cursor(store.as_ref(), &cursor, tenant.as_ref()).await?),
        None => None,
    };
    let storage = |err: crate::store::StoreError| ApiError::storage(err.to_string());
    let (has_more, data): (bool, Vec<ConversationSummary>) = match store
        .listings(tenant.clone(), after.clone(), limit + 1)
        .await
        .map_err(storage)?
    {
        Some(mut listings) => {
            let more = listings.len() > limit;
            listings.truncate(limit);
            (more, listings.into_iter().map(from_listing).collect())
        }
        None => {
            let ids = store
                .list(tenant, after, limit + 1)
                .await
                .map_err(storage)?;
            let mut data = Vec::with_capacity(ids.len().min(limit));
            for id in ids.iter().take(limit) {
                // A summary counts lines and reads records: message texts stay on disk.
                let log = store.read_index(id, |_| false).await.map_err(storage)?;
                data.push(summarize(id, &log));
            }
            (ids.len() > limit, data)
        }
    };
    let last = data.last();
    Ok(json!({
        "object": "list",
        "has_more": has_more,
        "last_id": last.map(|s| s.id.clone()),
        "next_after": last.filter(|_| has_more).map(|s| format!("{}/{}", s.tenant, s.id)),
        "data": data,
    }))
}

/// The `after` cursor: `TENANT/ID`, or an id of `tenant` (or of the one tenant that has it).
async fn list_cursor(
    store: &dyn Store,
    cursor: &str,
    tenant: Option<&TenantId>,
) -> Result<ConversationId, ApiError> {
    let invalid =
        |err: String| ApiError::invalid_request("invalid_cursor", format!("after: {err}"));
    if let Some((tenant, id)) = cursor.split_once('/') {
        let tenant = TenantId::parse(tenant).map_err(|err| invalid(err.to_string()))?;
        return ConversationId::parse(tenant, id).map_err(|err| invalid(err.to_string()));
    }
    let tenant = match tenant {
        Some(tenant) => tenant.clone(),
        None => store
            .find(cursor, None)
            .await
            .map_err(|err| ApiError::storage(err.to_string()))?
            .first()
            .map_or_else(TenantId::legacy, |id| id.tenant().clone()),
    };
    ConversationId::parse(tenant, cursor).map_err(|err| invalid(err.to_string()))
}

/// `GET /handoff/conversations/{id}`: the summary and every branch tip.
async fn conversation(
    state: &AppState,
    id: &str,
    tenant: Option<&str>,
) -> Result<serde_json::Value, ApiError> {
    let (id, log) = read_existing(state, id, tenant).await?;
    let branches = Tree::new(&log).tips_json();
    let mut value = serde_json::to_value(summarize(&id, &log))
        .map_err(|err| ApiError::internal(err.to_string()))?;
    value["branch_tips"] = json!(branches);
    Ok(value)
}

/// Events a timeline answer carries by default, and at most.
const TIMELINE_PAGE: usize = 2_000;
const MAX_TIMELINE_PAGE: usize = 20_000;

/// A page of timeline events: `offset` (the newest page when absent) and `limit`.
#[derive(Debug, Clone, Copy)]
struct Page {
    offset: Option<usize>,
    limit: usize,
}

fn page_of(query: Option<&str>) -> Result<Page, ApiError> {
    let number = |name: &str| {
        query_param(query, name)
            .map(|v| {
                v.parse::<usize>().map_err(|_| {
                    ApiError::invalid_request("invalid_page", format!("{name} must be a number"))
                })
            })
            .transpose()
    };
    let limit = number("limit")?.unwrap_or(TIMELINE_PAGE);
    if !(1..=MAX_TIMELINE_PAGE).contains(&limit) {
        return Err(ApiError::invalid_request(
            "invalid_page",
            format!("limit must be 1 to {MAX_TIMELINE_PAGE}"),
        ));
    }
    Ok(Page {
        offset: number("offset")?,
        limit,
    })
}

/// `GET /handoff/conversations/{id}/timeline?offset=&limit=`: the messages, requests
/// and compactions in log order, one page of them (the newest by default), every
/// request's figures and the prepared spans (`chart`, `prepared`), and the next
/// request's view (for the web audit view). `events_total` and `events_offset` say
/// where the page lies, so a huge conversation is read page by page.
async fn timeline(
    state: &AppState,
    id: &str,
    tenant: Option<&str>,
    page: Page,
) -> Result<serde_json::Value, ApiError> {
    let (id, log) = read_existing(state, id, tenant).await?;
    let snap = state.snapshot();
    let tokens = std::sync::Arc::clone(&state.tokens);
    // Counting a long conversation's tokens is CPU work: off the runtime's threads.
    let mut whole = tokio::task::spawn_blocking(move || {
        crate::audit::timeline(&id, &log, &snap.config, &tokens)
    })
    .await
    .map_err(|err| ApiError::internal(err.to_string()))?;
    let events = match whole.get_mut("events").map(serde_json::Value::take) {
        Some(serde_json::Value::Array(events)) => events,
        _ => Vec::new(),
    };
    let total = events.len();
    let offset = page
        .offset
        .unwrap_or(total.saturating_sub(page.limit))
        .min(total);
    let paged: Vec<serde_json::Value> = events.into_iter().skip(offset).take(page.limit).collect();
    whole["events"] = serde_json::Value::Array(paged);
    whole["events_total"] = json!(total);
    whole["events_offset"] = json!(offset);
    Ok(whole)
}

/// The admin rule: `Authorization: Bearer <admin.token>`, or a loopback peer that
/// names a local host and sends no `Origin` of another. A browser on this machine can
/// reach loopback too, so the `Host` check stops DNS rebinding and the `Origin` check
/// stops cross-site requests; everything else gets 403.
fn authorize(
    state: &AppState,
    request: &Request<Incoming>,
    peer: SocketAddr,
) -> Result<(), ApiError> {
    let snap = state.snapshot();
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    if let (Some(token), Some(presented)) = (snap.config.admin.token.as_deref(), presented) {
        if constant_time_eq(presented.as_bytes(), token.as_bytes()) {
            return Ok(());
        }
        return Err(ApiError::forbidden("wrong admin bearer token"));
    }
    // The authority the client addressed, host and port.
    let addressed = request
        .uri()
        .authority()
        .map(|a| a.as_str().to_ascii_lowercase())
        .or_else(|| {
            request
                .headers()
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .map(str::to_ascii_lowercase)
        });
    let host = addressed.as_deref().map(host_of);
    // A browser names the page that sent the request: only a page of this very
    // listener (same host and port) may act for the local user.
    let origin_is_ours = request.headers().get(header::ORIGIN).map(|v| {
        v.to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .is_some_and(|(_, rest)| {
                let authority = rest.split('/').next().unwrap_or(rest).to_ascii_lowercase();
                is_local_host(&host_of(&authority))
                    && Some(authority.as_str()) == addressed.as_deref()
            })
    });
    let local = snap.config.admin.loopback
        && peer.ip().is_loopback()
        && host.as_deref().is_some_and(is_local_host)
        && origin_is_ours.unwrap_or(true);
    if local {
        Ok(())
    } else {
        Err(ApiError::forbidden(
            "admin endpoints answer Authorization: Bearer <admin.token>, or (unless admin.loopback = false) loopback clients addressing localhost without a foreign Origin",
        ))
    }
}

fn is_local_host(host: &str) -> bool {
    matches!(host, "localhost" | "127.0.0.1" | "[::1]" | "::1")
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A 200 JSON answer.
pub(crate) fn ok_json(value: &serde_json::Value) -> Response<ProxyBody> {
    let mut response = Response::new(json(value));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests;

/// `GET /handoff/spend`: what replies and summary calls cost at the configured
/// `[prices]` since the process started, by tenant and by price entry, and what could
/// not be priced (never counted as free). The record holds every bill for good: `audit
/// show` and the timeline.
fn spend(metrics: &crate::metrics::Metrics) -> serde_json::Value {
    use crate::metrics::{COST_USD, SUMMARY_COST_USD, UNPRICED_REPLIES, UNPRICED_SUMMARY_CALLS};
    let by = |label: &str| {
        let replies = metrics.sum_by(COST_USD, label);
        let summaries = metrics.sum_by(SUMMARY_COST_USD, label);
        let keys: std::collections::BTreeSet<&String> =
            replies.keys().chain(summaries.keys()).collect();
        let rows: serde_json::Map<String, serde_json::Value> = keys
            .into_iter()
            .map(|key| {
                let replies = replies.get(key).copied().unwrap_or(0.0);
                let summaries = summaries.get(key).copied().unwrap_or(0.0);
                (
                    key.clone(),
                    json!({"replies_usd": replies, "summary_calls_usd": summaries, "total_usd": replies + summaries}),
                )
            })
            .collect();
        serde_json::Value::Object(rows)
    };
    json!({
        "tenants": by("tenant"),
        "prices": by("price"),
        "unpriced": {
            "replies": metrics.get(UNPRICED_REPLIES, &[]),
            "summary_calls": metrics.get(UNPRICED_SUMMARY_CALLS, &[]),
        },
    })
}
