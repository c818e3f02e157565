//! A previous extract handoff read back into its parts, so that a new extract merges
//! them with the new history instead of nesting the old text: repeated compactions
//! drop the oldest items first, never the middle of a text, and no heading piles up.

/// The parts of a previous handoff.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Previous {
    /// Its user-message items as written (`- …` and their indented lines), oldest first.
    pub users: Vec<String>,
    /// User messages it had already left out.
    pub users_left_out: usize,
    /// Its tool entries, each the call line and its result lines, oldest first.
    pub tools: Vec<(String, String)>,
    /// Tool calls it had already left out.
    pub calls_left_out: usize,
    /// What the calls it left out named, as its note said.
    pub calls_left_out_named: Vec<String>,
    /// What it carried that is no extract item: a summary it was, or one it held.
    pub carried: Option<String>,
    /// Its last assistant message.
    pub last_assistant: Option<String>,
}

const USERS: &str = "User messages";
const TOOLS: &str = "Tool calls and results";
const CARRIED: &str = "Previous handoff";
const LAST: &str = "Last assistant message";

/// Reads `previous`: an extract handoff (it starts with `preamble`) into its items,
/// anything else (a model's summary) as carried text.
pub(crate) fn read(previous: &str, preamble: &str) -> Previous {
    let Some(body) = previous.strip_prefix(preamble) else {
        let text = previous.trim();
        return Previous {
            carried: (!text.is_empty()).then(|| text.to_owned()),
            ..Previous::default()
        };
    };
    let mut out = Previous::default();
    for section in body.split("\n## ").skip(1) {
        let (heading, text) = section.split_once('\n').unwrap_or((section, ""));
        if heading.starts_with(USERS) {
            let (items, left_out) = items_of(text);
            out.users = items;
            out.users_left_out = left_out;
        } else if heading.starts_with(TOOLS) {
            let (items, left_out) = items_of(text);
            out.calls_left_out_named = named_in_note(text);
            out.tools = items
                .into_iter()
                .map(|item| match item.split_once('\n') {
                    Some((call, result)) => (format!("{call}\n"), result.to_owned()),
                    None => (item, String::new()),
                })
                .collect();
            out.calls_left_out = left_out;
        } else if heading.starts_with(CARRIED) {
            let text = text.trim();
            if !text.is_empty() {
                out.carried = Some(text.to_owned());
            }
        } else if heading.starts_with(LAST) {
            let text = text.trim();
            if !text.is_empty() {
                out.last_assistant = Some(text.to_owned());
            }
        }
    }
    out
}

/// The identifiers a section's `[… left out …; they named: a, b and N more]` note lists.
fn named_in_note(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| line.starts_with('[') && line.contains("left out"))
        .filter_map(|line| line.split_once("they named: "))
        .flat_map(|(_, names)| {
            let names = names.trim_end_matches(']');
            let names = names.split(" and ").next().unwrap_or(names);
            names.split(", ").map(str::to_owned).collect::<Vec<_>>()
        })
        .filter(|name| !name.is_empty())
        .collect()
}

/// The `- ` items of a section (each with its indented lines, newline-terminated), and
/// the count its `[N earlier … left out …]` note gives.
fn items_of(text: &str) -> (Vec<String>, usize) {
    let mut items: Vec<String> = Vec::new();
    let mut left_out = 0;
    for line in text.lines() {
        if let Some(note) = line.strip_prefix('[') {
            if note.contains("left out") {
                left_out += note
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<usize>().ok())
                    .unwrap_or(0);
            }
            continue;
        }
        match items.last_mut() {
            Some(item) if line.starts_with("  ") => {
                item.push_str(line);
                item.push('\n');
            }
            _ if line.starts_with("- ") => items.push(format!("{line}\n")),
            _ => {}
        }
    }
    (items, left_out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREAMBLE: &str = "# P\n";

    #[test]
    fn an_extract_reads_back_into_its_items_and_a_summary_is_carried() {
        let text = "# P\n\n## Previous handoff\nOLD SUMMARY\n\n## User messages (verbatim, oldest first)\n[2 earlier user message(s) left out for space]\n- first\n  more of first\n- second\n\n## Tool calls and results (first and last lines, oldest first)\n[1 earlier tool call(s) left out for space]\n- read({}) -> ok\n  | HEAD\n  | TAIL\n- grep({}) -> error\n\n## Last assistant message\ndone\n";
        let previous = read(text, PREAMBLE);
        assert_eq!(previous.users, ["- first\n  more of first\n", "- second\n"]);
        assert_eq!(previous.users_left_out, 2);
        assert_eq!(
            previous.tools,
            [
                (
                    "- read({}) -> ok\n".to_owned(),
                    "  | HEAD\n  | TAIL\n".to_owned()
                ),
                ("- grep({}) -> error\n".to_owned(), String::new())
            ]
        );
        assert_eq!(previous.calls_left_out, 1);
        assert_eq!(previous.carried.as_deref(), Some("OLD SUMMARY"));
        assert_eq!(previous.last_assistant.as_deref(), Some("done"));
        let summary = read("## Goal\nkeep going", PREAMBLE);
        assert_eq!(summary.carried.as_deref(), Some("## Goal\nkeep going"));
        assert!(summary.users.is_empty());
    }
}
