//! Each message's neutral form, kept by its digest, for the middleware hooks: a long
//! conversation re-sends its history every turn, and most of its messages are never
//! parsed on the request path otherwise.

use std::sync::Arc;

use serde_json::Value;

use crate::base::digest::MessageDigest;
use crate::dialect::{ChatRequest, DialectKind};

/// Neutral forms by [`cache_scope`](crate::cache_scope) (per tenant: no request finds,
/// or times, another tenant's), dialect and message digest, up to [`KEPT_FORM_BYTES`]
/// of messages.
pub(crate) struct NeutralForms {
    kept: quick_cache::sync::Cache<(u64, DialectKind, MessageDigest), Forms, RawBytes>,
}

/// One message's neutral form, and the bytes it came from (its weight).
#[derive(Clone)]
struct Forms {
    weight: u64,
    values: Arc<[Arc<Value>]>,
}

#[derive(Clone)]
struct RawBytes;

impl quick_cache::Weighter<(u64, DialectKind, MessageDigest), Forms> for RawBytes {
    fn weight(&self, _: &(u64, DialectKind, MessageDigest), forms: &Forms) -> u64 {
        forms.weight
    }
}

/// Bytes of messages whose neutral forms are kept (of their JSON as sent).
const KEPT_FORM_BYTES: u64 = 64 << 20;

impl NeutralForms {
    /// An empty store of forms.
    pub(crate) fn new() -> Self {
        Self {
            kept: quick_cache::sync::Cache::with_weighter(16 * 1024, KEPT_FORM_BYTES, RawBytes),
        }
    }

    /// The neutral forms of `chat`'s messages, in order.
    pub(crate) fn of(&self, chat: &ChatRequest, dialect: DialectKind) -> Vec<Arc<Value>> {
        let neutral = dialect.get();
        let mut out = Vec::with_capacity(chat.messages.len());
        for message in &chat.messages {
            let key = (crate::cache_scope::current(), dialect, message.digest());
            let forms = match self.kept.get(&key) {
                Some(forms) => forms,
                None => {
                    let values: Arc<[Arc<Value>]> = neutral
                        .neutral(message.value())
                        .into_iter()
                        .map(Arc::new)
                        .collect();
                    let forms = Forms {
                        weight: message.raw.get().len() as u64,
                        values,
                    };
                    self.kept.insert(key, forms.clone());
                    forms
                }
            };
            out.extend(forms.values.iter().cloned());
        }
        out
    }
}
