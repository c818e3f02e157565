//! Upstream objects belong to the tenant that made them. Through a shared upstream key
//! (`upstream.api_key_env` with proxy keys) every team's files, batches, stored
//! responses… live in one upstream account, so handoff records which tenant created
//! each object and lets only that tenant name it: in a path (`/v1/files/file-…`) or in
//! a body (`previous_response_id`, `file_id`…). An object handoff never saw created is
//! refused too, and so is a listing of a collection, which would show every team's.

use std::sync::{Arc, OnceLock};

use aho_corasick::AhoCorasick;
use serde_json::Value;

use crate::base::json_lex::{skip_space, string_end};
use crate::base::tenant::TenantId;
use crate::error::ApiError;
use crate::store::{Store, StoreError};

/// Prefixes of the ids of upstream objects (OpenAI's and Anthropic's).
const ID_PREFIXES: &[&str] = &[
    "resp_",
    "conv_",
    "file-",
    "file_",
    "batch_",
    "msgbatch_",
    "vs_",
    "vsfb_",
    "chatcmpl-",
    "asst_",
    "thread_",
    "run_",
    "upload_",
    "part_",
    "ftjob-",
    "cntr_",
    "cfile_",
    "eval_",
    "evalrun_",
];

/// Body fields that name upstream objects (a string or a list of strings).
const ID_FIELDS: &[&str] = &[
    "previous_response_id",
    "conversation",
    "file_id",
    "file_ids",
    "input_file_id",
    "vector_store_id",
    "vector_store_ids",
    "assistant_id",
    "thread_id",
    "batch_id",
    "container",
    "container_id",
];

/// Collections a `GET` lists whole: through a shared key, every team's objects.
const LISTINGS: &[&str] = &[
    "/v1/files",
    "/v1/batches",
    "/v1/vector_stores",
    "/v1/chat/completions",
    "/v1/assistants",
    "/v1/threads",
    "/v1/fine_tuning/jobs",
    "/v1/containers",
    "/v1/evals",
    "/v1/messages/batches",
];

/// True when `text` has the shape of an upstream object id.
pub fn is_object_id(text: &str) -> bool {
    ID_PREFIXES.iter().any(|prefix| {
        text.strip_prefix(prefix).is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
    })
}

/// The object ids a path names.
pub fn path_objects(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|segment| is_object_id(segment))
}

/// The object ids a JSON body names in the fields that hold them, at any depth.
pub fn body_objects(body: &[u8]) -> Vec<String> {
    // Most bodies name none: a search for the field names spares the parse.
    if !may_name_objects(body) {
        return Vec::new();
    }
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    collect(&value, &mut found);
    found
}

/// True when `body` may hold one of [`ID_FIELDS`] as a key: its quoted name appears,
/// or a key is spelled with a `\u` escape, which can spell any name (and which the
/// upstream reads as that name).
///
/// One pass for all the names, where a search per name (after a lossy UTF-8 copy) read
/// a long body a dozen times: 1.3M instructions on Claude Code's 87 KB request.
fn may_name_objects(body: &[u8]) -> bool {
    static NAMES: OnceLock<Option<AhoCorasick>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        AhoCorasick::new(ID_FIELDS.iter().map(|field| format!("\"{field}\""))).ok()
    });
    // The patterns are constants; were they ever refused, every body is parsed.
    names.as_ref().is_none_or(|names| names.is_match(body)) || escaped_key(body)
}

/// True when a key of `body` holds a `\u` escape. Every backslash of a JSON text is in a
/// string and starts an escape or is escaped, so the backslashes are read in order,
/// and a string with a `\u` is read to its end once.
fn escaped_key(body: &[u8]) -> bool {
    let mut at = 0;
    while let Some(found) = body.get(at..).and_then(|rest| memchr::memchr(b'\\', rest)) {
        let slash = at + found;
        if body.get(slash + 1) != Some(&b'u') {
            at = slash + 2;
            continue;
        }
        // Read on to the string's end: a key when a colon follows it.
        let Some(end) = string_end(body, slash + 1) else {
            return false;
        };
        if body.get(skip_space(body, end)) == Some(&b':') {
            return true;
        }
        at = end;
    }
    false
}

