//! What a request asks of the API's own context management, read and checked as the
//! API checks it: the Responses API's `context_management` compaction, and the
//! Messages API's edits (`compact_20260112`, `clear_tool_uses_20250919`,
//! `clear_thinking_20251015`) and on-demand `compaction`. The clearing edits are
//! applied here, to the list handoff sends, deterministically.

use serde_json::{json, Value};

/// The fewest input tokens a `compact_20260112` trigger may name, as the API checks.
pub(crate) const MIN_COMPACT_TRIGGER: u64 = 50_000;

/// What `compact_20260112` compacts at when it names no trigger.
const DEFAULT_COMPACT_TRIGGER: u64 = 150_000;

/// What `clear_tool_uses_20250919` clears at when it names no trigger.
const DEFAULT_CLEAR_TRIGGER: u64 = 100_000;

/// What a cleared tool result says in place of its content.
pub(crate) const CLEARED: &str = "[tool result cleared to save context]";

/// A compaction the request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Compact {
    /// Input tokens past which it compacts; 0 compacts now (on demand).
    pub(crate) trigger: u64,
    /// True when the answer is the compaction alone (`pause_after_compaction`, on
    /// demand): the client sends again to go on.
    pub(crate) pause: bool,
    /// The client's own summary instructions.
    pub(crate) instructions: Option<String>,
}

/// How much thinking `clear_thinking_20251015` keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeepThinking {
    /// All of it: the edit changes nothing.
    All,
    /// That of the latest this many assistant turns.
    Turns(u64),
}

/// What starts `clear_tool_uses_20250919`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClearTrigger {
    InputTokens(u64),
    ToolUses(u64),
}

/// A `clear_tool_uses_20250919` edit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClearToolUses {
    trigger: ClearTrigger,
    keep: u64,
    clear_at_least: u64,
    exclude: Vec<String>,
    clear_inputs: bool,
}

/// Everything a request asks of the API's context management.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Asks {
    /// A compaction, past a trigger or now.
    pub(crate) compact: Option<Compact>,
    /// Old thinking cleared.
    pub(crate) clear_thinking: Option<KeepThinking>,
    /// Old tool uses cleared.
    pub(crate) clear_tool_uses: Option<ClearToolUses>,
}

/// A parameter the API would refuse, in its words.
pub(crate) type Refusal = String;

impl Asks {
    /// The asks of a Messages request: its `context_management` edits and on-demand
    /// `compaction`.
    pub(crate) fn of_messages(
        context_management: Option<&Value>,
        compaction: Option<&Value>,
    ) -> Result<Self, Refusal> {
        let mut asks = Asks::default();
        if let Some(context_management) = context_management.filter(|v| !v.is_null()) {
            let edits = (context_management.get("edits"))
                .and_then(Value::as_array)
                .ok_or("context_management.edits: Field required")?;
            for (at, edit) in edits.iter().enumerate() {
                asks.read_edit(at, edit)?;
            }
        }
        if let Some(compaction) = compaction.filter(|v| !v.is_null()) {
            let instructions = optional_text(compaction, "instructions", "compaction")?;
            asks.compact = Some(Compact {
                trigger: 0,
                pause: true,
                instructions,
            });
        }
        Ok(asks)
    }

