//! `handoff audit erase`, `handoff audit hold`, `handoff store prune` and
//! `handoff store stats`.
//!
//! A disk data dir has one writer: while `serve` holds it, a command that changes it is
//! sent to that server's admin API (on loopback, with `admin.token` when set), so its
//! caches forget what goes too. Without a server, the command takes the data dir's lock
//! and changes it itself. A shared database is changed directly: the replicas follow
//! the tombstones.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::Value;

use super::{erase, prune, Policy, PruneOptions, Target};
use crate::config::{Config, StoreBackend};
use crate::store::{resolve_in, DataDirLock, Hold, LockError, Store};
use crate::tenant::TenantId;

/// What an upkeep command asks for.
#[derive(Debug, Clone)]
pub(crate) enum Ask {
    /// Erase a conversation (with its tenant when ambiguous), a tenant or a key's tenant.
    Erase {
        /// `--conversation`.
        conversation: Option<String>,
        /// `--tenant`.
        tenant: Option<String>,
        /// `--key`.
        key: Option<String>,
    },
    /// Put a hold on a conversation, or lift it.
    Hold {
        /// The conversation.
        id: String,
        /// Its tenant when ambiguous.
        tenant: Option<String>,
        /// Lift instead.
        release: bool,
        /// Why, for the record.
        reason: Option<String>,
    },
    /// Prune by age.
    Prune {
        /// One age for every tenant.
        older_than: Option<Duration>,
        /// One tenant only.
        tenant: Option<String>,
        /// Change nothing.
        dry_run: bool,
    },
    /// Sizes per tenant.
    Stats {
        /// One tenant only.
        tenant: Option<String>,
    },
}

impl Ask {
    /// True when it changes the store.
    fn writes(&self) -> bool {
        match self {
            Self::Prune { dry_run, .. } => !dry_run,
            Self::Stats { .. } => false,
            Self::Erase { .. } | Self::Hold { .. } => true,
        }
    }

    /// The admin API request that does the same: method, path and query.
    fn as_request(&self) -> (http::Method, String) {
        let mut query = Vec::new();
        let mut push = |name: &str, value: &Option<String>| {
            if let Some(value) = value {
                query.push(format!("{name}={value}"));
            }
        };
        let (method, path) = match self {
            Self::Erase {
                conversation,
                tenant,
                key,
            } => {
                push("conversation", conversation);
                push("tenant", tenant);
                push("key", key);
                (http::Method::POST, "/handoff/erase".to_owned())
            }
            Self::Hold {
                id,
                tenant,
                release,
                reason,
            } => {
                push("tenant", tenant);
                push("reason", &reason.as_ref().map(|r| percent_encode(r)));
                let method = if *release {
                    http::Method::DELETE
                } else {
                    http::Method::POST
                };
                (method, format!("/handoff/conversations/{id}/hold"))
            }
            Self::Prune {
                older_than,
                tenant,
                dry_run,
            } => {
                push(
                    "older_than",
                    &older_than.map(|d| humantime::format_duration(d).to_string().replace(' ', "")),
                );
                push("tenant", tenant);
                push("dry_run", &dry_run.then(|| "true".to_owned()));
                (http::Method::POST, "/handoff/store/prune".to_owned())
            }
            Self::Stats { tenant } => {
                push("tenant", tenant);
                (http::Method::GET, "/handoff/store/stats".to_owned())
            }
        };
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        };
        (method, format!("{path}{query}"))
    }
}

fn percent_encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Who is asking, for holds and tombstones.
fn who() -> String {
    format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    )
}

/// Runs `ask` against the store of `config`, printing JSON or a table.
pub(crate) fn run(config: &Config, ask: &Ask, json: bool) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("handoff: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let disk = config.store.backend == StoreBackend::Disk;
    // Held for the command's life: no serve starts on the data dir meanwhile.
    let mut _lock = None;
    if disk && ask.writes() {
        match DataDirLock::acquire(&config.data_dir) {
            Ok(lock) => _lock = Some(lock),
            Err(LockError::Held { listening, .. }) => {
                let at = listening.unwrap_or_else(|| format!("http://{}", config.listen));
                return print(runtime.block_on(forward(config, &at, ask)), json);
            }
            Err(err) => {
                eprintln!("handoff: {err}");
                return ExitCode::FAILURE;
            }
        }
    }
    let answer = runtime.block_on(async {
        let opened = crate::store::open(&config.store, &config.data_dir, Arc::default())
            .await
            .map_err(|err| err.to_string())?;
        if _lock.is_some() {
            // Nothing else reads the data dir: what a crash left in upkeep/ can go.
            opened.store.sweep(true).await.map_err(|e| e.to_string())?;
        }
        local(config, &opened.store, ask).await
    });
    print(answer, json)
}

