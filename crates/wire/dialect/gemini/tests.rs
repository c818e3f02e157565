use super::*;
use crate::dialect::{stream_opening, Opening};
use crate::dialect::{Api, Failures, Pair, Parsing, Replies};

fn parse(target: &str, body: Value) -> Result<ChatRequest, DialectError> {
    Gemini.parse_at(target, &Chunks::from(body.to_string().into_bytes()))
}

const STREAM_SSE: &str = "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse";

fn call(name: &str, id: Option<&str>) -> Value {
    let mut call = json!({"name": name, "args": {"path": "a"}});
    if let Some(id) = id {
        call["id"] = json!(id);
    }
    json!({"role": "model", "parts": [{"functionCall": call, "thoughtSignature": "c2ln"}]})
}

fn answer(name: &str, id: Option<&str>) -> Value {
    let mut answer = json!({"name": name, "response": {"output": "r"}});
    if let Some(id) = id {
        answer["id"] = json!(id);
    }
    json!({"role": "user", "parts": [{"functionResponse": answer}]})
}

#[test]
fn the_path_names_the_model_and_the_stream() {
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "systemInstruction": {"parts": [{"text": "be brief"}]},
        "generationConfig": {"maxOutputTokens": 99, "thinkingConfig": {"thinkingBudget": -1}}});
    let sse = parse(STREAM_SSE, body.clone()).unwrap();
    assert_eq!(sse.model, "gemini-2.5-pro");
    assert!(sse.stream);
    assert!(sse.thinking);
    assert_eq!(sse.max_output, Some(99));
    assert_eq!(sse.top_level, 1);
    assert_eq!(sse.messages[0].role, Role::System);
    assert!(sse.messages[0].raw.get().contains("be brief"));
    assert_eq!(sse.messages[1].role, Role::User);
    // Without alt=sse the stream is a JSON array, read whole.
    let array = parse("/v1beta/models/m:streamGenerateContent", body.clone()).unwrap();
    assert!(!array.stream);
    let tuned = parse("/v1beta/tunedModels/mine-1:generateContent?x=1", body).unwrap();
    assert_eq!(tuned.model, "mine-1");
    assert!(Gemini.tracks("/v1beta/models/gemini-2.5-flash:generateContent"));
    assert!(Gemini.tracks("/v1/models/gemini-2.5-flash:streamGenerateContent"));
    assert!(!Gemini.tracks("/v1beta/models/gemini-2.5-flash:countTokens"));
    assert!(!Gemini.tracks("/v1beta/models"));
    assert!(!Gemini.tracks("/v1beta/models/:generateContent"));
    // Vertex AI's paths have the same shape; OpenAI's fine-tuned ids are not Gemini's.
    let vertex = "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-pro:streamGenerateContent";
    assert!(Gemini.tracks(vertex) && Gemini.answers_path(vertex));
    assert!(!Gemini.answers_path("/v1/models/ft:gpt-4o:org:abc"));
    assert_eq!(
        Gemini
            .path_model("/v1beta/models/gemini-2.5-pro:countTokens")
            .as_deref(),
        Some("gemini-2.5-pro")
    );
}

#[test]
fn roles_map_and_what_is_not_a_content_is_refused() {
    let request = parse(
        STREAM_SSE,
        json!({"contents": [{"parts": [{"text": "no role is the user"}]}, call("f", None), answer("f", None),
            {"role": "critic", "parts": [{"text": "a role from the future"}]}]}),
    )
    .unwrap();
    let roles: Vec<Role> = request.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [Role::User, Role::Assistant, Role::User, Role::Other]
    );
    assert!(request.messages[2].is_tool_answer());
    assert_eq!(
        request.messages[1].tool_call_ids().collect::<Vec<_>>(),
        ["f"]
    );
    assert!(matches!(
        parse(STREAM_SSE, json!({"contents": ["text"]})),
        Err(DialectError::NotAnObject { index: 0 })
    ));
    assert!(matches!(
        parse(STREAM_SSE, json!({"messages": []})),
        Err(DialectError::Json { .. })
    ));
}