    fn read_edit(&mut self, at: usize, edit: &Value) -> Result<(), Refusal> {
        let place = format!("context_management.edits.{at}");
        match edit.get("type").and_then(Value::as_str) {
            Some("compact_20260112") => {
                let trigger = match edit.get("trigger").filter(|t| !t.is_null()) {
                    None => DEFAULT_COMPACT_TRIGGER,
                    Some(trigger) => {
                        let value = tokens_of(trigger, "input_tokens", &format!("{place}.trigger"))?;
                        if value < MIN_COMPACT_TRIGGER {
                            return Err(format!("{place}.trigger.value: Input should be greater than or equal to {MIN_COMPACT_TRIGGER}"));
                        }
                        value
                    }
                };
                let pause = match edit.get("pause_after_compaction") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(pause)) => *pause,
                    Some(_) => return Err(format!("{place}.pause_after_compaction: Input should be a valid boolean")),
                };
                let instructions = optional_text(edit, "instructions", &place)?;
                self.compact = Some(Compact { trigger, pause, instructions });
            }
            Some("clear_thinking_20251015") => {
                let keep = match edit.get("keep") {
                    None | Some(Value::Null) => KeepThinking::Turns(1),
                    Some(Value::String(all)) if all == "all" => KeepThinking::All,
                    Some(keep) => KeepThinking::Turns(tokens_of(keep, "thinking_turns", &format!("{place}.keep"))?.max(1)),
                };
                self.clear_thinking = Some(keep);
            }
            Some("clear_tool_uses_20250919") => {
                let trigger = match edit.get("trigger").filter(|t| !t.is_null()) {
                    None => ClearTrigger::InputTokens(DEFAULT_CLEAR_TRIGGER),
                    Some(trigger) if trigger["type"] == "tool_uses" => {
                        ClearTrigger::ToolUses(tokens_of(trigger, "tool_uses", &format!("{place}.trigger"))?)
                    }
                    Some(trigger) => ClearTrigger::InputTokens(tokens_of(trigger, "input_tokens", &format!("{place}.trigger"))?),
                };
                let keep = match edit.get("keep").filter(|k| !k.is_null()) {
                    None => 3,
                    Some(keep) => tokens_of(keep, "tool_uses", &format!("{place}.keep"))?,
                };
                let clear_at_least = match edit.get("clear_at_least").filter(|k| !k.is_null()) {
                    None => 0,
                    Some(least) => tokens_of(least, "input_tokens", &format!("{place}.clear_at_least"))?,
                };
                let exclude = match edit.get("exclude_tools") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(names)) => (names.iter())
                        .map(|n| n.as_str().map(str::to_owned).ok_or_else(|| format!("{place}.exclude_tools: Input should be a list of strings")))
                        .collect::<Result<_, _>>()?,
                    Some(_) => return Err(format!("{place}.exclude_tools: Input should be a valid list")),
                };
                let clear_inputs = match edit.get("clear_tool_inputs") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(clear)) => *clear,
                    Some(_) => return Err(format!("{place}.clear_tool_inputs: Input should be a valid boolean")),
                };
                self.clear_tool_uses = Some(ClearToolUses { trigger, keep, clear_at_least, exclude, clear_inputs });
            }
            Some(other) => return Err(format!("{place}.type: Input tag '{other}' found using 'type' does not match any of the expected tags: 'clear_tool_uses_20250919', 'clear_thinking_20251015', 'compact_20260112'")),
            None => return Err(format!("{place}.type: Field required")),
        }
        Ok(())
    }

    /// The asks of a Responses create: its `context_management` compaction entries.
    /// `threshold` is the model's own trigger, for an entry that names none.
    pub(crate) fn of_responses(
        context_management: Option<&Value>,
        threshold: u64,
    ) -> Result<Self, Refusal> {
        let Some(entries) = context_management.filter(|v| !v.is_null()) else {
            return Ok(Asks::default());
        };
        let entries = entries
            .as_array()
            .ok_or("Invalid type for 'context_management': expected an array of objects.")?;
        let mut asks = Asks::default();
        for (at, entry) in entries.iter().enumerate() {
            if entry.get("type").and_then(Value::as_str) != Some("compaction") {
                return Err(format!("Invalid value for 'context_management[{at}].type': supported values are: 'compaction'."));
            }
            let trigger = match entry.get("compact_threshold") {
                None | Some(Value::Null) => threshold,
                Some(value) => value.as_u64().filter(|n| *n > 0).ok_or_else(|| {
                    format!("Invalid 'context_management[{at}].compact_threshold': expected a positive integer.")
                })?,
            };
            asks.compact = Some(Compact {
                trigger,
                pause: false,
                instructions: None,
            });
        }
        Ok(asks)
    }

    /// True when the asks change nothing handoff must do but take them off the
    /// request (`keep: "all"` alone).
    pub(crate) fn only_removed(&self) -> bool {
        self.compact.is_none()
            && self.clear_tool_uses.is_none()
            && matches!(self.clear_thinking, None | Some(KeepThinking::All))
    }

    /// Applies the clearing edits to a Messages list (`input_tokens` its size, `count`
    /// a text's tokens), as the API does: the oldest first, the latest kept. The edits
    /// applied, as the API reports them in `context_management.applied_edits`.
    pub(crate) fn clear(
        &self,
        messages: &mut [Value],
        input_tokens: u64,
        count: &dyn Fn(&str) -> u64,
    ) -> Vec<Value> {
        let mut applied = Vec::new();
        if let Some(KeepThinking::Turns(keep)) = self.clear_thinking {
            let (turns, tokens) = clear_thinking(messages, keep, count);
            if turns > 0 {
                applied.push(json!({"type": "clear_thinking_20251015",
                    "cleared_thinking_turns": turns, "cleared_input_tokens": tokens}));
            }
        }
        if let Some(edit) = &self.clear_tool_uses {
            let (uses, tokens) = edit.apply(messages, input_tokens, count);
            if uses > 0 {
                applied.push(json!({"type": "clear_tool_uses_20250919",
                    "cleared_tool_uses": uses, "cleared_input_tokens": tokens}));
            }
        }
        applied
    }
}

