//! Whether a model's text is a handoff. A reply that finished with `stop` may still be
//! no summary at all: a small or overloaded model skips the template, stops mid-way,
//! echoes its prompt, or invents ids. Such a text fails the attempt as
//! `invalid_summary`, with what was wrong, and the chain goes on.
//!
//! The rules:
//! - **Sections.** Every `## Heading` of the prompt in use (a custom prompt brings its
//!   own) appears as a Markdown heading of the text, in order, with text under it
//!   ("None." is text).
//! - **No echo.** The text does not quote the prompt's own instructions or the tags
//!   the history is wrapped in.
//! - **No invented identifiers.** The text's identifiers (paths, ids, numbers of three
//!   or more digits, `backtick` quotes: [`handoff_plugin_api::identifiers`]) must
//!   appear in what the model was shown, compared case-insensitively. One, or 5% of
//!   them if more, may not: a model may abbreviate a name.

/// How many unseen identifiers pass: this share of those found, and at least one.
const UNSEEN_SHARE: f64 = 0.05;

/// The sections the prompt asks for: its `## ` headings, in order.
pub fn sections_of(prompt: &str) -> Vec<String> {
    prompt
        .lines()
        .filter_map(|line| line.trim().strip_prefix("## "))
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .collect()
}

/// Checks `text` against the prompt's `sections`, the `prompt` itself and what the
/// model was `shown`; the error says what is wrong.
pub fn check(text: &str, sections: &[String], prompt: &str, shown: &str) -> Result<(), String> {
    check_sections(text, sections)?;
    check_echo(text, prompt)?;
    check_identifiers(text, shown)
}

/// A heading line's name: `## Goal`, `**Goal**`, `# Goal:` all name `goal`.
fn heading(line: &str) -> Option<String> {
    let line = line.trim();
    let name = if let Some(rest) = line.strip_prefix('#') {
        rest.trim_start_matches('#')
    } else if line.starts_with("**") && line.ends_with("**") && line.len() > 4 {
        &line[2..line.len() - 2]
    } else {
        return None;
    };
    let name = name
        .trim()
        .trim_matches('*')
        .trim()
        .trim_end_matches(':')
        .trim();
    (!name.is_empty()).then(|| name.to_lowercase())
}

fn check_sections(text: &str, sections: &[String]) -> Result<(), String> {
    if sections.is_empty() {
        return Ok(());
    }
    // The text's headings with whether any text follows each one.
    let mut found: Vec<(String, bool)> = Vec::new();
    for line in text.lines() {
        match heading(line) {
            Some(name) => found.push((name, false)),
            None if !line.trim().is_empty() => {
                if let Some(last) = found.last_mut() {
                    last.1 = true;
                }
            }
            None => {}
        }
    }
    let mut at = 0;
    let mut missing = Vec::new();
    let mut empty = Vec::new();
    for section in sections {
        let wanted = section.to_lowercase();
        match found[at..].iter().position(|(name, _)| *name == wanted) {
            Some(offset) => {
                if !found[at + offset].1 {
                    empty.push(section.as_str());
                }
                at += offset + 1;
            }
            None => missing.push(section.as_str()),
        }
    }
    if !missing.is_empty() {
        return Err(format!(
            "{} of the prompt's {} sections are missing or out of order: {}",
            missing.len(),
            sections.len(),
            missing.join(", ")
        ));
    }
    if !empty.is_empty() {
        return Err(format!(
            "sections with nothing under them: {}",
            empty.join(", ")
        ));
    }
    Ok(())
}

/// Tags the summary request wraps its material in.
const TAGS: &[&str] = &[
    "<history>",
    "</history>",
    "<retained_recent_messages>",
    "<previous_handoff>",
    "<running_handoff>",
];

fn check_echo(text: &str, prompt: &str) -> Result<(), String> {
    if let Some(tag) = TAGS.iter().find(|tag| text.contains(*tag)) {
        return Err(format!("it echoes the request back ({tag})"));
    }
    // The prompt's own instructions: long lines that are not headings.
    let echoed = prompt
        .lines()
        .map(str::trim)
        .filter(|line| line.len() >= 40 && heading(line).is_none())
        .filter(|line| text.contains(*line))
        .count();
    if echoed > 0 {
        return Err(format!("it echoes {echoed} line(s) of the prompt back"));
    }
    Ok(())
}

