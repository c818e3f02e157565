//! The `exec` middleware hook: a program in any language that stays up and answers one
//! JSON line per call (protocol version 1, `docs/plugins.md`), in the same sandbox as
//! an exec strategy: no shell, the environment cleared but for an allow-list, its own
//! process group (under the host's guard when there is one), killed whole when it
//! misbehaves or the hook is dropped.
//!
//! Calls are one at a time. A call takes the running process out of its slot and puts
//! it back only after a whole answer, so a call that errs, answers garbage, or is
//! dropped by the host's time limit drops the process, and the next call starts a
//! fresh one: no late answer is ever read as another request's.

use std::path::PathBuf;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{Hook, HookDecision, HookError, HookReply, HookRequest};
use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::Mutex;

use crate::{spawn_sandboxed, Group, PROTOCOL_VERSION};

/// Characters of one stderr line passed to the host's log.
const STDERR_LINE_SHOWN: usize = 500;

/// A hook backed by a long-running program.
pub struct ExecHook {
    command: Vec<String>,
    env: Vec<String>,
    max_output_bytes: usize,
    guard: Option<PathBuf>,
    running: Mutex<Option<Running>>,
}

/// The program, while it answers.
struct Running {
    // Dropped last: the group is killed after the pipes close.
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    _group: Group,
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    error: Option<String>,
    #[serde(flatten)]
    decision: HookDecision,
}

impl std::fmt::Debug for ExecHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecHook")
            .field("command", &self.command)
            .finish()
    }
}

impl ExecHook {
    /// `command[0]` with `command[1..]` as arguments; only the variables named in `env`
    /// are passed through; an answer line longer than `max_output_bytes` is a failure.
    pub fn new(command: Vec<String>, env: Vec<String>, max_output_bytes: usize) -> Self {
        Self {
            command,
            env,
            max_output_bytes,
            guard: None,
            running: Mutex::new(None),
        }
    }

    /// Starts the program under `guard` (see [`crate::Exec::guarded_by`]).
    pub fn guarded_by(mut self, guard: PathBuf) -> Self {
        self.guard = Some(guard);
        self
    }

    fn start(&self) -> Result<Running, HookError> {
        let program = self.command.first().map_or("", String::as_str);
        let (mut child, group) =
            spawn_sandboxed(&self.command, &self.env, self.guard.as_ref()).map_err(HookError)?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(HookError(format!("{program}: no pipes")));
        };
        let name = program.to_owned();
        // Read to its end, so a chatty hook never blocks on a full pipe.
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let shown: String = line.chars().take(STDERR_LINE_SHOWN).collect();
                tracing::info!(hook = %name, "{shown}");
            }
        });
        Ok(Running {
            _child: child,
            stdin,
            stdout: BufReader::new(stdout),
            _group: group,
        })
    }

    /// One call: `message` (the protocol's line, without its version) out, a decision in.
    async fn call(&self, mut message: serde_json::Value) -> Result<HookDecision, HookError> {
        message["version"] = json!(PROTOCOL_VERSION);
        let mut line = serde_json::to_vec(&message).map_err(|err| HookError(err.to_string()))?;
        let mut slot = self.running.lock().await;
        let mut running = match slot.take() {
            Some(running) => running,
            None => self.start()?,
        };
        line.push(b'\n');
        running
            .stdin
            .write_all(&line)
            .await
            .map_err(|err| HookError(format!("writing to the hook: {err}")))?;
        running
            .stdin
            .flush()
            .await
            .map_err(|err| HookError(format!("writing to the hook: {err}")))?;
        let mut answer = Vec::new();
        let limit = self.max_output_bytes as u64;
        let read = (&mut running.stdout)
            .take(limit + 1)
            .read_until(b'\n', &mut answer)
            .await
            .map_err(|err| HookError(format!("reading the hook's answer: {err}")))?;
        if read == 0 {
            return Err(HookError("the hook exited without answering".into()));
        }
        if answer.last() != Some(&b'\n') {
            return Err(HookError(format!(
                "the hook's answer is not one line of at most {limit} bytes"
            )));
        }
        let answer: Answer = serde_json::from_slice(&answer).map_err(|err| {
            HookError(format!("the hook's answer is not a protocol answer: {err}"))
        })?;
        if let Some(error) = answer.error {
            return Err(HookError(format!("the hook said: {error}")));
        }
        // A whole answer: the process serves the next call.
        *slot = Some(running);
        Ok(answer.decision)
    }
}

impl Hook for ExecHook {
    fn kind(&self) -> &'static str {
        "exec"
    }

    /// One process, one call at a time: the host queues the rest.
    fn concurrency(&self) -> Option<usize> {
        Some(1)
    }

    fn on_request<'a>(
        &'a self,
        request: &'a HookRequest,
    ) -> BoxFuture<'a, Result<HookDecision, HookError>> {
        self.call(json!({"hook": "on_request", "request": request}))
            .boxed()
    }

    fn on_view<'a>(
        &'a self,
        view: &'a HookRequest,
    ) -> BoxFuture<'a, Result<HookDecision, HookError>> {
        self.call(json!({"hook": "on_view", "request": view}))
            .boxed()
    }

    fn on_reply<'a>(
        &'a self,
        reply: &'a HookReply,
    ) -> BoxFuture<'a, Result<HookDecision, HookError>> {
        self.call(json!({"hook": "on_reply", "request": reply.request, "reply": reply.reply}))
            .boxed()
    }
}
