//! A request that continues a conversation the upstream holds (`previous_response_id`,
//! a `conversation`) and would overflow the window with it: continued from handoff's
//! own record instead, as a request that stands alone (the whole history, from the
//! record, without the reference), which **fit** then compacts like any other. One
//! that fits goes as it came.
//!
//! A chain a WebSocket holds with `store: false` lives on the client's connection, not
//! upstream: it always goes from the record.
//!
//! A chain is judged first by what the upstream counted for its latest reply (no log
//! read), then by the history itself. After a compaction the upstream's next response
//! starts from the compacted view, so a chain goes on from there on the server. A
//! conversation object stays as it was on the server: once past the window, each of
//! its requests is sent from the record.

use serde_json::Value;

use super::{Exchange, Halt};
use crate::compaction::budget::RequestBudget;
use crate::conversation::Tracked;
use crate::dialect::DialectKind;
use crate::pipeline::HeldOnSocket;
use crate::projection::project_view;

/// The counter of server-held requests sent from the record.
pub(super) const UNCHAINED: &str = "handoff_unchained_total";

impl Exchange<'_> {
    /// Phase 6½: a server-held request past the window becomes one that stands alone,
    /// from the record; everything after reads it as such.
    pub(super) async fn unchain(&mut self) -> Result<(), Halt> {
        // A handle opened in a server-held request stands where the client put it.
        if !self.chat.server_held
            || self.chat.dialect != DialectKind::Responses
            || self.chat.expanded.is_some()
        {
            return Ok(());
        }
        let tracked = self.tracked()?;
        let store_false = self.store_false();
        // A chain a socket holds without the upstream storing it lives on the client's
        // connection only: the upstream cannot read it, so it always goes from the record.
        let on_socket = store_false
            && (self.parts.extensions.get::<HeldOnSocket>())
                .is_some_and(|held| held.upstream.is_none());
        // The budget the request would have standing alone (a server-held one has none).
        let budget = RequestBudget::new(&self.snap.config, &self.chat, &self.state.tokens);
        if budget.is_none() && !on_socket {
            return Ok(());
        }
        if let (Some(budget), false) = (&budget, on_socket) {
            let adds = project_view(&self.chat, tracked, &Default::default()).estimate(
                &self.state.tokens,
                budget.tokenizer(),
                budget.tools_tokens,
            );
            // A chain whose latest reply left room for this request is the upstream's.
            let fits_held = |held: u64| held + adds <= budget.threshold;
            if !self.chat.continues_conversation && tracked.held.is_some_and(fits_held) {
                return Ok(());
            }
        }
        let history = match self.chain_history(tracked).await {
            Ok(history) => history,
            // Not in the record: the upstream's to hold, as it came.
            Err(_) => return Ok(()),
        };
        let history = match store_false {
            true => unresolvable_dropped(history),
            false => history,
        };
        let list: Vec<&str> = history.iter().map(String::as_str).collect();
        let view = project_view(&self.chat, tracked, &tracked.compactions);
        let (body, mut chat) = self.standing_alone(&view, &list)?;
        let mut whole = Tracked::compute(tracked.id.clone(), &chat);
        whole.compactions = tracked.compactions.clone();
        whole.calibration = tracked.calibration.clone();
        whole.logged = tracked.logged;
        // Judged on the whole history, as the upstream may hold it: a conversation
        // object once sent from the record holds less than the record (its requests
        // since went alone), so it stays sent from the record.
        if let (Some(budget), false) = (&budget, on_socket) {
            let estimate = project_view(&chat, &whole, &Default::default()).estimate(
                &self.state.tokens,
                budget.tokenizer(),
                budget.tools_tokens,
            );
            if estimate <= budget.threshold {
                return Ok(());
            }
            tracing::info!(conversation = %tracked.id, estimate, threshold = budget.threshold, continues = ?self.chat.continues, "a server-held conversation past the window: sent from the record");
        }
        let how = match (on_socket, self.chat.continues_conversation) {
            (true, _) => "socket",
            (false, true) => "conversation",
            (false, false) => "previous_response",
        };
        self.state.metrics.add(UNCHAINED, &[("how", how)], 1.0);
        self.from_record = Some(how);
        // The record goes on as the client's: its reply moves the server's conversation
        // (or chain) on, after the client's own items.
        chat.continues = self.chat.continues.take();
        chat.continues_conversation = self.chat.continues_conversation;
        chat.asked = self.chat.asked.take();
        self.chat = chat;
        self.body = body;
        self.budget = budget;
        self.tracked = Some(whole);
        Ok(())
    }

    /// True when the request asks the upstream to keep nothing (`store: false`).
    fn store_false(&self) -> bool {
        #[derive(serde::Deserialize)]
        struct Store {
            store: Option<bool>,
        }
        serde_json::from_slice::<Store>(self.body.contiguous())
            .is_ok_and(|s| s.store == Some(false))
    }
}

/// `history` without the reasoning items an upstream that stores nothing cannot
/// resolve: those it returned without their `encrypted_content`.
fn unresolvable_dropped(history: Vec<String>) -> Vec<String> {
    history
        .into_iter()
        .filter(|raw| {
            let item: Value = serde_json::from_str(raw).unwrap_or_default();
            item["type"] != "reasoning"
                || item.get("encrypted_content").is_some_and(|c| !c.is_null())
        })
        .collect()
}
