//! Reading the disk store's logs: a conversation's folder is opened once and its files
//! read through that descriptor (one version of the folder, whatever upkeep swaps in
//! meanwhile); compressed lines first, then the plain log; pinned blocks put back.

use std::io::BufRead;
use std::path::Path;

use rustix::fd::OwnedFd;

use super::blocks::Resolver;
use super::conversation_log::{ConversationLog, LineProblem};
use super::layout::{COLD_FILE, COMPACTIONS_FILE, MESSAGES_FILE};
use super::KeepText;
use crate::base::line::{Entry, Line, NEWEST_VERSION};
use crate::base::record::CompactionRecord;

/// Reads a conversation from its `messages.jsonl` path and the records beside it.
pub fn read_conversation(data_dir: &Path, messages: &Path) -> std::io::Result<ConversationLog> {
    let Some(dir) = open_folder(data_dir, messages)? else {
        return Ok(ConversationLog::default());
    };
    let log = read_lines(&dir, Resolver::new(data_dir, messages), |_| {})?;
    with_records(&dir, log)
}

/// The folder of `messages`, opened once so that every file read through it is of
/// one version of the folder; `None` when there is none.
fn open_folder(data_dir: &Path, messages: &Path) -> std::io::Result<Option<OwnedFd>> {
    let Some(folder) = messages.parent() else {
        return Ok(None);
    };
    // No link followed below the data dir: a planted one would read another's log.
    match super::perms::open_dir_beneath(data_dir, folder) {
        Ok(dir) => Ok(Some(dir)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

/// `log` with the compaction records of the folder `dir`.
fn with_records(dir: &OwnedFd, mut log: ConversationLog) -> std::io::Result<ConversationLog> {
    let mut records = Vec::new();
    let mut number = 0;
    let problems = match open_file(dir, COMPACTIONS_FILE)? {
        Some(file) => read_jsonl(std::io::BufReader::new(file), &mut number, |bytes, _| {
            records.push(
                serde_json::from_slice::<CompactionRecord>(bytes).map_err(|err| err.to_string())?,
            );
            Ok(())
        })?,
        None => Vec::new(),
    };
    log.compactions = records;
    log.compaction_problems = problems;
    Ok(log)
}

/// [`read_conversation`] for tracking: a message `keep` refuses keeps its digests but
/// not its text, dropped line by line, so memory follows the number of lines, not the
/// size of the log.
pub fn read_conversation_index(
    data_dir: &Path,
    messages: &Path,
    keep: KeepText,
) -> std::io::Result<ConversationLog> {
    let Some(dir) = open_folder(data_dir, messages)? else {
        return Ok(ConversationLog::default());
    };
    let mut text_keys = std::collections::HashMap::new();
    let mut log = read_lines(&dir, Resolver::new(data_dir, messages), |line| {
        if let Entry::Message(message) = &mut line.entry {
            if !keep(message.message.get()) {
                let key = crate::base::chunks::keyed_hash(message.message.get().as_bytes());
                text_keys.insert(message.digest, key);
                message.message = dropped_text();
            }
        }
    })?;
    log.text_keys = text_keys;
    with_records(&dir, log)
}

/// What a dropped message text is replaced with.
fn dropped_text() -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string("null".to_owned())
        .unwrap_or_else(|_| Box::<serde_json::value::RawValue>::default())
}

/// Reads a message log; a missing file is an empty log, bad lines are reported.
pub fn read_log_file(data_dir: &Path, path: &Path) -> std::io::Result<ConversationLog> {
    match open_folder(data_dir, path)? {
        Some(dir) => read_lines(&dir, Resolver::new(data_dir, path), |_| {}),
        None => Ok(ConversationLog::default()),
    }
}

/// A file of the folder `dir`; `None` when it has none.
fn open_file(dir: &OwnedFd, name: &str) -> std::io::Result<Option<std::fs::File>> {
    match super::perms::open_in(dir, name) {
        Ok(file) => Ok(Some(file)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

/// Reads the message log of the folder `dir`, its compressed lines first, passing
/// each good line through `keep` before it is kept. Line numbers run on from the
/// compressed lines into the plain ones.
fn read_lines(
    dir: &OwnedFd,
    mut blocks: Resolver,
    mut keep: impl FnMut(&mut Line),
) -> std::io::Result<ConversationLog> {
    let mut lines = Vec::new();
    let mut file_lines = Vec::new();
    let mut number = 0;
    let mut parse = |bytes: &[u8], number: usize| {
        let start = lines.len();
        Line::parse_into(bytes, &mut lines).map_err(|err| err.to_string())?;
        if let Some(line) = lines[start..].iter().find(|l| l.v > NEWEST_VERSION) {
            let v = line.v;
            lines.truncate(start);
            return Err(format!(
                "format version {v} is newer than this build's {NEWEST_VERSION}"
            ));
        }
        for line in &mut lines[start..] {
            if let Err(reason) = blocks.resolve(line) {
                lines.truncate(start);
                return Err(reason);
            }
            keep(line);
        }
        file_lines.resize(lines.len(), number);
        Ok(())
    };
    let mut problems = Vec::new();
    if let Some(cold) = open_file(dir, COLD_FILE)? {
        let decoder = zstd::stream::read::Decoder::new(cold)?;
        problems.extend(read_jsonl(
            std::io::BufReader::new(decoder),
            &mut number,
            &mut parse,
        )?);
    }
    if let Some(hot) = open_file(dir, MESSAGES_FILE)? {
        problems.extend(read_jsonl(
            std::io::BufReader::new(hot),
            &mut number,
            &mut parse,
        )?);
    }
    Ok(ConversationLog {
        lines,
        file_lines,
        problems,
        ..ConversationLog::default()
    })
}

/// Reads JSONL from `reader`, handing each line and its number (counted on from
/// `number`) to `parse`; bad and torn lines are reported.
fn read_jsonl(
    mut reader: impl BufRead,
    number: &mut usize,
    mut parse: impl FnMut(&[u8], usize) -> Result<(), String>,
) -> std::io::Result<Vec<LineProblem>> {
    let mut problems = Vec::new();
    let mut buffer = Vec::new();
    loop {
        buffer.clear();
        if reader.read_until(b'\n', &mut buffer)? == 0 {
            break;
        }
        *number += 1;
        let torn = buffer.last() != Some(&b'\n');
        let text = buffer.strip_suffix(b"\n").unwrap_or(&buffer);
        if text.is_empty() {
            continue;
        }
        if let Err(err) = parse(text, *number) {
            problems.push(LineProblem {
                line: *number,
                reason: if torn {
                    format!("torn last line ({} bytes, no newline): {err}", text.len())
                } else {
                    format!("invalid line: {err}")
                },
            });
        }
    }
    Ok(problems)
}
