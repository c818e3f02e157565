//! A throwaway PostgreSQL cluster for one test: `initdb` in a temp dir, run as the
//! `postgres` user when the tests run as root, on a free loopback port, stopped when
//! dropped. The binaries come from Debian's `postgresql` package (scripts/test.sh).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A running cluster.
pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    as_root: bool,
}

fn bin_dir() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| entries.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    versions.sort();
    versions
        .pop()
        .filter(|bin| bin.join("initdb").exists())
        .expect("PostgreSQL is not installed: run scripts/test.sh (apt-get install postgresql)")
}

impl Postgres {
    /// Creates and starts a cluster with trust authentication on loopback.
    pub fn start() -> Self {
        let bin = bin_dir();
        let as_root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let dir = tempfile::tempdir().expect("tempdir");
        if as_root {
            // initdb refuses to run as root; the cluster belongs to `postgres`.
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(status.success(), "chown the cluster dir to postgres");
        }
        let mut cluster = Self {
            dir,
            bin,
            port: cluster_port(),
            as_root,
        };
        let data = cluster.data();
        let init = cluster.run(
            "initdb",
            &[
                "-D",
                &data,
                "--auth=trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        assert!(init.status.success(), "initdb: {}", text(&init));
        // A port free when it was picked can be taken before the server binds it (the
        // tests run side by side): another port, then.
        let mut started = cluster.try_ctl_start();
        for _ in 0..4 {
            match &started {
                Err(log) if log.contains("Address already in use") => {
                    cluster.port = cluster_port();
                    started = cluster.try_ctl_start();
                }
                _ => break,
            }
        }
        if let Err(log) = started {
            panic!("pg_ctl start: {log}");
        }
        cluster
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn run(&self, tool: &str, args: &[&str]) -> Output {
        let program = self.bin.join(tool);
        let mut command = if self.as_root {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            Command::new(&program)
        };
        command
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("run a PostgreSQL tool")
    }

    /// `pg_ctl start`, waiting until it accepts connections.
    pub fn ctl_start(&self) {
        if let Err(log) = self.try_ctl_start() {
            panic!("pg_ctl start: {log}");
        }
    }

    /// `pg_ctl start`; its output and the server's log when it fails.
    fn try_ctl_start(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log").display().to_string();
        let started = self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &options,
                "-l",
                &log,
                "-w",
                "start",
            ],
        );
        if started.status.success() {
            return Ok(());
        }
        Err(format!(
            "{}\n{}",
            text(&started),
            std::fs::read_to_string(&log).unwrap_or_default()
        ))
    }

    /// `pg_ctl stop -m immediate`: the database vanishes as in a crash.
    pub fn ctl_stop_immediate(&self) {
        let stopped = self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
        assert!(stopped.status.success(), "pg_ctl stop: {}", text(&stopped));
    }

    /// `pg_ctl restart -m immediate`.
    pub fn ctl_restart_immediate(&self) {
        self.ctl_stop_immediate();
        self.ctl_start();
    }

    /// The connection URL of database `postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The `[store]` section that puts a proxy on this database.
    pub fn store_toml(&self, extra: &str) -> String {
        format!(
            "[store]\nbackend = \"postgres\"\nurl = {:?}\npool_size = 4\n{extra}\n",
            self.url()
        )
    }

    /// Runs `sql` with psql; returns its unaligned, tuples-only output.
    pub fn sql(&self, sql: &str) -> String {
        let port = self.port.to_string();
        let out = self.run(
            "psql",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-At",
                "-c",
                sql,
            ],
        );
        assert!(out.status.success(), "psql {sql}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// A number that `sql` selects.
    pub fn count(&self, sql: &str) -> u64 {
        self.sql(sql).parse().expect("a number")
    }

    /// The whole database as `pg_dump` writes it.
    pub fn dump(&self) -> String {
        let port = self.port.to_string();
        let out = self.run(
            "pg_dump",
            &["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "postgres"],
        );
        assert!(out.status.success(), "pg_dump: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The cluster's folder.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self.run("pg_ctl", &["-D", &self.data(), "-m", "immediate", "stop"]);
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A free port below the kernel's ephemeral range (32768 and up on Linux), which the
/// tests' own servers and clients draw from, so they rarely take it first.
fn cluster_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    for _ in 0..100 {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        let port = 20_000 + (hasher.finish() % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    super::closed_port()
}
