//! The `exec` strategy, and the `exec` middleware hook ([`ExecHook`]): a program in any
//! language. The strategy's program gets one JSON document on stdin and answers one on
//! stdout (protocol version 1, `docs/plugins.md`); the hook's stays up and answers a
//! line per call. No shell is involved, and the environment is cleared but for an
//! allow-list.
//!
//! The program runs in a process group of its own, and the whole group is killed when
//! the program exits, when its output passes the limit, or when the host's time limit
//! drops the attempt: a plugin that forks leaves nothing behind. stdout and stderr are
//! read to the end (stderr kept up to a cap), so a chatty plugin never blocks on a
//! full pipe.
//!
//! A host that can run [`guard_main`] (its binary calls it when started with
//! [`GUARD_ARG`]) has each plugin started under a guard: the group's first process,
//! which kills the group when the host is gone, so a plugin hung when the host was
//! `kill -9`ed does not run on for ever.

#![forbid(unsafe_code)]

mod hook;

pub use hook::ExecHook;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{AttemptError, FailureReason, Strategy, StrategyInput, Summary};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

/// The protocol version sent as `version` and expected back.
pub const PROTOCOL_VERSION: u32 = 1;

/// Characters of stderr quoted in a failure.
const STDERR_SHOWN: usize = 500;

/// Bytes of stderr kept; the rest is read and dropped.
const STDERR_KEPT: usize = 64 * 1024;

/// A child's process group, killed whole when dropped.
struct Group(Option<nix::unistd::Pid>);

impl Group {
    fn kill(&self) {
        if let Some(group) = self.0 {
            // ESRCH: the group is already gone.
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads `reader` to its end, keeping the first `cap` bytes; `Err(())` past `cap` when
/// `overflow_fails`, with the rest left unread.
async fn read_capped(
    mut reader: impl tokio::io::AsyncRead + Unpin,
    cap: usize,
    overflow_fails: bool,
) -> std::io::Result<Result<Vec<u8>, ()>> {
    let mut kept = Vec::new();
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let n = reader.read(&mut buffer).await?;
        if n == 0 {
            return Ok(Ok(kept));
        }
        let room = cap.saturating_sub(kept.len());
        if n > room && overflow_fails {
            return Ok(Err(()));
        }
        kept.extend_from_slice(&buffer[..n.min(room)]);
    }
}
/// A strategy backed by an external program.
#[derive(Debug, Clone)]
pub struct Exec {
    command: Vec<String>,
    env: Vec<String>,
    max_output_bytes: usize,
    /// The binary that runs [`guard_main`], if the host has one.
    guard: Option<PathBuf>,
}

impl Exec {
    /// `command[0]` with `command[1..]` as arguments; only the variables named in `env`
    /// are passed through.
    pub fn new(command: Vec<String>, env: Vec<String>, max_output_bytes: usize) -> Self {
        Self {
            command,
            env,
            max_output_bytes,
            guard: None,
        }
    }

    /// Starts the program under `guard`, a binary that calls [`guard_main`] when its
    /// first argument is [`GUARD_ARG`]: the plugin then dies with the host.
    pub fn guarded_by(mut self, guard: PathBuf) -> Self {
        self.guard = Some(guard);
        self
    }
}

/// Starts `command` (a program and its arguments) in the sandbox both exec kinds share:
/// no shell, the environment cleared but for the variables named in `env`, stdio piped,
/// a process group of its own (under `guard` when given, a binary that runs
/// [`guard_main`]), killed with the returned [`Group`]. The error names the program.
fn spawn_sandboxed(
    command: &[String],
    env: &[String],
    guard: Option<&PathBuf>,
) -> Result<(tokio::process::Child, Group), String> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| "no command to run".to_owned())?;
    let mut command = match guard {
        Some(guard) => {
            let mut command = Command::new(guard);
            command
                .arg(GUARD_ARG)
                .arg(std::process::id().to_string())
                .arg(program)
                .args(args);
            command
        }
        None => {
            let mut command = Command::new(program);
            command.args(args);
            command
        }
    };
    command
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    for name in env {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    let child = command
        .spawn()
        .map_err(|err| format!("cannot start {program}: {err}"))?;
    // process_group(0): the group's id is the child's pid (the guard's, if any).
    let group = Group(
        child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(nix::unistd::Pid::from_raw),
    );
    Ok((child, group))
}

/// The first argument that has a host's binary run [`guard_main`] instead of itself.
pub const GUARD_ARG: &str = "__handoff-exec-guard";

/// How often the guard looks for its host.
const GUARD_POLL: Duration = Duration::from_millis(50);

/// The guard's work, given the arguments after [`GUARD_ARG`] (the host's pid, the
/// program, its arguments): runs the program in this process's group with this
/// process's stdio and environment, and returns the exit code to leave with, the
/// program's. When the host is gone (this process has another parent), it kills the
/// whole group, itself included: the host can no longer.
pub fn guard_main(args: Vec<OsString>) -> i32 {
    use nix::unistd::{getpgrp, getppid, Pid};
    use std::os::unix::process::ExitStatusExt;

    let mut args = args.into_iter();
    let host = args
        .next()
        .and_then(|pid| pid.to_str().and_then(|p| p.parse::<i32>().ok()));
    let (Some(host), Some(program)) = (host, args.next()) else {
        eprintln!("usage: {GUARD_ARG} HOST_PID PROGRAM [ARG...]");
        return 2;
    };
    let kill_group = || {
        let _ = nix::sys::signal::killpg(getpgrp(), nix::sys::signal::Signal::SIGKILL);
    };
    if getppid() != Pid::from_raw(host) {
        // The host died before the guard began.
        return 1;
    }
    let mut child = match std::process::Command::new(&program).args(args).spawn() {
        Ok(child) => child,
        Err(err) => {
            eprintln!("cannot start {}: {err}", program.to_string_lossy());
            return 127;
        }
    };
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                return status
                    .code()
                    .or_else(|| status.signal().map(|signal| 128 + signal))
                    .unwrap_or(1)
            }
            Ok(None) => {}
            Err(err) => {
                eprintln!("cannot wait for {}: {err}", program.to_string_lossy());
                kill_group();
                return 1;
            }
        }
        if getppid() != Pid::from_raw(host) {
            kill_group();
            return 1;
        }
        std::thread::sleep(GUARD_POLL);
    }
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    summary: Option<String>,
    #[serde(default)]
    usage: Option<Value>,
    #[serde(default)]
    calls: Option<u32>,
    #[serde(default)]
    error: Option<String>,
}

