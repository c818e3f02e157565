//! `handoff audit`: read-only views of the log of originals, safe to run while the
//! server writes (appends only ever add whole lines).

mod bill;
mod branch;
mod figures;
mod sent;
mod summary;
mod timeline;
mod verify;

use std::io::Write;

use std::sync::Arc;

use futures_util::StreamExt;
use serde_json::Value;

pub use branch::Tree;
pub use figures::{compacted_here, request_figures, RequestFigures};
pub use sent::{sent_requests, Forms, RebuildProblem, SentRequest};
pub use summary::{from_listing, summarize, ConversationSummary};
pub use timeline::{next_view, timeline};
pub use verify::{incomplete_replies, verify_log};

use crate::base::digest::Digest;
use crate::base::line::{Entry, RequestLine};
use crate::base::tenant::TenantId;
use crate::compaction::adopt;
use crate::config::Price;
use crate::conversation::ConversationId;
use crate::dialect::DialectKind;
use crate::redact::strip_controls;
use crate::store::layout::ResolveError;
use crate::store::{resolve_in, ConversationLog, Store, StoreError};

/// Conversations `audit list` reads at once.
const LIST_READS: usize = 8;

/// Conversations `audit list` reads at once from a store that keeps their counts.
const LIST_PAGE: usize = 1_000;

/// One line of `audit list`: words, or a JSON object.
fn print_summary(
    summary: &ConversationSummary,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), AuditError> {
    if json {
        serde_json::to_writer(&mut *out, summary)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "{}  tenant={} first={} last={} messages={} requests={} branches={} compactions={} models={}",
        summary.id,
        summary.tenant,
        summary.first_seen.as_deref().unwrap_or("-"),
        summary.last_seen.as_deref().unwrap_or("-"),
        summary.messages,
        summary.requests,
        summary.branches,
        summary.compactions,
        summary.models.join(","),
    )?;
    Ok(())
}

/// Why an audit command failed.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The conversation could not be found, or was named ambiguously.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The branch digest is unknown or not a digest.
    #[error("no branch ending at {0}")]
    Branch(String),
    /// Reading or writing failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Output could not be encoded.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// `verify` found problems.
    #[error("{0} problem(s) found")]
    Problems(usize),
    /// `replay --request N` named a request the conversation does not have.
    #[error("no request {0}: the conversation has {1} request(s), numbered from 1")]
    Request(usize, usize),
    /// The request's line names what the log does not hold.
    #[error("request {0} cannot be rebuilt: {1}")]
    Rebuild(usize, String),
}

impl AuditError {
    /// Whether output stopped because the reader closed the pipe.
    pub fn is_broken_pipe(&self) -> bool {
        let kind = match self {
            Self::Io(err) => Some(err.kind()),
            Self::Json(err) => err.io_error_kind(),
            _ => None,
        };
        kind == Some(std::io::ErrorKind::BrokenPipe)
    }
}

/// Read-only access to a store: a data folder or the shared database. A conversation
/// is named by its id, and by its tenant (`--tenant`) only when the id exists under
/// several.
pub struct Audit {
    store: Arc<dyn Store>,
    runtime: tokio::runtime::Handle,
    /// `[prices]`: what `show` bills each reply at.
    prices: std::collections::BTreeMap<String, Price>,
}

impl Audit {
    /// Audits the conversations of `store`, whose futures run on `runtime` (called
    /// from outside it: the commands are synchronous).
    pub fn new(store: Arc<dyn Store>, runtime: tokio::runtime::Handle) -> Self {
        Self {
            store,
            runtime,
            prices: Default::default(),
        }
    }

    /// Bills replies at `prices` (`[prices]`) in `show`.
    pub fn priced(mut self, prices: std::collections::BTreeMap<String, Price>) -> Self {
        self.prices = prices;
        self
    }

    fn resolve(&self, id: &str, tenant: Option<&str>) -> Result<ConversationId, AuditError> {
        Ok(self
            .runtime
            .block_on(resolve_in(self.store.as_ref(), id, tenant))?)
    }

