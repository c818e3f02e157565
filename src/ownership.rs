//! Upstream objects belong to the tenant that made them. Through a shared upstream key
//! (`upstream.api_key_env` with proxy keys) every team's files, batches, stored
//! responses… live in one upstream account, so handoff records which tenant created
//! each object and lets only that tenant name it: in a path (`/v1/files/file-…`) or in
//! a body (`previous_response_id`, `file_id`…). An object handoff never saw created is
//! refused too, and so is a listing of a collection, which would show every team's.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use serde_json::Value;

use crate::base::chunks::Chunks;
use crate::base::tenant::TenantId;
use crate::dialect::objects::{
    id_fields, id_prefixes, listings, may_name_objects, unknown_id_key, FREE_MEMBERS,
    REFERENCE_TYPE,
};
use crate::dialect::{ChatRequest, Message};
use crate::error::ApiError;
use crate::store::{Store, StoreError};

/// True when `text` has the shape of an upstream object id.
pub(crate) fn is_object_id(text: &str) -> bool {
    id_prefixes().iter().any(|prefix| {
        text.strip_prefix(prefix).is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
    })
}

/// The object ids a path names: a segment (`/v1/files/file-…`), or a segment and the
/// next where an API names objects by their collection (Gemini's `/v1beta/files/abc`,
/// `…/batches/xyz:cancel`).
pub(crate) fn path_objects(path: &str) -> Vec<String> {
    let segments: Vec<&str> = path.split('/').collect();
    let mut found = Vec::new();
    for (at, segment) in segments.iter().enumerate() {
        if is_object_id(segment) {
            found.push((*segment).to_owned());
        }
        // `/v1/files/file-…` names `file-…`, not `files/file-…`.
        let Some(next) = segments.get(at + 1).filter(|next| !is_object_id(next)) else {
            continue;
        };
        let next = next.split_once(':').map_or(*next, |(name, _)| name);
        let named = format!("{segment}/{next}");
        if is_object_id(&named) {
            found.push(named);
        }
    }
    found
}

/// The object a field's text names: the text itself, or a collection-named id inside
/// it at a segment's start (a Gemini `fileUri`, `https://…/v1beta/files/abc`).
fn object_in(text: &str) -> Option<String> {
    if is_object_id(text) {
        return Some(text.to_owned());
    }
    id_prefixes()
        .iter()
        .filter(|prefix| prefix.ends_with('/'))
        .find_map(|prefix| {
            let at = text.rfind(&format!("/{prefix}"))? + 1;
            let rest = &text[at + prefix.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                .unwrap_or(rest.len());
            let named = &text[at..at + prefix.len() + end];
            is_object_id(named).then(|| named.to_owned())
        })
}

/// What a body names through a shared key: the object ids in the fields that hold
/// them, at any depth, and the keys named like an id that no API's table knows
/// (outside what clients write freely: messages, tool inputs, metadata).
#[derive(Debug, Default)]
pub(crate) struct Named {
    /// Object ids, each to be the tenant's.
    pub(crate) objects: Vec<String>,
    /// Id-like keys holding an id-shaped text, whose owner handoff cannot know.
    pub(crate) unknown: Vec<String>,
}

/// What a JSON body names ([`Named`]).
pub(crate) fn body_objects(body: &[u8]) -> Named {
    // Most bodies name none: a search for the field names spares the parse.
    if !may_name_objects(body) {
        return Named::default();
    }
    named_in(body)
}

/// The object ids a chat request names, as [`body_objects`] finds them in its body, but
/// with each message searched once in its life (the verdict is kept with its facts) and
/// only the text around the message list searched per request. A long conversation
/// re-sends hundreds of messages every turn: searching them all cost more than the
/// whole request does without a shared key.
///
/// Exact because no string straddles the list's edges or an element's, so a field
/// name or an escaped key lies inside one of the parts searched.
pub(crate) fn request_objects(body: &Chunks, chat: &ChatRequest) -> Named {
    let listed = chat.messages.get(chat.top_level..).unwrap_or_default();
    let may = match chat.list.clone() {
        Some(list) if !listed.is_empty() => {
            around_may_name_objects(body, 0..list.start)
                || around_may_name_objects(body, list.end..body.len())
                || listed.iter().any(Message::may_name_objects)
        }
        _ => return body_objects(body.contiguous()),
    };
    if !may {
        return Named::default();
    }
    named_in(body.contiguous())
}

/// Text around a list from this long on is searched once per distinct text: an agent
/// re-sends its tool list and prompt, tens of KB, every turn, and a digest of them
/// costs a fraction of the search.
const SEARCHED_ONCE_FROM: usize = 16 * 1024;

/// How many such texts' verdicts are kept (a digest and a bit each, so not a setting).
const KEPT_VERDICTS: usize = 4096;

/// [`may_name_objects`] on the `range` of `body`, which starts and ends between tokens.
/// A long text's verdict is kept under its seeded digest, the same keyed hash a
/// message's facts (this verdict among them) are kept under.
fn around_may_name_objects(body: &Chunks, range: Range<usize>) -> bool {
    let search = |range| body.slice(range).is_none_or(|part| may_name_objects(&part));
    if range.len() < SEARCHED_ONCE_FROM {
        return search(range);
    }
    static VERDICTS: OnceLock<quick_cache::sync::Cache<u128, bool>> = OnceLock::new();
    let verdicts = VERDICTS.get_or_init(|| quick_cache::sync::Cache::new(KEPT_VERDICTS));
    let Some(digest) = body.digest(range.clone()) else {
        return search(range);
    };
    // Per tenant: no request finds (or times) another tenant's text.
    let digest = digest ^ u128::from(crate::cache_scope::current());
    if let Some(verdict) = verdicts.get(&digest) {
        return verdict;
    }
    let verdict = search(range);
    verdicts.insert(digest, verdict);
    verdict
}

/// What `body` names, parsed whole.
fn named_in(body: &[u8]) -> Named {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return Named::default();
    };
    let mut named = Named::default();
    collect(&value, &mut named, false);
    named
}

