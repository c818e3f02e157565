//! Shared helpers for the integration tests: the real `handoff` binary on a random
//! loopback port, and a small HTTP client that can watch frames arrive.
// Each test file includes these helpers as its own module and uses a few of them.
#![allow(dead_code, unreachable_pub)]

pub mod client;
pub mod forms;
pub mod handles;
pub mod hop;
pub mod postgres;
pub mod scenario;
pub mod shapes;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// A running `handoff serve`; killed when dropped.
pub struct Proxy {
    child: Child,
    addr: SocketAddr,
    logs: Arc<Mutex<String>>,
    dir: tempfile::TempDir,
    config_path: PathBuf,
    data_dir: PathBuf,
}

/// How to start the proxy.
pub struct ProxyOptions {
    /// TOML appended to the generated config.
    pub extra_toml: String,
    /// `RUST_LOG` for the child.
    pub rust_log: String,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Reuse this data directory instead of a fresh one.
    pub data_dir: Option<PathBuf>,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        Self {
            extra_toml: String::new(),
            rust_log: "info,handoff=debug".into(),
            env: Vec::new(),
            data_dir: None,
        }
    }
}

impl Proxy {
    /// Starts the proxy in front of `upstream` with the defaults.
    pub fn start(upstream: &str) -> Self {
        Self::start_with(upstream, ProxyOptions::default())
    }

    /// Starts the proxy in front of `upstream` with `options`.
    pub fn start_with(upstream: &str, options: ProxyOptions) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let data_dir = options
            .data_dir
            .clone()
            .unwrap_or_else(|| dir.path().join("data"));
        let config_path = dir.path().join("handoff.toml");
        let config = render_config(upstream, &data_dir, &options.extra_toml);
        std::fs::write(&config_path, config).expect("write config");
        Self::spawn(dir, config_path, data_dir, &options)
    }

    fn spawn(
        dir: tempfile::TempDir,
        config_path: PathBuf,
        data_dir: PathBuf,
        options: &ProxyOptions,
    ) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_handoff"));
        command
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .current_dir(dir.path())
            .env("RUST_LOG", &options.rust_log)
            .env_remove("HANDOFF_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (key, value) in &options.env {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("spawn handoff");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = Arc::clone(&logs);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on http").nth(1) {
                    let addr = rest.trim_start_matches('s').trim_start_matches("://");
                    let addr: String = addr
                        .chars()
                        .take_while(|c| !c.is_whitespace() && *c != '"')
                        .collect();
                    let _ = tx.send(addr);
                }
                sink.lock().unwrap().push_str(&line);
                sink.lock().unwrap().push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(addr) => addr.parse().expect("listen address"),
            Err(_) => {
                let _ = child.kill();
                panic!("handoff did not start; logs:\n{}", logs.lock().unwrap());
            }
        };
        Self {
            child,
            addr,
            logs,
            dir,
            config_path,
            data_dir,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Everything the proxy logged so far, once lines logged before this call had time
    /// to pass the log writer's batching (10 ms; `telemetry::batch`).
    pub fn logs(&self) -> String {
        std::thread::sleep(Duration::from_millis(60));
        self.logs_now()
    }

    /// What the proxy's stderr has shown so far.
    fn logs_now(&self) -> String {
        self.logs.lock().unwrap().clone()
    }

    /// The config file in use.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// The temp folder holding config and (by default) data.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Replaces the config file (a running proxy reloads it).
    pub fn rewrite_config(&self, upstream: &str, extra: &str) {
        let text = render_config(upstream, &self.data_dir, extra);
        // Write then rename, as editors do, so the proxy never reads a half-written file.
        let temporary = self.config_path.with_extension("toml.tmp");
        std::fs::write(&temporary, text).expect("write config");
        std::fs::rename(&temporary, &self.config_path).expect("replace config");
    }

    /// Writes `text` as the config file, as is (e.g. an invalid one), by a rename: a
    /// reload already queued must never read the file truncated but not yet written.
    pub fn write_raw_config(&self, text: &str) {
        let temporary = self.config_path.with_extension("toml.tmp");
        std::fs::write(&temporary, text).expect("write config");
        std::fs::rename(&temporary, &self.config_path).expect("replace config");
    }

    /// The proxy's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the proxy with SIGKILL and waits for it, as a crash would.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends a signal (e.g. "TERM") to the proxy.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "handoff did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `handoff audit ARGS --config <this proxy's config>`.
    pub fn audit(&self, args: &[&str]) -> std::process::Output {
        self.handoff("audit", args)
    }

    /// Runs `handoff store ARGS --config <this proxy's config>`.
    pub fn store(&self, args: &[&str]) -> std::process::Output {
        self.handoff("store", args)
    }

    /// Runs `handoff VERB ARGS --config <this proxy's config>`.
    fn handoff(&self, verb: &str, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_handoff"))
            .arg(verb)
            .args(args)
            .arg("--config")
            .arg(&self.config_path)
            .current_dir(self.dir.path())
            .env_remove("HANDOFF_CONFIG")
            .output()
            .expect("run handoff")
    }

    /// Asserts that `secret` (a client's key) is in no file of the proxy's directory,
    /// the log of originals included, nor in its logs (access lines included).
    pub fn assert_secret_nowhere(&self, secret: &str) {
        let found = std::process::Command::new("grep")
            .args(["-rl", secret])
            .arg(self.dir())
            .output()
            .unwrap();
        assert!(
            found.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&found.stdout)
        );
        assert!(!self.logs().contains(secret));
    }

    /// Asserts that `audit verify ARGS` finds no problem.
    pub fn assert_verified(&self, args: &[&str]) {
        let mut all = vec!["verify"];
        all.extend_from_slice(args);
        let verify = self.audit(&all);
        assert!(
            verify.status.success(),
            "audit verify: {}",
            String::from_utf8_lossy(&verify.stdout)
        );
    }

    /// Asserts that every message in `acknowledged` is in conversation `id`'s replay,
    /// and that `audit verify` is clean: nothing a client was answered for was lost.
    pub fn assert_kept(&self, id: &str, acknowledged: &[serde_json::Value]) {
        let replayed = self.replay(id, None);
        for message in acknowledged {
            assert!(
                replayed.contains(message),
                "lost an acknowledged message: {message}"
            );
        }
        self.assert_verified(&[]);
    }

    /// `audit list --json`, parsed.
    pub fn conversations(&self) -> Vec<serde_json::Value> {
        let output = self.audit(&["list", "--json"]);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|line| serde_json::from_str(line).expect("list line is JSON"))
            .collect()
    }

    /// `audit replay ID [--branch TIP]`, parsed.
    pub fn replay(&self, id: &str, branch: Option<&str>) -> Vec<serde_json::Value> {
        let mut args = vec!["replay", id];
        if let Some(tip) = branch {
            args.extend(["--branch", tip]);
        }
        let output = self.audit(&args);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).expect("replay is JSON")
    }

    /// `audit ARGS` (a replay), each element of the array exactly as printed: the
    /// bytes the client sent, not re-serialised.
    pub fn replay_raw(&self, args: &[&str]) -> Vec<String> {
        let output = self.audit(args);
        assert!(output.status.success(), "{output:?}");
        let items: Vec<Box<serde_json::value::RawValue>> =
            serde_json::from_slice(&output.stdout).expect("replay is JSON");
        items.iter().map(|i| i.get().to_owned()).collect()
    }

    /// The data folder.
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone()
    }

    /// The folder of conversation `id` in whichever tenant holds it; a path that does
    /// not exist when none does yet.
    pub fn conversation_dir(&self, id: &str) -> PathBuf {
        let found: Vec<PathBuf> = self
            .conversation_dirs()
            .into_iter()
            .filter(|dir| dir.file_name().is_some_and(|name| name == id))
            .collect();
        assert!(
            found.len() <= 1,
            "{id} exists under several tenants: {found:?}"
        );
        found
            .into_iter()
            .next()
            .unwrap_or_else(|| self.data_dir.join("tenants/-/conversations").join(id))
    }

    /// Every conversation folder, of every tenant.
    pub fn conversation_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        for tenant in std::fs::read_dir(self.data_dir.join("tenants"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let conversations = tenant.path().join("conversations");
            for entry in std::fs::read_dir(conversations)
                .into_iter()
                .flatten()
                .flatten()
            {
                dirs.push(entry.path());
            }
        }
        dirs.sort();
        dirs
    }

    /// `GET /handoff/metrics`, as text.
    pub async fn metrics(&self) -> String {
        client::send(client::request(
            "GET",
            &format!("{}/handoff/metrics", self.url()),
            &[],
            "",
        ))
        .await
        .text()
    }

    /// Waits until the logs contain `needle`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        while !self.logs_now().contains(needle) {
            assert!(
                std::time::Instant::now() < deadline,
                "log line {needle:?} did not appear; logs:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- handoff logs ---\n{}--- end of handoff logs ---",
                self.logs()
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test config: a random port, the data folder, `extra`, and the upstream.
pub fn render_config(upstream: &str, data_dir: &Path, extra: &str) -> String {
    let config = format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = {data:?}\nshutdown_grace = \"5s\"\n\n{extra}\n",
        data = data_dir.display().to_string(),
    );
    if config.contains("[upstream]") {
        config.replacen(
            "[upstream]",
            &format!("[upstream]\nbase_url = {upstream:?}"),
            1,
        )
    } else {
        format!("{config}\n[upstream]\nbase_url = {upstream:?}\n")
    }
}

