//! What the phases of a traced request put on its span: the model asked for, the
//! decision that sent the view, the reply's usage and finish reasons, and (on the
//! operator's opt-in only) the messages sent and answered.

use opentelemetry::{Array, KeyValue, StringValue, Value};

use crate::base::line::DecisionLine;
use crate::base::reply::Assembled;
use crate::dialect::DialectKind;
use crate::telemetry::spans::{self, attr, number, Tracing};

/// The request's model, on the span and in the facts its metrics are labelled with.
pub(crate) fn request_model(model: &str) {
    if model.is_empty() {
        return;
    }
    spans::note(|| vec![KeyValue::new(attr::REQUEST_MODEL, model.to_owned())]);
    spans::learn(|facts| facts.request_model = Some(model.to_owned()));
}

/// The decision that sent (or refused) the view, and the tokens its handoff saved.
pub(crate) fn decision(decision: &DecisionLine, saved: Option<u64>) {
    spans::note(|| {
        let mut attributes = vec![
            number("handoff.decision.window", decision.window),
            number("handoff.decision.input_budget", decision.input_budget),
            number("handoff.decision.trigger", decision.trigger),
            KeyValue::new("handoff.decision.retried", i64::from(decision.retries)),
        ];
        if let Some(estimate) = decision.estimate {
            attributes.push(number("handoff.decision.estimate", estimate));
        }
        if let Some(over) = &decision.over {
            attributes.push(KeyValue::new("handoff.decision.over", over.clone()));
        }
        if let Some(refused) = &decision.refused {
            attributes.push(KeyValue::new("handoff.decision.refused", refused.clone()));
        }
        if let Some(compaction) = &decision.compaction {
            attributes.push(KeyValue::new("handoff.compaction.id", compaction.clone()));
        }
        if let Some(saved) = saved {
            attributes.push(number("handoff.tokens_saved", saved));
        }
        if let Some(from) = &decision.from_record {
            attributes.push(KeyValue::new("handoff.decision.from_record", from.clone()));
        }
        attributes
    });
}

/// The messages of the body sent upstream (after the view-stage hooks), when the
/// operator opted in to contents.
pub(crate) fn input(body: &crate::base::chunks::Chunks) {
    if !Tracing::current().is_some_and(|t| t.captures_content()) {
        return;
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body.contiguous()) else {
        return;
    };
    // Each API's own names for what the model reads.
    let messages: serde_json::Map<String, serde_json::Value> = [
        "system",
        "instructions",
        "messages",
        "input",
        "contents",
        "systemInstruction",
    ]
    .into_iter()
    .filter_map(|key| Some((key.to_owned(), value.get(key)?.clone())))
    .collect();
    spans::note(|| {
        vec![KeyValue::new(
            attr::INPUT_MESSAGES,
            serde_json::Value::Object(messages).to_string(),
        )]
    });
}

/// What the reply said of itself: usage, finish reasons, and its messages when the
/// operator opted in. `cx` is the request's context: a stream ends on the connection's
/// task, outside it.
pub(crate) fn reply(cx: &opentelemetry::Context, dialect: DialectKind, assembled: &Assembled) {
    use opentelemetry::trace::TraceContextExt;
    let Some(tracing) = cx.get::<Tracing>() else {
        return;
    };
    let span = cx.span();
    let mut attributes = Vec::new();
    let billed = assembled
        .usage
        .as_ref()
        .and_then(|usage| dialect.get().billed(usage));
    if let Some(billed) = &billed {
        let (usage, tokens) = spans::usage(billed);
        attributes.extend(usage);
        if let Some(shared) = cx.get::<spans::SharedFacts>() {
            if let Ok(mut facts) = shared.0.lock() {
                facts.tokens = Some(tokens);
            }
        }
    }
    let reasons: Vec<StringValue> = assembled
        .replies
        .iter()
        .filter_map(|reply| reply.finish_reason.clone())
        .map(StringValue::from)
        .collect();
    if !reasons.is_empty() {
        attributes.push(KeyValue::new(
            attr::FINISH_REASONS,
            Value::Array(Array::String(reasons)),
        ));
    }
    if let Some(id) = &assembled.response_id {
        attributes.push(KeyValue::new(attr::RESPONSE_ID, id.clone()));
    }
    if tracing.captures_content() {
        let messages: Vec<&serde_json::value::RawValue> =
            assembled.replies.iter().map(|r| &*r.message).collect();
        if let Ok(text) = serde_json::to_string(&messages) {
            attributes.push(KeyValue::new(attr::OUTPUT_MESSAGES, text));
        }
    }
    span.set_attributes(attributes);
}

/// The model a reply read whole names (`model`, Gemini's `modelVersion`).
pub(crate) fn response_model(cx: &opentelemetry::Context, body: &[u8]) {
    use opentelemetry::trace::TraceContextExt;
    if cx.get::<Tracing>().is_none() {
        return;
    }
    #[derive(serde::Deserialize)]
    struct Named {
        model: Option<String>,
        #[serde(rename = "modelVersion")]
        model_version: Option<String>,
    }
    let Ok(named) = serde_json::from_slice::<Named>(body) else {
        return;
    };
    let Some(model) = named.model.or(named.model_version) else {
        return;
    };
    cx.span()
        .set_attribute(KeyValue::new(attr::RESPONSE_MODEL, model.clone()));
    if let Some(shared) = cx.get::<spans::SharedFacts>() {
        if let Ok(mut facts) = shared.0.lock() {
            facts.response_model = Some(model);
        }
    }
}