/// Does `ask` on `store` in this process.
async fn local(config: &Config, store: &Arc<dyn Store>, ask: &Ask) -> Result<Value, String> {
    let by = who();
    let tenant_of = |t: &Option<String>| {
        t.as_deref()
            .map(TenantId::parse)
            .transpose()
            .map_err(|e| e.to_string())
    };
    match ask {
        Ask::Erase {
            conversation,
            tenant,
            key,
        } => {
            let target = match (conversation, tenant, key) {
                (Some(id), tenant, None) => Target::Conversation(
                    resolve_in(store.as_ref(), id, tenant.as_deref())
                        .await
                        .map_err(|e| e.to_string())?,
                ),
                (None, Some(tenant), None) => {
                    Target::Tenant(TenantId::parse(tenant).map_err(|e| e.to_string())?)
                }
                (None, None, Some(key)) => {
                    if !config.auth.keys.iter().any(|k| &k.name == key) {
                        return Err(format!("no [[auth.keys]] entry is named {key:?}"));
                    }
                    Target::Tenant(TenantId::parse(key).map_err(|e| e.to_string())?)
                }
                _ => return Err("name one of --conversation ID, --tenant T or --key NAME".into()),
            };
            let report = erase(store, None, &target, &by)
                .await
                .map_err(|e| e.to_string())?;
            Ok(serde_json::json!(report))
        }
        Ask::Hold {
            id,
            tenant,
            release,
            reason,
        } => {
            let id = resolve_in(store.as_ref(), id, tenant.as_deref())
                .await
                .map_err(|e| e.to_string())?;
            let hold = (!release).then(|| Hold {
                at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
                by,
                reason: reason.clone(),
            });
            if !store.set_hold(&id, hold).await.map_err(|e| e.to_string())? {
                return Err(format!("no conversation {id}"));
            }
            Ok(
                serde_json::json!({"conversation": id.as_str(), "tenant": id.tenant().as_str(), "held": !release}),
            )
        }
        Ask::Prune {
            older_than,
            tenant,
            dry_run,
        } => {
            let options = PruneOptions {
                older_than: *older_than,
                tenant: tenant_of(tenant)?,
                dry_run: *dry_run,
                paced: false,
            };
            let report = prune(store, None, &Policy::of(config), &options, &by)
                .await
                .map_err(|e| e.to_string())?;
            Ok(serde_json::json!(report))
        }
        Ask::Stats { tenant } => {
            let stats = store
                .stats(tenant_of(tenant)?)
                .await
                .map_err(|e| e.to_string())?;
            Ok(serde_json::json!({"tenants": stats}))
        }
    }
}

/// Sends `ask` to the admin API of the server at `at` that holds the data dir, on
/// loopback.
async fn forward(config: &Config, at: &str, ask: &Ask) -> Result<Value, String> {
    let Some(address) = at.strip_prefix("http://") else {
        return Err(format!(
            "a handoff serve holds {} and listens at {at}: call its admin API (docs/operations.md, \"Retention, erasure and disk\")",
            config.data_dir.display()
        ));
    };
    let address: std::net::SocketAddr = address.parse().map_err(|e| format!("{at}: {e}"))?;
    let port = address.port();
    let host = if address.is_ipv6() {
        format!("[::1]:{port}")
    } else {
        format!("127.0.0.1:{port}")
    };
    let (method, path) = ask.as_request();
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("http://{host}{path}"))
        .header(http::header::HOST, format!("localhost:{port}"));
    if let Some(token) = &config.admin.token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let response = client.request(request).await.map_err(|e| {
        format!(
            "a handoff serve holds the data dir, and its admin API at {host} did not answer: {e}"
        )
    })?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let value: Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    if !status.is_success() {
        let message = value
            .pointer("/error/message")
            .and_then(Value::as_str)
            .map_or_else(|| value.to_string(), str::to_owned);
        return Err(format!("the running server answered {status}: {message}"));
    }
    Ok(value)
}

fn print(answer: Result<Value, String>, json: bool) -> ExitCode {
    let value = match answer {
        Ok(value) => value,
        Err(err) => {
            eprintln!("handoff: {err}");
            return ExitCode::FAILURE;
        }
    };
    if json {
        println!("{value}");
    } else {
        print_table(&value);
    }
    // Held conversations an erasure left are not an erasure done.
    let held = value
        .get("held")
        .and_then(Value::as_array)
        .is_some_and(|held| !held.is_empty());
    if held && value.get("erased").is_some() {
        return ExitCode::from(3);
    }
    ExitCode::SUCCESS
}

fn print_table(value: &Value) {
    let list = |key: &str| -> Vec<String> {
        value
            .get(key)
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .map(|item| {
                        item.as_str()
                            .map_or_else(|| item.to_string(), str::to_owned)
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let number = |key: &str| value.get(key).and_then(Value::as_u64).unwrap_or(0);
    if let Some(tenants) = value.get("tenants").and_then(Value::as_array) {
        println!(
            "{:<24} {:>13} {:>10} {:>6} {:>10} {:>14} {:>14}",
            "tenant",
            "conversations",
            "compressed",
            "held",
            "requests",
            "bytes raw",
            "bytes stored"
        );
        for t in tenants {
            let n = |k: &str| t.get(k).and_then(Value::as_u64).unwrap_or(0);
            println!(
                "{:<24} {:>13} {:>10} {:>6} {:>10} {:>14} {:>14}",
                t.get("tenant").and_then(Value::as_str).unwrap_or("?"),
                n("conversations"),
                n("compressed"),
                n("held"),
                n("requests"),
                n("bytes_raw"),
                n("bytes_stored")
            );
        }
    } else if value.get("erased").is_some() {
        let erased = list("erased");
        println!(
            "erased {} conversation(s) of tenant {} ({} bytes); tombstone written",
            erased.len(),
            value.get("tenant").and_then(Value::as_str).unwrap_or("?"),
            number("bytes")
        );
        for held in list("held") {
            println!("held, not erased (lift the hold first): {held}");
        }
    } else if let Some(pruned) = value.get("pruned").and_then(Value::as_array) {
        let verb = if value.get("dry_run") == Some(&Value::Bool(true)) {
            "would prune"
        } else {
            "pruned"
        };
        for p in pruned {
            println!(
                "{verb} {}/{} (last written {})",
                p.get("tenant").and_then(Value::as_str).unwrap_or("?"),
                p.get("conversation").and_then(Value::as_str).unwrap_or("?"),
                p.get("last").and_then(Value::as_str).unwrap_or("?")
            );
        }
        println!(
            "{verb} {} conversation(s), {} bytes; {} held, {} written since",
            pruned.len(),
            number("bytes"),
            list("held").len(),
            number("active")
        );
    } else {
        println!("{value}");
    }
}