/// `{"type": kind, "value": n}` at `place`: its `n`.
fn tokens_of(value: &Value, kind: &str, place: &str) -> Result<u64, Refusal> {
    if value.get("type").and_then(Value::as_str) != Some(kind) {
        return Err(format!("{place}.type: Input should be '{kind}'"));
    }
    (value.get("value").and_then(Value::as_u64))
        .ok_or_else(|| format!("{place}.value: Input should be a valid integer"))
}

fn optional_text(value: &Value, key: &str, place: &str) -> Result<Option<String>, Refusal> {
    match value.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(format!("{place}.{key}: Input should be a valid string")),
    }
}

/// Takes the thinking out of every assistant message but the latest `keep` that hold
/// some; a message that is thinking alone keeps it (an empty one is refused).
fn clear_thinking(messages: &mut [Value], keep: u64, count: &dyn Fn(&str) -> u64) -> (u64, u64) {
    let thinking = |block: &Value| {
        matches!(
            block["type"].as_str(),
            Some("thinking" | "redacted_thinking")
        )
    };
    let holding: Vec<usize> = (messages.iter().enumerate())
        .filter(|(_, m)| {
            m["role"] == "assistant"
                && m["content"]
                    .as_array()
                    .is_some_and(|b| b.iter().any(thinking))
        })
        .map(|(at, _)| at)
        .collect();
    let clear = holding.len().saturating_sub(keep as usize);
    let (mut turns, mut tokens) = (0, 0);
    for at in &holding[..clear] {
        let Some(blocks) = messages[*at]["content"].as_array_mut() else {
            continue;
        };
        if blocks.iter().all(thinking) {
            continue;
        }
        tokens += (blocks.iter().filter(|b| thinking(b)))
            .map(|b| count(b["thinking"].as_str().or(b["data"].as_str()).unwrap_or("")))
            .sum::<u64>();
        blocks.retain(|b| !thinking(b));
        turns += 1;
    }
    (turns, tokens)
}

impl ClearToolUses {
    /// Clears the oldest tool results (and inputs, when asked) past the trigger, all
    /// but the latest `keep` and the excluded tools'; none when fewer than
    /// `clear_at_least` tokens would go.
    fn apply(
        &self,
        messages: &mut [Value],
        input_tokens: u64,
        count: &dyn Fn(&str) -> u64,
    ) -> (u64, u64) {
        let uses: Vec<(usize, usize, String, String)> = (messages.iter().enumerate())
            .filter(|(_, m)| m["role"] == "assistant")
            .flat_map(|(at, m)| {
                (m["content"].as_array().into_iter().flatten().enumerate())
                    .filter(|(_, b)| b["type"] == "tool_use")
                    .map(move |(block, b)| {
                        let id = b["id"].as_str().unwrap_or("").to_owned();
                        let name = b["name"].as_str().unwrap_or("").to_owned();
                        (at, block, id, name)
                    })
            })
            .collect();
        let due = match self.trigger {
            ClearTrigger::InputTokens(value) => input_tokens > value,
            ClearTrigger::ToolUses(value) => uses.len() as u64 > value,
        };
        if !due {
            return (0, 0);
        }
        let clearable = uses.len().saturating_sub(self.keep as usize);
        let chosen: Vec<&(usize, usize, String, String)> = (uses[..clearable].iter())
            .filter(|(.., name)| !self.exclude.contains(name))
            .collect();
        // What clearing would free, first: below `clear_at_least`, nothing is cleared.
        let mut plan = Vec::new();
        let mut tokens = 0;
        for (at, block, id, _) in &chosen {
            let Some((result_at, result_block)) = result_of(messages, *at, id) else {
                continue;
            };
            let result = &messages[result_at]["content"][result_block];
            if result["content"] == CLEARED {
                continue;
            }
            tokens += count(&result["content"].to_string());
            if self.clear_inputs {
                tokens += count(&messages[*at]["content"][*block]["input"].to_string());
            }
            plan.push((*at, *block, result_at, result_block));
        }
        if plan.is_empty() || tokens < self.clear_at_least {
            return (0, 0);
        }
        for (at, block, result_at, result_block) in &plan {
            messages[*result_at]["content"][*result_block]["content"] = json!(CLEARED);
            if self.clear_inputs {
                messages[*at]["content"][*block]["input"] = json!({});
            }
        }
        (plan.len() as u64, tokens)
    }
}