/// `value` without `null` members or empty arrays: the equality the digests use.
pub fn canonical(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !(v.is_null() || v.as_array().is_some_and(Vec::is_empty)))
                .map(|(k, v)| (k.clone(), canonical(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// Every file under `dir`, recursively, as (path, contents).
pub fn read_tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(read_tree(&path));
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path, bytes));
        }
    }
    out
}

/// A free loopback port with nothing listening on it.
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The `message` lines of a conversation's log, parsed, in file order: a run of a
/// request's messages written as one line reads as a line for each, as handoff reads it.
pub fn message_lines(proxy: &Proxy, id: &str) -> Vec<serde_json::Value> {
    let path = proxy.conversation_dir(id).join("messages.jsonl");
    let mut lines = Vec::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let _ = handoff::store::line::Line::parse_into(line.as_bytes(), &mut lines);
    }
    lines
        .iter()
        .filter_map(|line| serde_json::to_value(line).ok())
        .filter(|line| line["kind"] == "message")
        .collect()
}

/// The proxy's access log lines so far.
pub fn access_lines(proxy: &Proxy) -> Vec<String> {
    proxy
        .logs()
        .lines()
        .filter(|line| line.contains("handoff::access"))
        .map(str::to_owned)
        .collect()
}

/// The access lines of requests handoff answered with a 4xx or 5xx.
pub fn refused_lines(proxy: &Proxy) -> Vec<String> {
    access_lines(proxy)
        .into_iter()
        .filter(|l| l.contains("status=4") || l.contains("status=5"))
        .collect()
}

/// Waits for a real client, killing it after `limit`. Its output is read while it
/// runs: an agent that prints every file it reads would block on a full pipe.
pub fn wait_bounded(
    mut child: std::process::Child,
    limit: std::time::Duration,
) -> std::process::Output {
    use std::io::Read;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut out);
            }
            out
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}