/// True when `text` has the shape of an identifier: no space, printable ASCII, not
/// too short to be one.
fn id_shaped(text: &str) -> bool {
    (4..=256).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_graphic())
}

/// Adds what `value` names to `named`; `free` inside a member clients write freely,
/// where an id-like key is data.
fn collect(value: &Value, named: &mut Named, free: bool) {
    match value {
        Value::Object(map) => {
            // `{"type": "item_reference", "id": "msg_…"}` names a stored item of any kind
            // (`msg_`, `fc_`, `rs_`…): the tenant's when its conversation logged it.
            if map.get("type").and_then(Value::as_str) == Some(REFERENCE_TYPE) {
                if let Some(id) = map.get("id").and_then(Value::as_str) {
                    named.objects.push(id.to_owned());
                }
            }
            for (key, inner) in map {
                if !free && unknown_id_key(key) {
                    let texts = match inner {
                        Value::String(text) => vec![text.as_str()],
                        Value::Array(texts) => texts.iter().filter_map(Value::as_str).collect(),
                        _ => Vec::new(),
                    };
                    if texts.into_iter().any(id_shaped) {
                        named.unknown.push(key.clone());
                    }
                }
                if id_fields().contains(&key.as_str()) {
                    let ids = match inner {
                        Value::String(id) => vec![id.as_str()],
                        Value::Array(ids) => ids.iter().filter_map(Value::as_str).collect(),
                        Value::Object(object) => object
                            .get("id")
                            .and_then(Value::as_str)
                            .into_iter()
                            .collect(),
                        _ => Vec::new(),
                    };
                    named.objects.extend(ids.into_iter().filter_map(object_in));
                }
                collect(inner, named, free || FREE_MEMBERS.contains(&key.as_str()));
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect(item, named, free)),
        _ => {}
    }
}

/// True when `path` lists a collection of upstream objects.
pub(crate) fn is_listing(method: &http::Method, path: &str) -> bool {
    *method == http::Method::GET && listings().contains(&path)
}

/// The id of the object a response created: the top-level `id` of a JSON body, or
/// its `name` (Gemini's cached contents and batches), or its `file.name` (an upload).
pub(crate) fn created_object(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Created {
        id: Option<String>,
        name: Option<String>,
        file: Option<Named>,
    }
    #[derive(serde::Deserialize)]
    struct Named {
        name: Option<String>,
    }
    let created: Created = serde_json::from_slice(body).ok()?;
    [created.id, created.name, created.file.and_then(|f| f.name)]
        .into_iter()
        .flatten()
        .find(|id| is_object_id(id))
}

/// The objects each tenant created, in the store, with a cache of the owners found:
/// keyed by a digest of the id, so an entry's size does not depend on the id's length.
pub(crate) struct Ownership {
    store: Arc<dyn Store>,
    owners: moka::sync::Cache<u128, TenantId>,
}

/// What [`Ownership::record`] did with an object an upstream answer named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// The object is now the tenant's (or already was).
    Owned,
    /// Another tenant created it: it stays theirs.
    OthersAlready(TenantId),
}