#[test]
fn calls_pair_by_id_when_both_have_one_else_by_name_and_order() {
    let pairs = |contents: Value| {
        let request = parse(STREAM_SSE, json!({ "contents": contents })).unwrap();
        Gemini.check_pairs(&request.messages)
    };
    // The API's calls carry no id; Gemini CLI answers with one of its own.
    pairs(json!([{"role": "user", "parts": [{"text": "q"}]}, call("read", None), answer("read", Some("cli-1"))])).unwrap();
    pairs(json!([call("read", Some("a")), answer("read", Some("a"))])).unwrap();
    let two = json!({"role": "model", "parts": [
        {"functionCall": {"name": "read", "args": {}}}, {"functionCall": {"name": "ls", "args": {}}}]});
    let both = json!({"role": "user", "parts": [
        {"functionResponse": {"name": "ls", "response": {}}}, {"functionResponse": {"name": "read", "response": {}}}]});
    pairs(json!([two, both])).unwrap();
    assert!(matches!(
        pairs(json!([two, answer("read", None)])),
        Err(DialectError::UnansweredToolCalls { .. })
    ));
    assert!(matches!(
        pairs(json!([answer("read", None)])),
        Err(DialectError::OrphanToolResult { .. })
    ));
    assert!(matches!(
        pairs(json!([call("read", None), {"role": "user", "parts": [{"text": "late"}]}])),
        Err(DialectError::UnansweredToolCalls { .. })
    ));
}

#[test]
fn the_pair_joins_before_a_model_content() {
    let handoff = Gemini.handoff("## State", false);
    assert!(Gemini.handoff_ok(&handoff));
    let request = parse(
        STREAM_SSE,
        json!({"contents": [call("read", None), {"role": "user", "parts": [{"text": "go"}]}]}),
    )
    .unwrap();
    let joined = Gemini
        .joined_pair(&Gemini.continuation(), &handoff, &request.messages[0])
        .unwrap();
    assert_eq!(joined["role"], "user");
    assert_eq!(joined["parts"][1]["text"], "## State");
    assert!(Gemini
        .joined_pair(&Gemini.continuation(), &handoff, &request.messages[1])
        .is_none());
}

#[test]
fn the_overflow_error_is_recognised_before_and_in_a_stream() {
    let overflow = json!({"error": {"code": 400, "message": "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).", "status": "INVALID_ARGUMENT"}});
    assert!(Gemini.is_overflow(&overflow));
    let other = json!({"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.", "status": "INVALID_ARGUMENT"}});
    assert!(!Gemini.is_overflow(&other));
    let event = format!("data: {overflow}\r\n\r\n");
    assert_eq!(stream_opening(&Gemini, event.as_bytes()), Opening::Overflow);
    let output =
        "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"a\"}]}}]}\r\n\r\n";
    assert_eq!(stream_opening(&Gemini, output.as_bytes()), Opening::Relay);
}

#[test]
fn errors_take_google_s_shape() {
    let err = ApiError::invalid_request("invalid_json", "not json");
    let body = Gemini.error_json(&err);
    assert_eq!(body["error"]["code"], 400);
    assert_eq!(body["error"]["status"], "INVALID_ARGUMENT");
    let err = ApiError::invalid_api_key("no key");
    assert_eq!(
        Gemini.error_json(&err)["error"]["status"],
        "UNAUTHENTICATED"
    );
}

#[test]
fn handoff_s_own_calls_and_a_reroute_name_the_model_in_the_path() {
    assert_eq!(
        Gemini.call_path("gemini-2.5-flash", Some(STREAM_SSE)),
        "/v1beta/models/gemini-2.5-flash:generateContent"
    );
    assert_eq!(
        Gemini.call_path("g", None),
        "/v1beta/models/g:generateContent"
    );
    assert_eq!(
        Gemini.retarget(STREAM_SSE, "gemini-2.5-flash").as_deref(),
        Some("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse")
    );
    assert_eq!(Gemini.retarget("/v1beta/models", "g"), None);
}

#[test]
fn usage_and_reply_deltas() {
    let usage =
        json!({"promptTokenCount": 120, "cachedContentTokenCount": 100, "candidatesTokenCount": 5});
    assert_eq!(Gemini.input_tokens(&usage), Some(120));
    let text = json!({"candidates": [{"content": {"parts": [{"text": "a"}]}, "index": 0}]});
    let deltas = Gemini.reply_deltas(&text);
    assert_eq!(deltas.len(), 1);
    assert_eq!(deltas[0].pointer, "/candidates/0/content/parts/0/text");
    // An event with a call goes whole: its text ends there, its args arrive whole.
    let mixed = json!({"candidates": [{"content": {"parts": [{"text": "a"}, {"functionCall": {"name": "f"}}]}, "index": 0}]});
    assert!(Gemini.reply_deltas(&mixed).is_empty());
}

