//! The model a pass-through body names, read strictly: what the key's allow-list
//! checks must be what the upstream reads. A JSON body must be one UTF-8 JSON document
//! with at most one `model` key (a duplicate is read first-wins by some parsers and
//! last-wins by others); a form is parsed by a real multipart parser and must hold at
//! most one `model` field, under one `boundary`. A body that cannot be read so is
//! refused, and so is a form sent to a path that takes JSON: nothing is forwarded
//! unread past the check.

use bytes::Bytes;
use http::{header, HeaderMap};
use serde_json::Value;

use crate::error::ApiError;

/// Paths whose body is a multipart form: uploads (which name no model and stream) and
/// the audio and image forms (which may, and are read whole). Every other body is JSON.
const FORM_PATHS: &[&str] = &[
    "/v1/files",
    "/v1/uploads/",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
    "/v1/images/edits",
    "/v1/images/variations",
    "/v1/containers/",
    "/v1/videos",
];

/// Paths that take a file's bytes as they are, in any content type.
const UPLOAD_PATHS: &[&str] = &["/upload/"];

/// Form paths whose `model` field the allow-list checks.
const MODEL_FORMS: &[&str] = &["/v1/audio/", "/v1/images/", "/v1/videos"];

/// What a batch request runs: the models its inline requests name, or a file of
/// requests whose models handoff does not read.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Batch {
    /// Every model its inline requests name (Anthropic's `requests[].params.model`,
    /// Gemini's `batch.input_config.requests.requests[].request.model` and the batch's
    /// own `model`), Google's `models/` dropped.
    pub(crate) models: Vec<String>,
    /// It runs the lines of an uploaded file (OpenAI's `input_file_id`, Gemini's
    /// `batch.input_config.file_name`), each naming its own model.
    pub(crate) from_file: bool,
}

/// The batch a `POST path` creates, when it creates one: what a key's allow-list must
/// also check, as every request of the batch runs a model. Only the fields the APIs
/// document are read: a `model` or `file_name` inside a request's messages or tool
/// input is the conversation's text, not the batch's.
pub(crate) fn batch(path: &str, body: &[u8]) -> Option<Batch> {
    let is_batch = path.ends_with("/v1/batches")
        || path.ends_with("/v1/messages/batches")
        || path.ends_with(":batchGenerateContent")
        || path.ends_with(":asyncBatchEmbedContent");
    if !is_batch {
        return None;
    }
    let body: Value = serde_json::from_slice(body).unwrap_or_default();
    // Gemini wraps the batch in `batch`; its protobuf JSON takes either spelling.
    let gemini = body.get("batch").unwrap_or(&body);
    let input = either(gemini, "input_config", "inputConfig");
    let anthropic = items(body.get("requests")).filter_map(|r| r.get("params")?.get("model"));
    let inline = items(input.and_then(|i| i.get("requests")?.get("requests")))
        .filter_map(|r| r.get("request")?.get("model"));
    let models = anthropic
        .chain(inline)
        .chain(gemini.get("model").filter(|_| body.get("batch").is_some()))
        .map(|model| match model {
            Value::String(model) => model.strip_prefix("models/").unwrap_or(model).to_owned(),
            // Not a name the allow-list can pass: checked as its JSON text, so refused.
            other => other.to_string(),
        })
        .collect();
    let from_file = body.get("input_file_id").is_some()
        || input.is_some_and(|i| either(i, "file_name", "fileName").is_some());
    Some(Batch { models, from_file })
}

/// The value of a field under either of its spellings.
fn either<'v>(value: &'v Value, snake: &str, camel: &str) -> Option<&'v Value> {
    value.get(snake).or_else(|| value.get(camel))
}

/// The items of an array, if `value` is one.
fn items(value: Option<&Value>) -> impl Iterator<Item = &Value> {
    value.and_then(Value::as_array).into_iter().flatten()
}

/// How a pass-through body is admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reading {
    /// Read whole and its model checked.
    Whole,
    /// An upload that names no model: streamed, charged as it goes.
    Streamed,
}