impl Ownership {
    /// Ownership kept in `store`, `capacity` owners cached.
    pub(crate) fn new(store: Arc<dyn Store>, capacity: u64) -> Self {
        Self {
            store,
            owners: moka::sync::Cache::new(capacity),
        }
    }

    /// Records that `tenant` created `object`, unless another tenant did.
    pub(crate) async fn record(
        &self,
        tenant: &TenantId,
        object: &str,
    ) -> Result<Recorded, StoreError> {
        match self.owner(object).await? {
            Some(owner) if owner == *tenant => return Ok(Recorded::Owned),
            Some(owner) => return Ok(Recorded::OthersAlready(owner)),
            None => {}
        }
        self.store.record_object(tenant, object).await?;
        self.owners.insert(key(object), tenant.clone());
        Ok(Recorded::Owned)
    }

    /// The tenant that created `object`, if one did through handoff.
    pub(crate) async fn owner(&self, object: &str) -> Result<Option<TenantId>, StoreError> {
        if let Some(owner) = self.owners.get(&key(object)) {
            return Ok(Some(owner));
        }
        let owner = self.store.object_owner(object).await?;
        if let Some(owner) = &owner {
            self.owners.insert(key(object), owner.clone());
        }
        Ok(owner)
    }

    /// Refuses, as the upstream would refuse an unknown id, a request by `tenant` that
    /// names an object it did not create. Each distinct id is looked up once.
    pub(crate) async fn check<'a>(
        &self,
        tenant: &TenantId,
        objects: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), ApiError> {
        let distinct: std::collections::BTreeSet<&str> = objects.into_iter().collect();
        for object in distinct {
            let owner = self
                .owner(object)
                .await
                .map_err(|err| ApiError::storage(err.to_string()))?;
            if owner.as_ref() != Some(tenant) {
                return Err(ApiError::not_found(format!(
                    "No such object: {object:?} (not created through this key)"
                )));
            }
        }
        Ok(())
    }
}

