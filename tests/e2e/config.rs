//! `handoff check-config`: the layers, the masking, and errors that name the key.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

fn check_config(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_handoff"));
    command
        .arg("check-config")
        .args(args)
        .current_dir(dir)
        .env_remove("HANDOFF_CONFIG");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().unwrap()
}

fn effective(output: &Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn embedded_default_runs_with_no_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = effective(&check_config(dir.path(), &[], &[]));
    assert_eq!(config["listen"], "127.0.0.1:8080");
    assert_eq!(config["upstream"]["base_url"], "https://api.openai.com");
    assert_eq!(config["data_dir"], "handoff-data");
    assert_eq!(config["limits"]["max_body_bytes"], 32 * 1024 * 1024);
    assert_eq!(config["models"]["gpt-4o"]["context_window"], 128_000);
}

#[test]
fn layers_apply_weakest_first_and_secrets_are_masked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("config")).unwrap();
    std::fs::write(
        dir.path().join("config/handoff.toml"),
        "data_dir = \"from-local-file\"\n[upstream]\nbase_url = \"http://local-file:1\"\n",
    )
    .unwrap();
    let local = effective(&check_config(dir.path(), &[], &[]));
    assert_eq!(local["data_dir"], "from-local-file");
    assert_eq!(local["upstream"]["base_url"], "http://local-file:1");

    std::fs::write(
        dir.path().join("explicit.toml"),
        "[upstream]\nbase_url = \"http://explicit:2\"\n[admin]\ntoken = \"admin-secret-xyz\"\n",
    )
    .unwrap();
    let explicit = effective(&check_config(
        dir.path(),
        &["--config", "explicit.toml"],
        &[],
    ));
    assert_eq!(explicit["upstream"]["base_url"], "http://explicit:2");
    assert_eq!(
        explicit["data_dir"], "handoff-data",
        "--config replaces config/handoff.toml"
    );
    assert_eq!(explicit["admin"]["token"], "********");

    let env = [
        ("HANDOFF_UPSTREAM__BASE_URL", "http://env:3"),
        ("HANDOFF_COMPACTION__TRIGGER", "0.5"),
    ];
    let from_env = effective(&check_config(
        dir.path(),
        &["--config", "explicit.toml"],
        &env,
    ));
    assert_eq!(from_env["upstream"]["base_url"], "http://env:3");
    assert_eq!(from_env["compaction"]["trigger"], 0.5);

    let flags = effective(&check_config(
        dir.path(),
        &[
            "--config",
            "explicit.toml",
            "--upstream",
            "http://flag:4",
            "--listen",
            "127.0.0.1:9999",
        ],
        &env,
    ));
    assert_eq!(flags["upstream"]["base_url"], "http://flag:4");
    assert_eq!(flags["listen"], "127.0.0.1:9999");
    assert!(!String::from_utf8_lossy(
        &check_config(dir.path(), &["--config", "explicit.toml"], &[]).stdout
    )
    .contains("admin-secret-xyz"));
}

#[test]
fn misspelt_key_is_an_error_that_names_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.toml"), "[compaction]\ntriger = 0.8\n").unwrap();
    let output = check_config(dir.path(), &["--config", "bad.toml"], &[]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("triger"), "{stderr}");

    let output = check_config(
        dir.path(),
        &[],
        &[("HANDOFF_UPSTREM__BASE_URL", "http://x")],
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("upstrem"));
}

#[test]
fn missing_config_file_and_bad_values_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let output = check_config(dir.path(), &["--config", "nope.toml"], &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("nope.toml"));

    let output = check_config(dir.path(), &["--upstream", "ftp://x"], &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("upstream.base_url"));
}

#[test]
fn a_database_password_is_masked_in_every_form() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "postgres://handoff:pw-in-userinfo-1@db/handoff",
        "postgres://db/handoff?sslmode=require&password=pw-in-query-2",
        "host=db user=handoff password=pw-in-keyvalue-3 dbname=handoff",
    ] {
        std::fs::write(
            dir.path().join("db.toml"),
            format!("[store]\nbackend = \"postgres\"\nurl = \"{url}\"\n"),
        )
        .unwrap();
        let output = check_config(dir.path(), &["--config", "db.toml"], &[]);
        let shown = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(!shown.contains("pw-in-"), "{shown}");
        assert!(shown.contains("db"), "{shown}");
    }
}

#[test]
fn a_bad_pin_pattern_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[compaction.pin]\n[[compaction.pin.rules]]\nrole = \"user\"\npattern = \"(\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_handoff"))
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("compaction.pin.rules"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