/// How the body of a `path` request with `headers` is admitted, or why it is refused
/// unread (a form sent where JSON is due).
pub(crate) fn reading(path: &str, headers: &HeaderMap) -> Result<Reading, ApiError> {
    // Google's media uploads (`/upload/v1beta/files`): raw bytes or `multipart/related`,
    // naming no model.
    if UPLOAD_PATHS.iter().any(|upload| path.starts_with(upload)) {
        return Ok(Reading::Streamed);
    }
    let Some(content_type) = content_type(headers) else {
        return Ok(Reading::Whole);
    };
    if !content_type.to_ascii_lowercase().starts_with("multipart/") {
        return Ok(Reading::Whole);
    }
    if !FORM_PATHS.iter().any(|form| path.starts_with(form)) {
        return Err(ApiError::unsupported_media_type(format!(
            "{path} takes a JSON body, not {content_type:?}"
        )));
    }
    Ok(if MODEL_FORMS.iter().any(|form| path.starts_with(form)) {
        Reading::Whole
    } else {
        Reading::Streamed
    })
}

/// The model a body read whole names, or `None` when it names none.
pub(crate) async fn named_model(
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Option<String>, ApiError> {
    if body.is_empty() {
        return Ok(None);
    }
    match content_type(headers).filter(|ct| ct.to_ascii_lowercase().starts_with("multipart/")) {
        Some(content_type) => form_model(content_type, body.clone()).await,
        None => json_model(body),
    }
}

fn content_type(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("(not text)"))
}

/// The top-level `model` of a JSON document. serde's derived reader refuses a key
/// twice, however it is spelt (escapes are decoded first), and `from_slice` refuses
/// what is not UTF-8.
fn json_model(body: &[u8]) -> Result<Option<String>, ApiError> {
    #[derive(serde::Deserialize)]
    struct Named {
        model: Option<Value>,
    }
    let named: Named = serde_json::from_slice(body).map_err(|err| {
        ApiError::invalid_request(
            "invalid_json",
            format!("the body is not one UTF-8 JSON object with at most one \"model\": {err}"),
        )
    })?;
    Ok(named.model.map(|model| match model {
        Value::String(model) => model,
        // Not a name the allow-list can pass: checked as its JSON text, so refused.
        other => other.to_string(),
    }))
}