fn key(object: &str) -> u128 {
    twox_hash::XxHash3_128::oneshot(object.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_like_key_no_table_lists_is_named_unless_a_client_writes_it_freely() {
        let unknown = |body: &str| {
            assert!(may_name_objects(body.as_bytes()), "searched: {body}");
            body_objects(body.as_bytes()).unknown
        };
        assert_eq!(
            unknown(r#"{"eval_id":"eval_abc123","thread":{"metadata":{"trace_id":"t-123456"}}}"#),
            ["eval_id"]
        );
        assert_eq!(unknown(r#"{"evalId":"eval_abc123"}"#), ["evalId"]);
        assert_eq!(
            unknown(r#"{"run_ids":["run_1234","run_5678"]}"#),
            ["run_ids"]
        );
        // Messages, tool inputs and metadata are what clients and models write.
        let free = r#"{"model":"m","metadata":{"trace_id":"t-123456"},"messages":[
            {"role":"tool","tool_call_id":"call_123456","content":"x"},
            {"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"f",
             "input":{"order_id":"ord_123456"}}]}]}"#;
        assert!(body_objects(free.as_bytes()).unknown.is_empty());
        // Listed fields are objects, not unknown; a chosen id alone is not searched.
        let listed = body_objects(br#"{"vector_store_ids":["vs_a"],"file_id":"file-x"}"#);
        assert!(listed.unknown.is_empty());
        assert_eq!(listed.objects.len(), 2);
        assert!(!may_name_objects(br#"{"tool_call_id":"call_1","uid":"x"}"#));
    }

    #[test]
    fn ids_are_found_in_paths_and_bodies() {
        assert_eq!(
            path_objects("/v1/files/file-AbC123/content"),
            ["file-AbC123"]
        );
        assert!(path_objects("/v1/responses/compact").is_empty());
        // Gemini names objects by their collection.
        assert_eq!(path_objects("/v1beta/files/abc123"), ["files/abc123"]);
        assert_eq!(path_objects("/v1beta/batches/b-9:cancel"), ["batches/b-9"]);
        assert_eq!(
            path_objects("/v1beta/cachedContents/xyz"),
            ["cachedContents/xyz"]
        );
        assert!(path_objects("/v1beta/files").is_empty());
        let body = br#"{"model":"m","previous_response_id":"resp_1","tools":[{"type":"file_search","vector_store_ids":["vs_a","vs_b"]}],"input":[{"type":"input_file","file_id":"file-x"}],"conversation":{"id":"conv_9"}}"#;
        let mut found = body_objects(body).objects;
        found.sort();
        assert_eq!(found, ["conv_9", "file-x", "resp_1", "vs_a", "vs_b"]);
        assert!(
            body_objects(br#"{"messages":[{"role":"user","content":"file-x"}]}"#)
                .objects
                .is_empty()
        );
        assert!(!is_object_id("resp_"));
        let referenced = br#"{"model":"m","input":[{"type":"item_reference","id":"msg_A"},{"type":"reasoning","id":"rs_1","summary":[]}]}"#;
        assert_eq!(body_objects(referenced).objects, ["msg_A"]);
        let spelt = br#"{"input":[{"type":"item_refer\u0065nce","id":"fc_B"}]}"#;
        assert_eq!(body_objects(spelt).objects, ["fc_B"]);
        assert!(!is_object_id("resp_../x"));
        // Gemini: a cached content by name, a file by the URL that ends with its name.
        let gemini = br#"{"cachedContent":"cachedContents/c1","contents":[{"role":"user","parts":[
            {"fileData":{"mimeType":"text/plain","fileUri":"https://generativelanguage.googleapis.com/v1beta/files/f-2"}},
            {"fileData":{"fileUri":"https://www.youtube.com/watch?v=x"}}]}]}"#;
        let mut found = body_objects(gemini).objects;
        found.sort();
        assert_eq!(found, ["cachedContents/c1", "files/f-2"]);
        assert_eq!(
            created_object(br#"{"file":{"name":"files/up-1","mimeType":"text/plain"}}"#).as_deref(),
            Some("files/up-1")
        );
        assert_eq!(
            created_object(br#"{"name":"cachedContents/c1","model":"models/g"}"#).as_deref(),
            Some("cachedContents/c1")
        );
        assert_eq!(created_object(br#"{"name":"not-an-object"}"#), None);
    }

    /// What `request_objects` finds in `body` read as `dialect`, twice (the second time
    /// every message comes from the facts cache), and what a search of the whole finds.
    fn in_request(dialect: &dyn crate::dialect::Dialect, body: &str) -> [Vec<String>; 3] {
        let body = Chunks::from(body.as_bytes().to_vec());
        let mut first = request_objects(&body, &dialect.parse_body(&body).unwrap()).objects;
        let mut again = request_objects(&body, &dialect.parse_body(&body).unwrap()).objects;
        let mut whole = body_objects(body.contiguous()).objects;
        for found in [&mut first, &mut again, &mut whole] {
            found.sort();
        }
        [first, again, whole]
    }

    #[test]
    fn a_request_names_what_its_whole_body_names_in_messages_and_around_them() {
        use crate::dialect::responses::OpenAiResponses as Responses;
        use crate::dialect::{anthropic::AnthropicMessages, openai::OpenAiChat};
        let pad = "p".repeat(40_000);
        let cases: [(&dyn crate::dialect::Dialect, String, &[&str]); 9] = [
            // In a message, past a long list the memo keeps.
            (
                &Responses,
                format!(
                    r#"{{"model":"m","input":[{{"role":"user","content":"{pad}"}},{{"role":"user","content":[{{"type":"input_file","file_id":"file-in"}}]}}]}}"#
                ),
                &["file-in"],
            ),
            // Before the list, and after it.
            (
                &Responses,
                format!(
                    r#"{{"model":"m","previous_response_id":"resp_before","input":[{{"role":"user","content":"{pad}"}}]}}"#
                ),
                &["resp_before"],
            ),
            (
                &Responses,
                format!(
                    r#"{{"model":"m","input":[{{"role":"user","content":"{pad}"}}],"tools":[{{"type":"file_search","vector_store_ids":["vs_after"]}}]}}"#
                ),
                &["vs_after"],
            ),
            // A key spelled with an escape, inside a message.
            (
                &OpenAiChat,
                format!(
                    r#"{{"model":"m","messages":[{{"role":"user","content":"{pad}"}},{{"role":"user","content":"x","f\u0069le_id":"file-esc"}}]}}"#
                ),
                &["file-esc"],
            ),
            // Anthropic's top-level system is outside the list: searched as text there.
            (
                &AnthropicMessages,
                format!(
                    r#"{{"model":"m","system":[{{"type":"text","text":"s","container":"cntr_sys"}}],"messages":[{{"role":"user","content":"{pad}"}}]}}"#
                ),
                &["cntr_sys"],
            ),
            // Field names only as values, and ids only in text: nothing.
            (
                &OpenAiChat,
                format!(
                    r#"{{"model":"m","messages":[{{"role":"user","content":"\"file_id\": file-x {pad}"}}]}}"#
                ),
                &[],
            ),
            // Long text around the list (an agent's tools) is searched once per distinct
            // text: the same length without the field, then with it.
            (
                &OpenAiChat,
                format!(
                    r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"tools":[{{"type":"function","description":"{pad}","x":"vector_store_idz"}}]}}"#
                ),
                &[],
            ),
            (
                &OpenAiChat,
                format!(
                    r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"tools":[{{"type":"function","description":"{pad}","vector_store_id":"vs_2"}}]}}"#
                ),
                &["vs_2"],
            ),
            // A string input has no list: the whole body is searched.
            (
                &Responses,
                r#"{"model":"m","input":"hi","conversation":"conv_str"}"#.to_owned(),
                &["conv_str"],
            ),
        ];
        for (dialect, body, named) in cases {
            let [first, again, whole] = in_request(dialect, &body);
            assert_eq!(first, named, "{}", &body[..80.min(body.len())]);
            assert_eq!(again, named, "read again: {}", &body[..80.min(body.len())]);
            assert_eq!(whole, named);
        }
    }

    #[test]
    fn a_field_spelled_with_escapes_is_found_and_escapes_in_values_are_not_keys() {
        // The upstream reads `previous_resp\u006fnse_id` as `previous_response_id`.
        let escaped = br#"{"model":"m","previous_resp\u006fnse_id" :"resp_1","input":"hi"}"#;
        assert_eq!(body_objects(escaped).objects, ["resp_1"]);
        let after = br#"{"a\\":"\u00e9\"file_id\"","f\u0069le_id":"file-2"}"#;
        assert_eq!(body_objects(after).objects, ["file-2"]);
        for plain in [
            &br#"{"messages":[{"role":"user","content":"caf\u00e9 \u00e9 \\u0041 file-x"}]}"#[..],
            br#"{"content":"\"file_id\": file-x"}"#,
            br#"{"content":"\\"}"#,
        ] {
            assert!(
                !may_name_objects(plain),
                "{}",
                String::from_utf8_lossy(plain)
            );
        }
        assert!(may_name_objects(br#"{"x":1, "thread_id":"thread_a"}"#));
    }
}