/// The stdin document of protocol version 1.
pub fn request_document(input: &StrategyInput) -> Value {
    json!({
        "version": PROTOCOL_VERSION,
        "conversation_id": input.conversation_id,
        "dialect": input.dialect,
        "model": input.model.model,
        "window": input.model.context_window,
        "summary_model": input.model.summary_model,
        "summary_window": input.model.summary_context_window,
        "budgets": {
            "input_budget": input.budgets.input_budget,
            "handoff_tokens": input.budgets.handoff_tokens,
            "max_calls": input.budgets.max_calls,
        },
        "history": input.history.iter().map(|u| &u.messages).collect::<Vec<_>>(),
        "retained_recent_messages": input.retained_recent_messages,
        "previous_handoff": input.previous_handoff,
    })
}

fn failed(message: String) -> AttemptError {
    AttemptError::new(FailureReason::Failed, message)
}

impl Exec {
    async fn run(&self, input: &StrategyInput) -> Result<Summary, AttemptError> {
        let program = self.command.first().map_or("", String::as_str);
        let (mut child, group) =
            spawn_sandboxed(&self.command, &self.env, self.guard.as_ref()).map_err(failed)?;
        let document =
            serde_json::to_vec(&request_document(input)).map_err(|err| failed(err.to_string()))?;
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| failed("no stdin".into()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| failed("no stdout".into()))?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| failed("no stderr".into()))?;
        let limit = self.max_output_bytes;
        // Written and read at once: a plugin may answer before it has read everything.
        let write = async move {
            let written = stdin.write_all(&document).await;
            drop(stdin);
            written
        };
        let read = async {
            let out = read_capped(stdout, limit, true).await;
            if matches!(out, Ok(Err(()))) {
                // Past the limit: no point in letting it write more.
                group.kill();
            }
            out
        };
        let read_err = async {
            read_capped(stderr, STDERR_KEPT, false)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default()
        };
        let exit = async {
            let status = child.wait().await;
            // Whatever it started dies with it, and pipes they held close.
            group.kill();
            status
        };
        let (written, out, err, status) = tokio::join!(write, read, read_err, exit);
        let out = out.map_err(|e| failed(format!("reading stdout: {e}")))?;
        let Ok(out) = out else {
            return Err(failed(format!("output larger than {limit} bytes")));
        };
        let status = status.map_err(|e| failed(format!("waiting for {program}: {e}")))?;
        let stderr_tail: String = String::from_utf8_lossy(&err)
            .chars()
            .take(STDERR_SHOWN)
            .collect();
        if !status.success() {
            return Err(failed(format!(
                "{program} exited with {status}: {}",
                stderr_tail.trim()
            )));
        }
        if let Err(e) = written {
            return Err(failed(format!("writing stdin: {e}")));
        }
        let answer: Answer = serde_json::from_slice(&out)
            .map_err(|e| failed(format!("stdout is not a protocol answer: {e}")))?;
        if let Some(error) = answer.error {
            return Err(failed(format!("plugin error: {error}")).with_usage(answer.usage));
        }
        match answer.summary {
            Some(text) if !text.trim().is_empty() => Ok(Summary {
                text,
                usage: answer.usage,
                calls: answer.calls,
            }),
            _ => Err(AttemptError::new(
                FailureReason::EmptySummary,
                "the plugin returned no summary",
            )
            .with_usage(answer.usage)),
        }
    }
}