#[test]
fn a_streamed_reply_echoed_as_gemini_cli_sends_it_is_the_same_message() {
    use crate::dialect::echo::echo_digest;
    let logged = json!({"role": "model", "parts": [
        {"text": "weighing", "thought": true},
        {"text": "Reading notes."},
        {"functionCall": {"name": "read_file", "args": {"path": "a"}}, "thoughtSignature": "c2ln"}]});
    let echoed = json!({"role": "model", "parts": [
        {"text": "Reading "}, {"text": "notes."},
        {"functionCall": {"id": "read_file__synth_1", "name": "read_file", "args": {"path": "a"}}, "thoughtSignature": "c2ln"}]});
    assert!(echo_digest(&logged).is_some());
    assert_eq!(echo_digest(&logged), echo_digest(&echoed));
    // A user content has one form.
    assert_eq!(
        echo_digest(&json!({"role": "user", "parts": [{"text": "hi"}]})),
        None
    );
    let other = json!({"role": "model", "parts": [
        {"text": "Reading notes."},
        {"functionCall": {"name": "read_file", "args": {"path": "b"}}, "thoughtSignature": "c2ln"}]});
    assert_ne!(echo_digest(&logged), echo_digest(&other));
}

/// Google's parser reads the proto's snake_case names as the camelCase ones: the
/// system instruction, the generation config and the function parts are read under
/// both, and one field given under both names is refused rather than guessed.
#[test]
fn snake_case_names_are_the_same_fields() {
    let body = json!({"contents": [
            {"role": "user", "parts": [{"text": "hi"}]},
            {"role": "model", "parts": [{"function_call": {"name": "ls", "args": {}}, "thought_signature": "c2ln"}]},
            {"role": "user", "parts": [{"function_response": {"name": "ls", "response": {"output": "a.rs"}}}]}],
        "system_instruction": {"parts": [{"text": "be brief"}]},
        "generation_config": {"max_output_tokens": 7, "thinking_config": {"thinking_budget": 0}}});
    let request = parse(STREAM_SSE, body).unwrap();
    assert_eq!(request.top_level, 1);
    assert_eq!(request.messages[0].role, Role::System);
    assert!(request.messages[0].raw.get().contains("be brief"));
    assert_eq!(request.max_output, Some(7));
    assert!(!request.thinking);
    assert!(Gemini.check_pairs(&request.messages).is_ok());
    assert!(Gemini.calls_tools(request.messages[2].value()));
    let neutral = content::neutral(request.messages[3].value());
    assert_eq!(neutral[0]["role"], "tool");
    assert_eq!(neutral[0]["content"], "a.rs");
    // An answer with no call before it is an orphan under either name.
    let orphan = json!({"contents": [{"role": "user", "parts": [
        {"function_response": {"name": "ls", "response": {}}}]}]});
    assert!(Gemini
        .check_pairs(&parse(STREAM_SSE, orphan).unwrap().messages)
        .is_err());
    let both = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "systemInstruction": {"parts": [{"text": "one"}]},
        "system_instruction": {"parts": [{"text": "two"}]}});
    let err = parse(STREAM_SSE, both).unwrap_err();
    assert!(err.to_string().contains("given twice"), "{err}");
}

/// A part the neutral form has no shape for carries its text to strategies and hooks.
#[test]
fn code_execution_parts_keep_their_text_in_the_neutral_form() {
    let content = json!({"role": "model", "parts": [
        {"executableCode": {"language": "PYTHON", "code": "print(secret)"}},
        {"code_execution_result": {"outcome": "OUTCOME_OK", "output": "sk-live-123"}},
        {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}]});
    let text = content::neutral(&content)[0]["content"].to_string();
    assert!(
        text.contains("print(secret)") && text.contains("sk-live-123"),
        "{text}"
    );
    assert!(
        !text.contains("iVBORw0KGgo"),
        "media bytes are not text: {text}"
    );
}

#[test]
fn any_method_of_a_model_names_it() {
    for (path, model) in [
        ("/v1beta/models/aqa:generateAnswer", Some("aqa")),
        ("/v1beta/tunedModels/mine-1:generateContent", Some("mine-1")),
        (
            "/v1beta/models/gemini-2.5-pro:someFutureMethod",
            Some("gemini-2.5-pro"),
        ),
        ("/v1beta/models/gemini-2.5-pro", None),
        ("/v1beta/models/a/b:generateContent", None),
    ] {
        assert_eq!(Gemini.path_model(path).as_deref(), model, "{path}");
    }
    assert!(Gemini.answers_path("/v1/models/aqa:generateAnswer"));
}