/// Where the `tool_result` answering `id` (used in message `at`) lies.
fn result_of(messages: &[Value], at: usize, id: &str) -> Option<(usize, usize)> {
    let next = at + 1;
    let blocks = messages.get(next)?["content"].as_array()?;
    let block = blocks
        .iter()
        .position(|b| b["type"] == "tool_result" && b["tool_use_id"] == id)?;
    Some((next, block))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(text: &str) -> u64 {
        text.len() as u64 / 4
    }

    #[test]
    fn the_edits_are_checked_as_the_api_checks_them() {
        let asks = |cm: Value| Asks::of_messages(Some(&cm), None);
        let low = asks(
            json!({"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 1000}}]}),
        );
        assert!(low.unwrap_err().contains("greater than or equal to 50000"));
        assert!(asks(json!({"edits": [{"type": "clear_everything"}]}))
            .unwrap_err()
            .contains("does not match"));
        assert!(asks(json!({})).unwrap_err().contains("edits"));
        let all =
            asks(json!({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]})).unwrap();
        assert!(all.only_removed());
        let compact =
            asks(json!({"edits": [{"type": "compact_20260112", "pause_after_compaction": true}]}))
                .unwrap();
        assert_eq!(
            compact.compact,
            Some(Compact {
                trigger: 150_000,
                pause: true,
                instructions: None
            })
        );
        let now = Asks::of_messages(None, Some(&json!({"instructions": "keep the plan"}))).unwrap();
        assert_eq!(now.compact.map(|c| (c.trigger, c.pause)), Some((0, true)));
        let responses = Asks::of_responses(
            Some(&json!([{"type": "compaction", "compact_threshold": 2000}])),
            9,
        )
        .unwrap();
        assert_eq!(responses.compact.map(|c| c.trigger), Some(2000));
        assert!(Asks::of_responses(Some(&json!([{"type": "truncate"}])), 9).is_err());
    }

    fn agent(uses: usize) -> Vec<Value> {
        let mut messages = vec![json!({"role": "user", "content": "go"})];
        for n in 0..uses {
            messages.push(json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm ".repeat(40), "signature": "s"},
                {"type": "tool_use", "id": format!("t{n}"), "name": if n == 0 { "memory" } else { "sh" }, "input": {"cmd": "ls"}}]}));
            messages.push(json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": format!("t{n}"), "content": "file ".repeat(100)}]}));
        }
        messages
    }

    #[test]
    fn clearing_takes_the_oldest_and_keeps_the_latest_and_the_excluded() {
        let edits = json!({"edits": [
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}},
            {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 3},
             "keep": {"type": "tool_uses", "value": 2}, "exclude_tools": ["memory"], "clear_tool_inputs": true}]});
        let asks = Asks::of_messages(Some(&edits), None).unwrap();
        let mut messages = agent(5);
        let applied = asks.clear(&mut messages, 10_000, &count);
        assert_eq!(applied[0]["cleared_thinking_turns"], 3);
        assert_eq!(
            applied[1]["cleared_tool_uses"], 2,
            "t1 and t2: t0 is excluded, t3 and t4 kept"
        );
        assert_eq!(messages[2]["content"][0]["content"], "file ".repeat(100));
        assert_eq!(messages[4]["content"][0]["content"], CLEARED);
        assert_eq!(messages[3]["content"][0]["input"], json!({}));
        assert_eq!(messages[10]["content"][0]["content"], "file ".repeat(100));
        assert_eq!(messages[9]["content"][0]["type"], "thinking");
        assert_eq!(messages[5]["content"][0]["type"], "tool_use");
        // Again: nothing more to clear, the same list.
        let before = messages.clone();
        let again = asks.clear(&mut messages, 10_000, &count);
        assert_eq!(again.len(), 0);
        assert_eq!(messages, before);
        // Under its trigger, or freeing less than asked, it clears nothing.
        let least = json!({"edits": [{"type": "clear_tool_uses_20250919",
            "clear_at_least": {"type": "input_tokens", "value": 100_000}}]});
        let mut fresh = agent(5);
        assert!(Asks::of_messages(Some(&least), None)
            .unwrap()
            .clear(&mut fresh, 200_000, &count)
            .is_empty());
    }
}