impl Strategy for Exec {
    fn kind(&self) -> &'static str {
        "exec"
    }

    fn summarize<'a>(
        &'a self,
        input: &'a StrategyInput,
    ) -> BoxFuture<'a, Result<Summary, AttemptError>> {
        self.run(input).boxed()
    }
}

#[cfg(test)]
mod tests {
    use handoff_plugin_api::{testing, Unit};

    use super::*;

    const SCHEMA: &str = include_str!("../../../docs/plugin-protocol.schema.json");

    fn input() -> StrategyInput {
        {
            let history = vec![Unit {
                messages: vec![json!({"role": "user", "content": "deploy"})],
            }];
            let mut input = testing::input(history, 8000, 800);
            input.retained_recent_messages = vec![json!({"role": "user", "content": "now"})];
            input.previous_handoff = Some("before".into());
            input.model.summary_model = "s".into();
            input.model.summary_context_window = 4000;
            input.budgets.input_budget = 7000;
            input
        }
    }

    #[test]
    fn the_request_document_has_every_field_the_schema_requires() {
        let schema: Value = serde_json::from_str(SCHEMA).unwrap();
        let document = request_document(&input());
        let request = &schema["$defs"]["request"];
        for field in request["required"].as_array().unwrap() {
            assert!(
                document.get(field.as_str().unwrap()).is_some(),
                "missing {field}"
            );
        }
        for field in request["properties"]["budgets"]["required"]
            .as_array()
            .unwrap()
        {
            assert!(
                document["budgets"].get(field.as_str().unwrap()).is_some(),
                "missing budgets.{field}"
            );
        }
        assert_eq!(
            document["version"],
            request["properties"]["version"]["const"]
        );
        assert_eq!(document["history"][0][0]["content"], "deploy");
    }

    #[tokio::test]
    async fn a_plugin_answer_becomes_the_summary_and_an_error_a_failed_attempt() {
        let echo = |answer: &str| {
            Exec::new(
                vec![
                    "sh".into(),
                    "-c".into(),
                    format!("cat > /dev/null; printf '%s' '{answer}'"),
                ],
                vec![],
                1024,
            )
        };
        let ok = echo(r#"{"summary": "from the plugin", "usage": {"prompt_tokens": 3}}"#)
            .run(&input())
            .await
            .unwrap();
        assert_eq!(ok.text, "from the plugin");
        assert_eq!(ok.usage, Some(json!({"prompt_tokens": 3})));
        let err = echo(r#"{"error": "nope"}"#)
            .run(&input())
            .await
            .unwrap_err();
        assert!(err.message.contains("nope"));
        let empty = echo(r#"{"summary": "  "}"#)
            .run(&input())
            .await
            .unwrap_err();
        assert_eq!(empty.reason, FailureReason::EmptySummary);
        let missing = Exec::new(vec!["/no/such/program".into()], vec![], 1024)
            .run(&input())
            .await
            .unwrap_err();
        assert!(missing.message.contains("cannot start"));
    }

    fn sh(script: &str, limit: usize) -> Exec {
        Exec::new(vec!["sh".into(), "-c".into(), script.into()], vec![], limit)
    }

    /// Guards against a hang only: these runs take milliseconds.
    async fn run_bounded(exec: &Exec) -> Result<Summary, AttemptError> {
        tokio::time::timeout(std::time::Duration::from_secs(20), exec.run(&input()))
            .await
            .expect("the attempt hung")
    }

    #[tokio::test]
    async fn a_chatty_plugin_is_stopped_at_its_output_limit_not_by_a_timeout() {
        let err = run_bounded(&sh("cat > /dev/null; yes handoff", 1024))
            .await
            .unwrap_err();
        assert!(
            err.message.contains("output larger than 1024"),
            "{}",
            err.message
        );
        // Megabytes on stderr are read and dropped; the answer still counts.
        let ok = run_bounded(&sh(
            r#"cat > /dev/null; head -c 8000000 /dev/zero >&2; printf '{"summary": "fine"}'"#,
            1024,
        ))
        .await
        .unwrap();
        assert_eq!(ok.text, "fine");
    }

    #[tokio::test]
    async fn what_a_plugin_forks_dies_with_it() {
        let dir = std::env::temp_dir().join(format!("handoff-exec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pid_file = dir.join("grandchild");
        let script = format!(
            r#"sleep 300 & echo $! > {}; cat > /dev/null; printf '{{"summary": "forked"}}'"#,
            pid_file.display()
        );
        let ok = run_bounded(&sh(&script, 1024)).await.unwrap();
        assert_eq!(ok.text, "forked");
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        let stat = format!("/proc/{}/stat", pid.trim());
        // Gone, or a zombie waiting for init to reap it: not running either way.
        for _ in 0..50 {
            let state = std::fs::read_to_string(&stat).unwrap_or_default();
            if state.is_empty() || state.contains(") Z") {
                let _ = std::fs::remove_dir_all(&dir);
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("the plugin's child {} survived it", pid.trim());
    }
}