fn check_identifiers(text: &str, shown: &str) -> Result<(), String> {
    let seen = shown.to_lowercase();
    let found = handoff_plugin_api::identifiers(text);
    let unseen: Vec<&String> = found
        .iter()
        .filter(|id| !seen.contains(id.as_str()))
        .collect();
    let allowed = ((found.len() as f64 * UNSEEN_SHARE) as usize).max(1);
    if unseen.len() > allowed {
        let named: Vec<&str> = unseen.iter().take(8).map(|s| s.as_str()).collect();
        return Err(format!(
            "it names {} identifier(s) that appear nowhere in what it was shown: {}",
            unseen.len(),
            named.join(", ")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMPT: &str = crate::DEFAULT_PROMPT;

    fn sections() -> Vec<String> {
        sections_of(PROMPT)
    }

    fn good() -> String {
        sections()
            .iter()
            .map(|s| format!("## {s}\nSee `src/main.rs` and FACT-007.\n"))
            .collect()
    }

    const SHOWN: &str = "<history>user: fix src/main.rs, keep FACT-007</history>";

    #[test]
    fn the_default_prompt_has_its_eight_sections() {
        assert_eq!(sections().len(), 8);
        assert_eq!(sections()[0], "Goal");
    }

    #[test]
    fn a_summary_with_every_section_and_only_seen_ids_passes() {
        assert_eq!(check(&good(), &sections(), PROMPT, SHOWN), Ok(()));
    }

    // Texts as SmolLM2-135M-Instruct wrote them for real sessions (shortened).
    #[test]
    fn the_small_models_summaries_are_refused_with_the_reason() {
        let no_headings = "The user asked about the weather and the assistant called get_weather. Then they talked about other things.";
        let err = check(no_headings, &sections(), PROMPT, SHOWN).unwrap_err();
        assert!(err.contains("8 of the prompt's 8 sections"), "{err}");

        let cut = "## Goal\nFix the bug.\n## Completed work\n";
        let err = check(cut, &sections(), PROMPT, SHOWN).unwrap_err();
        assert!(err.contains("missing"), "{err}");

        let invented = good().replace("FACT-007", "usr001 usr002 usr003");
        let err = check(&invented, &sections(), PROMPT, SHOWN).unwrap_err();
        assert!(err.contains("usr00"), "{err}");

        let echoed = format!("{PROMPT}\n{}", good());
        let err = check(&echoed, &sections(), PROMPT, SHOWN).unwrap_err();
        assert!(err.contains("echoes"), "{err}");
        let instructions = format!("{}\nWrite only from the material given in the history. Never invent facts, file names, values or results.", good());
        let quoted_line = PROMPT
            .lines()
            .find(|l| l.len() > 60 && !l.contains('<'))
            .unwrap();
        let err = check(
            &format!("{instructions}\n{quoted_line}"),
            &sections(),
            PROMPT,
            SHOWN,
        )
        .unwrap_err();
        assert!(err.contains("line(s) of the prompt"), "{err}");

        let history = format!("{}\n<history>user: fix</history>", good());
        assert!(check(&history, &sections(), PROMPT, SHOWN).is_err());

        let empty = good().replace(
            "See `src/main.rs` and FACT-007.\n## Pending work",
            "## Pending work",
        );
        let err = check(&empty, &sections(), PROMPT, SHOWN).unwrap_err();
        assert!(err.contains("nothing under them"), "{err}");
    }

    /// Summaries SmolLM2-135M-Instruct wrote at temperature 0 for chained real bfcl
    /// sessions (`benches/eval.sh` with REAL=1), with what each was shown. Each ended in
    /// `length`, which fails the attempt first; were it `stop`, the checks still refuse.
    #[test]
    fn the_small_models_real_summaries_are_refused_for_what_is_wrong_with_them() {
        let fixtures = include_str!("../tests/fixtures/smollm2_summaries.jsonl");
        let expected = [
            ("echoes_the_request_tags", "sections are missing"),
            // Every heading, in order, with the prompt's own lines under each: only the
            // echo check sees it.
            (
                "echoes_the_prompt_with_its_headings",
                "echoes the request back",
            ),
            ("no_headings", "8 of the prompt's 8 sections are missing"),
            ("echoes_the_history", "sections are missing"),
        ];
        let mut seen = 0;
        for line in fixtures.lines() {
            let case: serde_json::Value = serde_json::from_str(line).unwrap();
            let name = case["case"].as_str().unwrap();
            let text = case["text"].as_str().unwrap();
            let shown = case["shown"].as_str().unwrap();
            let err = check(text, &sections(), PROMPT, shown).unwrap_err();
            let (_, wanted) = expected.iter().find(|(n, _)| *n == name).unwrap();
            assert!(err.contains(wanted), "{name}: {err}");
            if name == "echoes_the_prompt_with_its_headings" {
                assert_eq!(check_sections(text, &sections()), Ok(()));
            }
            seen += 1;
        }
        assert_eq!(seen, expected.len());
    }

    #[test]
    fn headings_in_other_marks_and_one_abbreviation_pass() {
        let bold: String = sections()
            .iter()
            .map(|s| format!("**{s}:**\nNone.\n"))
            .collect();
        assert_eq!(check(&bold, &sections(), PROMPT, SHOWN), Ok(()));
        let one_unseen = good().replace("FACT-007.", "FACT-007 and main2.");
        assert_eq!(check(&one_unseen, &sections(), PROMPT, SHOWN), Ok(()));
    }
}
