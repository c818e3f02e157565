//! Gemini's field names as Google's parser reads them. The API's JSON is protobuf's
//! mapping, which accepts each field under its lowerCamelCase name and under its
//! original snake_case one (`functionCall` and `function_call`), so every field handoff
//! reads for pairing, hooks, the record or ownership is read under both.

use serde_json::Value;

/// One field's two spellings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Name {
    /// The lowerCamelCase JSON name, which Google's answers use.
    pub(crate) camel: &'static str,
    /// The proto field's own name.
    pub(crate) snake: &'static str,
}

/// A part's function call.
pub(crate) const FUNCTION_CALL: Name = Name {
    camel: "functionCall",
    snake: "function_call",
};
/// A part's function response.
pub(crate) const FUNCTION_RESPONSE: Name = Name {
    camel: "functionResponse",
    snake: "function_response",
};
/// A part's inline media.
pub(super) const INLINE_DATA: Name = Name {
    camel: "inlineData",
    snake: "inline_data",
};
/// A part's media by URI.
pub(super) const FILE_DATA: Name = Name {
    camel: "fileData",
    snake: "file_data",
};
/// A part's code for the code-execution tool.
pub(super) const EXECUTABLE_CODE: Name = Name {
    camel: "executableCode",
    snake: "executable_code",
};
/// A part's code-execution output.
pub(super) const CODE_EXECUTION_RESULT: Name = Name {
    camel: "codeExecutionResult",
    snake: "code_execution_result",
};
/// A part's signature of the model's thinking.
pub(super) const THOUGHT_SIGNATURE: Name = Name {
    camel: "thoughtSignature",
    snake: "thought_signature",
};
/// The request's system instruction.
pub(super) const SYSTEM_INSTRUCTION: Name = Name {
    camel: "systemInstruction",
    snake: "system_instruction",
};

/// A thinking config's budget of tokens.
pub(super) const THINKING_BUDGET: Name = Name {
    camel: "thinkingBudget",
    snake: "thinking_budget",
};

/// The value of `name` in `value` under either spelling (the camelCase one first).
pub(crate) fn get(value: &Value, name: Name) -> Option<&Value> {
    value.get(name.camel).or_else(|| value.get(name.snake))
}

/// [`get`], mutable.
pub(super) fn get_mut(value: &mut Value, name: Name) -> Option<&mut Value> {
    if value.get(name.camel).is_some() {
        return value.get_mut(name.camel);
    }
    value.get_mut(name.snake)
}

/// True when `key` is either spelling of `name`.
pub(super) fn is(key: &str, name: Name) -> bool {
    key == name.camel || key == name.snake
}
