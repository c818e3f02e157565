//! The proxy's own numbers for each request: the decision it logged (the budget, the
//! trigger, the calibrated estimate of the view sent, the compaction that view used,
//! why it was over the trigger, a refusal) and the provider's count of the input, from
//! the reply's usage. The web view and `audit show` draw these, not a recomputation.

use std::collections::{HashMap, HashSet};

use crate::base::digest::PrefixDigest;
use crate::base::line::{DecisionLine, Entry, HookNotes, Source};
use crate::dialect::DialectKind;
use crate::store::ConversationLog;

/// One request's figures.
#[derive(Debug, Clone)]
pub struct RequestFigures<'a> {
    /// From 1, in log order, as `audit replay --request N` takes it.
    pub number: usize,
    /// Chain digest of the request's last non-pinned message.
    pub head: Option<PrefixDigest>,
    /// The decision logged for it; `None` in a log from before decisions, for a
    /// model without a budget, and for a request still in flight.
    pub decision: Option<&'a DecisionLine>,
    /// The provider's count of the input, from the first reply's `usage`.
    pub provider: Option<u64>,
    /// What the middleware hooks did to the request before it was logged.
    pub hooks: Option<&'a HookNotes>,
}

impl RequestFigures<'_> {
    /// The compaction the view sent used, by the logged decision.
    pub fn compaction(&self) -> Option<&str> {
        self.decision.and_then(|d| d.compaction.as_deref())
    }
}

/// The figures of every request of `log`, numbered from 1.
///
/// A decision and a reply belong to the latest request line with their head (a reply:
/// with its parent) logged before them: requests of other branches may come between.
pub fn request_figures(log: &ConversationLog) -> Vec<RequestFigures<'_>> {
    let mut figures: Vec<RequestFigures<'_>> = Vec::new();
    let mut dialects: Vec<DialectKind> = Vec::new();
    let mut latest: HashMap<Option<PrefixDigest>, usize> = HashMap::new();
    for line in &log.lines {
        match &line.entry {
            Entry::Request(request) => {
                latest.insert(request.head, figures.len());
                dialects.push(DialectKind::from_name(request.dialect.as_deref()));
                figures.push(RequestFigures {
                    number: figures.len() + 1,
                    head: request.head,
                    decision: None,
                    provider: None,
                    hooks: request.hooks.as_ref(),
                });
            }
            Entry::Decision(decision) => {
                if let Some(&at) = latest.get(&decision.head) {
                    figures[at].decision = Some(decision);
                }
            }
            Entry::Message(reply) if reply.source == Source::Upstream => {
                let Some(&at) = latest.get(&reply.parent) else {
                    continue;
                };
                if figures[at].provider.is_none() {
                    figures[at].provider = reply
                        .usage
                        .as_ref()
                        .and_then(|usage| dialects[at].get().input_tokens(usage));
                }
            }
            _ => {}
        }
    }
    figures
}

/// The numbers of the requests whose view was the first to use a compaction, by the
/// compaction each request's view used (`compactions[i]` for request `i + 1`).
pub fn compacted_here<'c>(compactions: impl IntoIterator<Item = Option<&'c str>>) -> Vec<bool> {
    let mut seen = HashSet::new();
    compactions
        .into_iter()
        .map(|id| id.is_some_and(|id| seen.insert(id)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::line::Line;

    fn log(lines: &[String]) -> ConversationLog {
        ConversationLog {
            lines: lines
                .iter()
                .map(|l| Line::parse(l.as_bytes()).unwrap())
                .collect(),
            ..ConversationLog::default()
        }
    }

    fn request(head: &str) -> String {
        format!(
            r#"{{"v":1,"at":"t","kind":"request","model":"m","head":"{head}","pinned":null,"stream":false,"new_messages":1}}"#
        )
    }

    fn decision(head: &str, estimate: u64, compaction: Option<&str>) -> String {
        let compaction = compaction.map_or(String::new(), |c| format!(r#","compaction":"{c}""#));
        format!(
            r#"{{"v":4,"at":"t","kind":"decision","head":"{head}","window":100,"reserved":10,"input_budget":90,"trigger":81,"estimate":{estimate}{compaction}}}"#
        )
    }

    fn reply(digest: &str, parent: &str, prompt: u64) -> String {
        format!(
            r#"{{"v":1,"at":"t","kind":"message","digest":"{digest}","parent":"{parent}","message_digest":"{digest}","source":"upstream","message":{{"role":"assistant","content":"x"}},"usage":{{"prompt_tokens":{prompt}}},"choice":0,"complete":true}}"#
        )
    }

    #[test]
    fn each_request_gets_its_own_decision_and_first_reply_across_interleaved_branches() {
        let (a, b, c, r) = (
            "aa".repeat(32),
            "bb".repeat(32),
            "cc".repeat(32),
            "dd".repeat(32),
        );
        let log = log(&[
            request(&a),
            // Another branch's request is logged before the first one's decision.
            request(&b),
            decision(&a, 50, None),
            reply(&r, &a, 52),
            decision(&b, 60, Some("cmp-1")),
            // A regenerated reply to `a`: the first one's usage stays the provider's count.
            reply(&c, &a, 99),
            request(&c),
            decision(&c, 70, Some("cmp-1")),
        ]);
        let figures = request_figures(&log);
        let estimates: Vec<_> = figures
            .iter()
            .map(|f| f.decision.and_then(|d| d.estimate))
            .collect();
        assert_eq!(estimates, [Some(50), Some(60), Some(70)]);
        let provider: Vec<_> = figures.iter().map(|f| f.provider).collect();
        assert_eq!(provider, [Some(52), None, None]);
        assert_eq!(
            compacted_here(figures.iter().map(RequestFigures::compaction)),
            [false, true, false],
            "the first view to use cmp-1 is request 2's"
        );
    }
}
