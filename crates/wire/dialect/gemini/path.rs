//! Gemini's paths: the model and the method are in them
//! (`/v1beta/models/{model}:streamGenerateContent?alt=sse`), so reading a request,
//! calling a summary model and rerouting to another model all go through here.

/// The two methods that generate, as the path ends.
const GENERATE: &str = ":generateContent";
const STREAM: &str = ":streamGenerateContent";

/// The methods of a model (`…/models/{model}:{method}`) Google's references list: what
/// tells a Gemini path under `/v1/models/` from an OpenAI fine-tuned model's id, which
/// holds colons too. Under Gemini's own prefixes any method names its model.
pub(super) const METHODS: &[&str] = &[
    "generateContent",
    "streamGenerateContent",
    "countTokens",
    "embedContent",
    "batchEmbedContents",
    "batchGenerateContent",
    "asyncBatchEmbedContent",
    "predict",
    "predictLongRunning",
    "generateAnswer",
    "generateMessage",
    "countMessageTokens",
    "generateText",
    "countTextTokens",
    "embedText",
    "batchEmbedText",
    "bidiGenerateContent",
];

/// The model a generating path names and whether it streams: `…/models/{model}:
/// generateContent` or `:streamGenerateContent` (tuned models too).
pub(super) fn generating(path: &str) -> Option<(&str, bool)> {
    let (rest, stream) = match path.strip_suffix(GENERATE) {
        Some(rest) => (rest, false),
        None => (path.strip_suffix(STREAM)?, true),
    };
    Some((model_at_end(rest)?, stream))
}

/// The model a path names at its end (`…/models/{model}`, `…/tunedModels/{model}`).
fn model_at_end(rest: &str) -> Option<&str> {
    let at = rest
        .rfind("/models/")
        .map(|at| at + "/models/".len())
        .or_else(|| {
            rest.rfind("/tunedModels/")
                .map(|at| at + "/tunedModels/".len())
        })?;
    let model = &rest[at..];
    (!model.is_empty() && !model.contains('/')).then_some(model)
}

/// True when the query asks for SSE (`alt=sse`).
pub(super) fn asks_sse(target: &str) -> bool {
    target
        .split_once('?')
        .is_some_and(|(_, query)| query.split('&').any(|pair| pair == "alt=sse"))
}

/// The model any model method's path names (`…/models/{model}:countTokens`, a tuned
/// model's `…/tunedModels/{model}:generateContent`), whatever the method: one the
/// dialect does not list (`models/aqa:generateAnswer`) still runs that model, so a
/// key's allow-list still applies.
pub(super) fn model(path: &str) -> Option<&str> {
    let (rest, method) = path.rsplit_once(':')?;
    let is_method = !method.is_empty() && method.bytes().all(|b| b.is_ascii_alphabetic());
    is_method.then(|| model_at_end(rest)).flatten()
}

/// The `generateContent` path of `model`, under the API version of `target` when the
/// client's request came through one.
pub(super) fn call(model: &str, target: Option<&str>) -> String {
    let root = target
        .and_then(|t| t.split('?').next())
        .and_then(|path| path.find("/models/").map(|at| &path[..at]))
        .filter(|root| !root.is_empty())
        .unwrap_or("/v1beta");
    format!("{root}/models/{model}{GENERATE}")
}

/// `target` with `model` in place of the model it names, its method and query kept.
pub(super) fn retarget(target: &str, model: &str) -> Option<String> {
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    let (old, stream) = generating(path)?;
    let method = if stream { STREAM } else { GENERATE };
    let prefix = &path[..path.len() - method.len() - old.len()];
    let mut out = format!("{prefix}{model}{method}");
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    Some(out)
}