/// The `model` field of a multipart form.
async fn form_model(content_type: &str, body: Bytes) -> Result<Option<String>, ApiError> {
    let refuse = |why: String| ApiError::invalid_request("invalid_multipart", why);
    let boundaries = content_type
        .split(';')
        .filter(|param| {
            param
                .trim()
                .get(..9)
                .is_some_and(|name| name.eq_ignore_ascii_case("boundary="))
        })
        .count();
    if boundaries != 1 {
        return Err(refuse(format!(
            "a multipart body needs exactly one boundary parameter, {content_type:?} has {boundaries}"
        )));
    }
    let boundary = multer::parse_boundary(content_type).map_err(|err| refuse(err.to_string()))?;
    let stream = futures_util::stream::once(async move { Ok::<_, std::convert::Infallible>(body) });
    let mut form = multer::Multipart::new(stream, boundary);
    let mut model = None;
    loop {
        let field = form
            .next_field()
            .await
            .map_err(|err| refuse(format!("the form cannot be read: {err}")))?;
        let Some(field) = field else {
            return Ok(model);
        };
        let Some(name) = field.name() else {
            return Err(refuse("a form field has no name".into()));
        };
        if !name.eq_ignore_ascii_case("model") {
            continue;
        }
        if model.is_some() {
            return Err(refuse("the form has more than one model field".into()));
        }
        let text = field
            .text()
            .await
            .map_err(|err| refuse(format!("the model field cannot be read: {err}")))?;
        model = Some(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(content_type: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, content_type.parse().unwrap());
        headers
    }

    async fn model(content_type: &str, body: &[u8]) -> Result<Option<String>, ApiError> {
        named_model(&headers(content_type), &Bytes::copy_from_slice(body)).await
    }

    #[tokio::test]
    async fn one_model_is_read_from_json_and_from_a_form() {
        let json = "application/json";
        assert_eq!(
            model(json, br#"{"input":"x","model":"text-embedding-3-large"}"#)
                .await
                .unwrap()
                .as_deref(),
            Some("text-embedding-3-large")
        );
        assert_eq!(
            model(json, br#"{"model":["a"]}"#).await.unwrap().as_deref(),
            Some("[\"a\"]")
        );
        assert_eq!(model(json, br#"{"input":"x"}"#).await.unwrap(), None);
        let form = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF\r\n--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--XyZ--\r\n";
        assert_eq!(
            model("multipart/form-data; boundary=XyZ", form)
                .await
                .unwrap()
                .as_deref(),
            Some("whisper-1")
        );
    }

    #[tokio::test]
    async fn every_second_reading_of_a_model_is_refused() {
        let json = "application/json";
        for body in [
            &br#"{"model":"m1","input":"x","model":"gpt-4o"}"#[..],
            br#"{"model":"m1","mod\u0065l":"gpt-4o"}"#,
            b"\xff\xfe{\x00\"\x00m\x00",
            b"not json",
            br#"{"model":"m1"} {"model":"gpt-4o"}"#,
        ] {
            assert!(
                model(json, body).await.is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let two = b"--B\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm1\r\n--B\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ngpt-4o\r\n--B--\r\n";
        assert!(model("multipart/form-data; boundary=B", two).await.is_err());
        let one = b"--B\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm1\r\n--B--\r\n";
        assert!(model("multipart/form-data; boundary=B; boundary=C", one)
            .await
            .is_err());
        let nameless = b"--B\r\nContent-Disposition: form-data\r\n\r\nm1\r\n--B--\r\n";
        assert!(model("multipart/form-data; boundary=B", nameless)
            .await
            .is_err());
    }

    #[test]
    fn a_batch_s_models_and_files_are_read_where_the_apis_put_them() {
        let anthropic = br#"{"requests": [
            {"custom_id": "a", "params": {"model": "m1", "messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": "x"}]}],
                "tools": [{"name": "t", "input_schema": {"model": "not-a-model", "file_name": "x"}}]}},
            {"custom_id": "b", "params": {"model": "m2"}}]}"#;
        assert_eq!(
            batch("/v1/messages/batches", anthropic),
            Some(Batch {
                models: vec!["m1".into(), "m2".into()],
                from_file: false
            })
        );
        let gemini = br#"{"batch": {"model": "models/g0", "inputConfig": {"requests": {"requests": [
            {"request": {"model": "models/g1", "contents": [{"parts": [{"text": "model file_name"}]}]}}]}}}}"#;
        let read = batch("/v1beta/models/g0:batchGenerateContent", gemini).unwrap();
        assert_eq!(read.models, ["g1", "g0"]);
        assert!(!read.from_file);
        for (path, body) in [
            (
                "/v1/batches",
                &br#"{"input_file_id": "file-1", "endpoint": "/v1/chat/completions"}"#[..],
            ),
            (
                "/v1beta/models/g:batchGenerateContent",
                br#"{"batch": {"input_config": {"file_name": "files/f"}}}"#,
            ),
            (
                "/v1beta/models/g:asyncBatchEmbedContent",
                br#"{"batch": {"inputConfig": {"fileName": "files/f"}}}"#,
            ),
        ] {
            assert!(batch(path, body).unwrap().from_file, "{path}");
        }
        assert_eq!(batch("/v1/chat/completions", anthropic), None);
    }

    #[test]
    fn a_form_is_taken_only_where_the_path_takes_one() {
        let form = headers("multipart/form-data; boundary=B");
        assert!(reading("/v1/embeddings", &form).is_err());
        assert!(reading("/v1/messages/count_tokens", &form).is_err());
        assert_eq!(reading("/v1/files", &form).unwrap(), Reading::Streamed);
        assert_eq!(
            reading("/v1/uploads/upload_1/parts", &form).unwrap(),
            Reading::Streamed
        );
        assert_eq!(
            reading("/v1/audio/transcriptions", &form).unwrap(),
            Reading::Whole
        );
        assert_eq!(
            reading("/v1/embeddings", &headers("text/plain")).unwrap(),
            Reading::Whole
        );
    }
}