    fn read(
        &self,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<(ConversationId, ConversationLog), AuditError> {
        let id = self.resolve(id, tenant)?;
        Ok((id.clone(), self.read_id(&id)?))
    }

    fn read_id(&self, id: &ConversationId) -> Result<ConversationLog, AuditError> {
        Ok(self.runtime.block_on(self.store.read(id))?)
    }

    fn ids(&self) -> Result<Vec<ConversationId>, AuditError> {
        self.ids_of(None)
    }

    fn ids_of(&self, tenant: Option<TenantId>) -> Result<Vec<ConversationId>, AuditError> {
        Ok(self
            .runtime
            .block_on(self.store.list(tenant, None, usize::MAX))?)
    }

    /// `audit list`: one conversation per line, or one JSON object per line; of one
    /// tenant, or of all.
    pub fn list(
        &self,
        tenant: Option<&str>,
        json: bool,
        out: &mut dyn Write,
    ) -> Result<(), AuditError> {
        let tenant = tenant
            .map(TenantId::parse)
            .transpose()
            .map_err(|err| AuditError::Resolve(err.into()))?;
        if self.list_kept(tenant.as_ref(), json, out)? {
            return Ok(());
        }
        let ids = self.ids_of(tenant)?;
        // Reads run on the blocking pool, a few at once, and print in order.
        let reads = futures_util::stream::iter(ids)
            .map(|id| {
                let store = Arc::clone(&self.store);
                async move {
                    // A summary counts lines and reads records: message texts are
                    // dropped as each line is read.
                    let log = store.read_index(&id, |_| false).await;
                    (id, log)
                }
            })
            .buffered(LIST_READS);
        self.runtime.block_on(async {
            futures_util::pin_mut!(reads);
            while let Some((id, log)) = reads.next().await {
                print_summary(&summarize(&id, &log?), json, out)?;
            }
            Ok(())
        })
    }

    /// `audit list` from the counts the store keeps, a page at a time; false when it
    /// keeps none and the logs must be read.
    fn list_kept(
        &self,
        tenant: Option<&TenantId>,
        json: bool,
        out: &mut dyn Write,
    ) -> Result<bool, AuditError> {
        let mut after = None;
        loop {
            let page = self.runtime.block_on(self.store.listings(
                tenant.cloned(),
                after.take(),
                LIST_PAGE,
            ))?;
            let Some(page) = page else {
                return Ok(false);
            };
            let full = page.len() == LIST_PAGE;
            after = page.last().map(|listing| listing.id.clone());
            for listing in page {
                print_summary(&from_listing(listing), json, out)?;
            }
            if !full {
                return Ok(true);
            }
        }
    }

    /// `audit show`: a readable timeline of every line.
    pub fn show(
        &self,
        id: &str,
        tenant: Option<&str>,
        out: &mut dyn Write,
    ) -> Result<(), AuditError> {
        let (id, log) = self.read(id, tenant)?;
        let summary = summarize(&id, &log);
        let tree = Tree::new(&log);
        let dialect = tree.dialect();
        writeln!(
            out,
            "conversation {} (tenant {}, dialect {}): {} messages, {} requests, {} branches, models {}",
            summary.id,
            summary.tenant,
            dialect.name(),
            summary.messages,
            summary.requests,
            summary.branches,
            summary.models.join(",")
        )?;
        let figures = request_figures(&log);
        let first_uses = compacted_here(figures.iter().map(RequestFigures::compaction));
        let mut requests = 0usize;
        let mut bill = bill::Bill::default();
        let kept_out = bill::kept_out(&log.compactions);
        let mut last_model = "";
        for line in &log.lines {
            match &line.entry {
                Entry::Form(form) => {
                    let original = form.of.and_then(|of| tree.message(&of)).map(|m| m.get());
                    let bytes = form.bytes(original).unwrap_or_default();
                    writeln!(
                        out,
                        "{}  form     {} of {}{}  {}",
                        line.at,
                        form.digest.short(12),
                        form.of.map_or("a pinned message".to_owned(), |o| o.short(12)),
                        if form.edit.is_some() { " (an edit)" } else { "" },
                        preview(dialect, &serde_json::from_str(&bytes).unwrap_or(Value::Null)),
                    )?
                }
                Entry::Message(message) => {
                    let value: Value =
                        serde_json::from_str(message.message.get()).unwrap_or(Value::Null);
                    // A Responses item without a role is named by its type.
                    let role = value
                        .get("role")
                        .or_else(|| value.get("type"))
                        .and_then(Value::as_str)
                        .unwrap_or("?");
                    let mut usage = message
                        .usage
                        .as_ref()
                        .map(|u| format!(" usage={u}"))
                        .unwrap_or_default();
                    let billed = message.usage.as_ref().and_then(|u| dialect.get().billed(u));
                    if let Some(billed) = billed {
                        // A reply names its model; a line without one, its request's.
                        let model = if message.model.is_empty() {
                            last_model
                        } else {
                            message.model.as_str()
                        };
                        let cost = bill.add(&self.prices, model, billed);
                        // A priced reply's request went without what its compaction
                        // keeps out.
                        let used = requests.checked_sub(1).and_then(|at| figures.get(at));
                        if let Some(tokens) = used
                            .and_then(RequestFigures::compaction)
                            .and_then(|id| kept_out.get(id))
                        {
                            bill.kept_out(&self.prices, model, *tokens);
                        }
                        usage.push_str(&cost);
                    }
                    if let Some(cut) = &message.incomplete {
                        usage.push_str(&format!(" INCOMPLETE ({cut})"));
                    }
                    if crate::dialect::is_provider_compaction(&value) {
                        usage.push_str(" PROVIDER COMPACTION");
                    }
                    writeln!(
                        out,
                        "{}  {:<8} {:<9} {} <- {}  {}{}",
                        line.at,
                        format!("{:?}", message.source).to_lowercase(),
                        role,
                        message.digest.short(12),
                        message.parent.map_or("root".to_owned(), |p| p.short(12)),
                        preview(dialect, &value),
                        usage
                    )?;
                }
                Entry::Pinned(pinned) => writeln!(
                    out,
                    "{}  pinned   {} message(s) {}",
                    line.at,
                    pinned.messages.len(),
                    pinned.digest.short(12)
                )?,
                Entry::CompactBoundary(boundary) => writeln!(
                    out,
                    "{}  boundary {} covers {}",
                    line.at,
                    boundary.compact_id,
                    boundary.prefix_digest.short(12)
                )?,
                Entry::Request(request) => {
                    last_model = request.model.as_str();
                    writeln!(
                    out,
                    "{}  request  #{} model={} stream={} new={} head={}{}{}{}",
                    line.at,
                    {
                        requests += 1;
                        requests
                    },
                    strip_controls(&request.model),
                    request.stream,
                    request.new_messages,
                    request.head.map_or("-".to_owned(), |h| h.short(12)),
                    match request.forms.len() + request.inline_forms.len() {
                        0 => String::new(),
                        forms => format!(" forms={forms}"),
                    },
                    request_kind(request),
                    figures
                        .get(requests - 1)
                        .map(|f| shown_figures(f, first_uses.get(requests - 1) == Some(&true)))
                        .unwrap_or_default()
                )?;
                }
                // Shown with its request.
                Entry::Decision(_) => {}
                Entry::Adopt(adopt) => writeln!(
                    out,
                    "{}  ADOPTED  prepared compaction {} head={}: {} message(s) arrived since it was prepared",
                    line.at,
                    adopt.compact_id,
                    adopt.head.map_or("-".to_owned(), |h| h.short(12)),
                    adopt.arrived
                )?,
                Entry::StandIn(stand_in) => writeln!(
                    out,
                    "{}  STAND-IN {} head={}: the summary ran past compaction.max_wait ({} ms waited); sent with {}'s handoff, tokens {}→{}, covers {} messages",
                    line.at,
                    stand_in.record.id,
                    stand_in.head.map_or("-".to_owned(), |h| h.short(12)),
                    stand_in.waited_ms,
                    stand_in.record.strategy,
                    stand_in.record.tokens_before,
                    stand_in.record.tokens_after,
                    stand_in.record.source.end_exclusive
                )?,
                Entry::Rescue(rescue) => {
                    let shortened: Vec<String> = rescue
                        .shortened
                        .iter()
                        .map(|s| format!("#{} {}→{} bytes", s.index, s.bytes_before, s.bytes_after))
                        .collect();
                    writeln!(
                        out,
                        "{}  RESCUED  head={} tool results shortened in the view only: {}",
                        line.at,
                        rescue.head.map_or("-".to_owned(), |h| h.short(12)),
                        shortened.join(", ")
                    )?;
                }
            }
        }
        for problem in &log.problems {
            writeln!(out, "line {}: {}", problem.line, problem.reason)?;
        }
        let adopted = adopt(&log).adopted;
        for record in &log.compactions {
            let attempts: Vec<String> = record
                .attempts
                .iter()
                .map(|a| {
                    format!(
                        "{} {}{} ({} ms)",
                        a.strategy,
                        a.outcome,
                        a.reason
                            .as_deref()
                            .map(|r| format!(": {r}"))
                            .unwrap_or_default(),
                        a.duration_ms
                    )
                })
                .collect();
            writeln!(
                out,
                "compaction {} {}: strategy={} reason={:?} tokens {}→{} covers {} messages; attempts: {}{}",
                record.id,
                if adopted.contains_key(&record.source.prefix_digest) { "adopted" } else { "NOT ADOPTED" },
                record.strategy,
                record.reason,
                record.tokens_before,
                record.tokens_after,
                record.source.end_exclusive,
                attempts.join(", "),
                match bill.add_compaction(&self.prices, record) {
                    None => " summary calls unpriced".to_owned(),
                    Some(cost) if cost > 0.0 => format!(" summary calls cost=${cost:.6}"),
                    Some(_) => String::new(),
                }
            )?;
        }
        writeln!(out, "{bill}")?;
        Ok(())
    }

    /// `audit replay`: a request as the client sent it, then its reply, as one JSON
    /// array: request `number` (from 1, in log order), else the latest request on the
    /// branch ending at `branch` (the latest branch by default). When middleware hooks
    /// changed the request before it was logged, `notes` gets a line that says how.
    pub fn replay(
        &self,
        id: &str,
        tenant: Option<&str>,
        branch: Option<&str>,
        number: Option<usize>,
        out: &mut dyn Write,
        notes: &mut dyn Write,
    ) -> Result<(), AuditError> {
        let (_, log) = self.read(id, tenant)?;
        let tree = Tree::new(&log);
        let forms = Forms::read(&log, &tree);
        let sent = sent_requests(&log, &tree, &forms);
        let (request, reply) = if let Some(number) = number {
            let chosen = sent
                .get(number.wrapping_sub(1))
                .ok_or(AuditError::Request(number, sent.len()))?;
            let request = rebuilt(chosen)?;
            (request, request.reply.clone())
        } else {
            let tip = match branch {
                Some(text) => {
                    Digest::from_hex(text).ok_or_else(|| AuditError::Branch(text.to_owned()))?
                }
                None => match tree.latest_tip() {
                    Some(tip) => tip,
                    None => {
                        writeln!(out, "[]")?;
                        return Ok(());
                    }
                },
            };
            let path = tree
                .branch(&tip)
                .ok_or_else(|| AuditError::Branch(tip.to_hex()))?;
            let at = |r: &Result<SentRequest, RebuildProblem>| {
                let head = match r {
                    Ok(r) => r.request.head,
                    Err(p) => match &log.lines[p.line].entry {
                        Entry::Request(request) => request.head,
                        _ => None,
                    },
                };
                path.iter().position(|m| Some(m.digest) == head)
            };
            let Some((chosen, at)) = sent.iter().rev().find_map(|r| Some((r, at(r)?))) else {
                // A branch no request line names (a log from before request lines).
                let messages = tree
                    .client_messages(&tip)
                    .ok_or_else(|| AuditError::Branch(tip.to_hex()))?;
                serde_json::to_writer_pretty(&mut *out, &messages)?;
                writeln!(out)?;
                return Ok(());
            };
            let request = rebuilt(chosen)?;
            // The branch's own reply: a regenerated one is another branch.
            let reply = path[at + 1..].iter().map(|m| m.message.as_ref()).collect();
            (request, reply)
        };
        // A server-held request carried only its new items: the history it continued
        // comes first, as the client sent it in the requests before.
        let all: Vec<&serde_json::value::RawValue> = request
            .held
            .iter()
            .chain(&request.messages)
            .chain(&reply)
            .copied()
            .collect();
        serde_json::to_writer_pretty(&mut *out, &all)?;
        writeln!(out)?;
        if let Some(asked) = &request.request.asked {
            writeln!(
                notes,
                "note: this request asked the provider's own context management for: {}",
                asked.describe()
            )?;
        }
        if let Some(hooks) = request.request.hooks.as_ref().filter(|h| !h.is_empty()) {
            writeln!(
                notes,
                "note: middleware hooks changed this request before it was logged, and this is the form logged and sent: {}",
                hooks_shown(hooks)
            )?;
        }
        Ok(())
    }

    /// `audit view`: the model view the next request would be sent with, as JSON.
    pub fn view(
        &self,
        id: &str,
        tenant: Option<&str>,
        out: &mut dyn Write,
    ) -> Result<(), AuditError> {
        let (id, log) = self.read(id, tenant)?;
        let messages = next_view(&id, &log, &Tree::new(&log));
        serde_json::to_writer_pretty(&mut *out, &messages)?;
        writeln!(out)?;
        Ok(())
    }

    /// `audit verify`: checks one conversation or all; fails if any problem is found.
    pub fn verify(
        &self,
        id: Option<&str>,
        tenant: Option<&str>,
        out: &mut dyn Write,
    ) -> Result<(), AuditError> {
        let ids = match id {
            Some(id) => vec![self.resolve(id, tenant)?],
            None => self.ids()?,
        };
        let mut total = 0;
        let mut incomplete = 0;
        for id in &ids {
            let log = self.read_id(id)?;
            let id = format!("{}/{id}", id.tenant());
            let mut problems = verify_log(&log);
            problems.extend(crate::adoption::compaction_problems(&log));
            problems.sort_by_key(|p| p.line);
            for problem in &problems {
                writeln!(out, "{id}: line {}: {}", problem.line, problem.reason)?;
            }
            // A reply cut short is a faithful record of what happened, not damage.
            for (line, cut) in incomplete_replies(&log) {
                writeln!(out, "{id}: line {line}: note: incomplete reply ({cut})")?;
                incomplete += 1;
            }
            // So is a record whose boundary a crash kept from being written: never adopted.
            for record in crate::adoption::adopt(&log).uncommitted {
                writeln!(
                    out,
                    "{id}: note: compaction {record} was never committed (no boundary); ignored"
                )?;
            }
            total += problems.len();
        }
        if total > 0 {
            return Err(AuditError::Problems(total));
        }
        writeln!(
            out,
            "ok: {} conversation(s) verified, {incomplete} incomplete reply(ies)",
            ids.len()
        )?;
        Ok(())
    }
}

/// The request `sent` holds, or why it cannot be rebuilt.
fn rebuilt<'r, 'a>(
    sent: &'r Result<SentRequest<'a>, RebuildProblem>,
) -> Result<&'r SentRequest<'a>, AuditError> {
    sent.as_ref()
        .map_err(|problem| AuditError::Rebuild(problem.number, problem.reason.clone()))
}

/// What kind of request a request line was, when not a plain one, and what it asked
/// of the provider's own context management.
fn request_kind(request: &RequestLine) -> String {
    let mut kind = String::new();
    if request.server_held == Some(true) {
        kind.push_str("  SERVER-HELD (history kept by the upstream; never rewritten)");
    } else if request.carried.is_some() {
        kind.push_str(
            "  AFTER PROVIDER COMPACTION (what the provider compacted away was not sent)",
        );
    }
    if let Some(asked) = &request.asked {
        kind.push_str(&format!(
            "\n{:>26}asked the provider: {}",
            "",
            strip_controls(&asked.describe())
        ));
    }
    kind
}

/// A request's figures on its `audit show` line: the budget and trigger it was
/// measured against, the calibrated estimate of what was sent (`~`), the provider's
/// count, and what happened when it was not a plain send.
fn shown_figures(figure: &RequestFigures<'_>, compacted_here: bool) -> String {
    let mut shown = String::new();
    if let Some(hooks) = figure.hooks.filter(|h| !h.is_empty()) {
        shown.push_str(&format!("\n{:>26}hooks: {}", "", hooks_shown(hooks)));
    }
    if let Some(d) = figure.decision {
        shown.push_str(&format!(
            "\n{:>26}budget={} (window {} - reserved {}) trigger={}",
            "", d.input_budget, d.window, d.reserved, d.trigger
        ));
        if let Some(estimate) = d.estimate {
            // A refused request sent nothing: its estimate is of the view it would have.
            let what = if d.refused.is_some() {
                "estimate"
            } else {
                "sent"
            };
            shown.push_str(&format!(" {what}~{estimate}"));
        }
        if let Some(local) = d.local.filter(|local| Some(*local) != d.estimate) {
            shown.push_str(&format!(" (local {local})"));
        }
        if d.tools > 0 {
            shown.push_str(&format!(" tools={}", d.tools));
        }
    }
    if let Some(provider) = figure.provider {
        shown.push_str(&format!(" provider={provider}"));
    }
    let Some(d) = figure.decision else {
        return shown;
    };
    if let Some(compaction) = &d.compaction {
        let mark = if compacted_here {
            "COMPACTED HERE"
        } else {
            "with"
        };
        shown.push_str(&format!(" {mark} {compaction}"));
    }
    if let Some(over) = &d.over {
        shown.push_str(&format!(" OVER THE TRIGGER ({over})"));
    }
    if d.retries > 0 {
        shown.push_str(&format!(" after {} refused view(s)", d.retries));
    }
    if let Some(code) = &d.refused {
        shown.push_str(&format!(
            " REFUSED {code}: {}",
            strip_controls(d.detail.as_deref().unwrap_or_default())
        ));
    }
    if let Some(status) = d.upstream_status {
        shown.push_str(&format!(" UPSTREAM ANSWERED {status}"));
    }
    if let Some(held) = &d.from_record {
        shown.push_str(&format!(" SENT FROM THE RECORD (held by {held})"));
    }
    if !d.redacted.is_empty() {
        shown.push_str(&format!(
            " view redacted: {}",
            redactions_shown(&d.redacted)
        ));
    }
    shown
}

/// What hooks did to a request, on its `audit show` line and in `audit replay`'s note.
pub fn hooks_shown(notes: &crate::base::line::HookNotes) -> String {
    let mut parts = Vec::new();
    if let Some(from) = &notes.model_from {
        parts.push(format!("sent to this model instead of {from:?}"));
    }
    if !notes.redacted.is_empty() {
        parts.push(format!("redacted {}", redactions_shown(&notes.redacted)));
    }
    if !notes.tags.is_empty() {
        let tags: Vec<String> = notes
            .tags
            .iter()
            .map(|(k, v)| format!("{}={}", strip_controls(k), strip_controls(v)))
            .collect();
        parts.push(format!("tagged {}", tags.join(" ")));
    }
    parts.join("; ")
}

/// `email ×3 (2 texts) by "secrets", …`: the markers, `[redacted:email:…]`, are in the
/// messages.
fn redactions_shown(notes: &[crate::base::line::RedactionNote]) -> String {
    notes
        .iter()
        .map(|n| {
            let texts = if n.texts == 1 {
                "1 text".to_owned()
            } else {
                format!("{} texts", n.texts)
            };
            format!(
                "{} ×{} ({texts}) by {:?}",
                strip_controls(&n.label),
                n.count,
                strip_controls(&n.hook)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The start of a message's text, on one line, and the tools it calls: read in the
/// neutral form, whatever the dialect.
fn preview(dialect: DialectKind, message: &Value) -> String {
    let neutral = dialect.get().neutral(message);
    let text: Vec<String> = neutral
        .iter()
        .map(handoff_plugin_api::content_text)
        .filter(|text| !text.is_empty())
        .collect();
    let text = text.join(" ");
    let calls: Vec<String> = neutral
        .iter()
        .flat_map(handoff_plugin_api::tool_calls)
        .map(|(_, name, _)| strip_controls(name).into_owned())
        .collect();
    let mut shown: String = text
        .chars()
        .take(80)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().count() > 80 {
        shown.push('…');
    }
    if !calls.is_empty() {
        shown.push_str(&format!(" [calls {}]", calls.join(", ")));
    }
    shown
}
