//! Recognising an upstream's "the prompt is too long" answer, in the dialects that
//! matter: OpenAI's `context_length_exceeded`, llama.cpp's `exceed_context_size_error`,
//! and the common "maximum context length" wording of vLLM and others.

use serde_json::Value;

/// True when an error body says the input exceeded the model's window.
pub(crate) fn is_context_length_error(body: &Value) -> bool {
    let error = body.get("error").unwrap_or(body);
    let code = error.get("code").and_then(Value::as_str).unwrap_or("");
    let kind = error.get("type").and_then(Value::as_str).unwrap_or("");
    if ["context_length_exceeded", "exceed_context_size_error"].contains(&code)
        || ["context_length_exceeded", "exceed_context_size_error"].contains(&kind)
    {
        return true;
    }
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .or_else(|| body.as_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    [
        "maximum context length",
        "context length exceeded",
        "context_length_exceeded",
        "exceeds the available context size",
        "prompt is too long",
        "too many tokens",
    ]
    .iter()
    .any(|needle| message.contains(needle))
}

/// The prompt size an overflow error names, where the server says it: llama.cpp's
/// `n_prompt_tokens`. What a summary model's calibration learns from a refusal.
pub fn prompt_tokens_named(body: &Value) -> Option<u64> {
    body.pointer("/error/n_prompt_tokens")
        .and_then(Value::as_u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn recognises_the_dialects() {
        let openai = json!({"error": {"message": "This model's maximum context length is 16385 tokens.", "type": "invalid_request_error", "code": "context_length_exceeded"}});
        let llama = json!({"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 9000, "n_ctx": 8192}});
        let vllm = json!({"object": "error", "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.", "type": "BadRequestError", "code": 400});
        let other = json!({"error": {"message": "Invalid API key", "code": "invalid_api_key"}});
        assert!(is_context_length_error(&openai));
        assert!(is_context_length_error(&llama));
        assert!(is_context_length_error(&vllm));
        assert!(!is_context_length_error(&other));
    }
}