fn collect(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                if ID_FIELDS.contains(&key.as_str()) {
                    let named = match inner {
                        Value::String(id) => vec![id.as_str()],
                        Value::Array(ids) => ids.iter().filter_map(Value::as_str).collect(),
                        Value::Object(object) => object
                            .get("id")
                            .and_then(Value::as_str)
                            .into_iter()
                            .collect(),
                        _ => Vec::new(),
                    };
                    found.extend(
                        named
                            .into_iter()
                            .filter(|id| is_object_id(id))
                            .map(str::to_owned),
                    );
                }
                collect(inner, found);
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect(item, found)),
        _ => {}
    }
}

/// True when `path` lists a collection of upstream objects.
pub fn is_listing(method: &http::Method, path: &str) -> bool {
    *method == http::Method::GET && LISTINGS.contains(&path)
}

/// The id of the object a response created: the top-level `id` of a JSON body.
pub fn created_object(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Created {
        id: Option<String>,
    }
    let created: Created = serde_json::from_slice(body).ok()?;
    created.id.filter(|id| is_object_id(id))
}

/// The objects each tenant created, in the store, with a cache of the answers found.
pub struct Ownership {
    store: Arc<dyn Store>,
    owned: moka::sync::Cache<(TenantId, String), ()>,
}

impl Ownership {
    /// Ownership kept in `store`, `capacity` answers cached.
    pub fn new(store: Arc<dyn Store>, capacity: u64) -> Self {
        Self {
            store,
            owned: moka::sync::Cache::new(capacity),
        }
    }

    /// Records that `tenant` created `object`.
    pub async fn record(&self, tenant: &TenantId, object: &str) -> Result<(), StoreError> {
        self.store.record_object(tenant, object).await?;
        self.owned.insert((tenant.clone(), object.to_owned()), ());
        Ok(())
    }

    /// True when `tenant` created `object`.
    pub async fn owns(&self, tenant: &TenantId, object: &str) -> Result<bool, StoreError> {
        let key = (tenant.clone(), object.to_owned());
        if self.owned.contains_key(&key) {
            return Ok(true);
        }
        let owns = self.store.owns_object(tenant, object).await?;
        if owns {
            self.owned.insert(key, ());
        }
        Ok(owns)
    }

    /// Refuses, as the upstream would refuse an unknown id, a request by `tenant` that
    /// names an object it did not create.
    pub async fn check<'a>(
        &self,
        tenant: &TenantId,
        objects: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), ApiError> {
        for object in objects {
            let owns = self
                .owns(tenant, object)
                .await
                .map_err(|err| ApiError::storage(err.to_string()))?;
            if !owns {
                return Err(ApiError::not_found(format!(
                    "No such object: {object:?} (not created through this key)"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_found_in_paths_and_bodies() {
        assert_eq!(
            path_objects("/v1/files/file-AbC123/content").collect::<Vec<_>>(),
            ["file-AbC123"]
        );
        assert_eq!(path_objects("/v1/responses/compact").count(), 0);
        let body = br#"{"model":"m","previous_response_id":"resp_1","tools":[{"type":"file_search","vector_store_ids":["vs_a","vs_b"]}],"input":[{"type":"input_file","file_id":"file-x"}],"conversation":{"id":"conv_9"}}"#;
        let mut found = body_objects(body);
        found.sort();
        assert_eq!(found, ["conv_9", "file-x", "resp_1", "vs_a", "vs_b"]);
        assert!(body_objects(br#"{"messages":[{"role":"user","content":"file-x"}]}"#).is_empty());
        assert!(!is_object_id("resp_"));
        assert!(!is_object_id("resp_../x"));
    }

    #[test]
    fn a_field_spelled_with_escapes_is_found_and_escapes_in_values_are_not_keys() {
        // The upstream reads `previous_resp\u006fnse_id` as `previous_response_id`.
        let escaped = br#"{"model":"m","previous_resp\u006fnse_id" :"resp_1","input":"hi"}"#;
        assert_eq!(body_objects(escaped), ["resp_1"]);
        let after = br#"{"a\\":"\u00e9\"file_id\"","f\u0069le_id":"file-2"}"#;
        assert_eq!(body_objects(after), ["file-2"]);
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
