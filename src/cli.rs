//! The `handoff` command line: serve, check-config, audit. The binary is this module's
//! [`main`]; a binary that registers extra strategy kinds calls it too.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::{self, Overrides};
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "handoff",
    version,
    about = "A compacting proxy for LLM chat-completion APIs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy.
    Serve(ConfigArgs),
    /// Print the effective config, secrets masked, and exit.
    CheckConfig(ConfigArgs),
    /// Read the log of originals (safe while the server runs); erase and hold change it.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Manage the store of originals.
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// Replay recorded conversations through compaction offline, to choose a strategy
    /// on data; writes nothing into the data dir.
    Eval(EvalArgs),
}

#[derive(Args)]
struct EvalArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// A conversation of the data dir to replay (repeatable); all when omitted.
    #[arg(long = "conversation", value_name = "ID")]
    conversations: Vec<String>,
    /// A JSON conversation file (`{"tools", "messages"}`) to replay (repeatable).
    #[arg(long = "file", value_name = "FILE")]
    files: Vec<PathBuf>,
    /// The strategy chain, e.g. summarize,extract; the config's when omitted.
    #[arg(long, value_delimiter = ',')]
    chain: Option<Vec<String>>,
    /// The context window of the replayed models, in tokens.
    #[arg(long)]
    window: Option<u64>,
    /// The model that writes summaries.
    #[arg(long)]
    summary_model: Option<String>,
    /// The summary model's own context window, in tokens; --window when omitted.
    #[arg(long)]
    summary_window: Option<u64>,
    /// Facts to look for, as a regex: recall is the share of its matches in the
    /// originals still in the final view.
    #[arg(long)]
    probe: Option<String>,
    /// The model named in requests replayed from files.
    #[arg(long, default_value = "gpt-4o")]
    file_model: String,
    /// One JSON document instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum AuditCommand {
    /// One conversation per line.
    List {
        #[command(flatten)]
        config: ConfigArgs,
        /// Only this tenant's conversations.
        #[arg(long)]
        tenant: Option<String>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// A readable timeline of one conversation.
    Show {
        #[command(flatten)]
        config: ConfigArgs,
        /// Conversation id.
        id: String,
        /// Its tenant; needed only when the id exists under several.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// A request exactly as the client sent it, then its reply, as a JSON array: the
    /// latest branch's last request, or --request N, or the last on --branch.
    Replay {
        #[command(flatten)]
        config: ConfigArgs,
        /// Conversation id.
        id: String,
        /// Its tenant; needed only when the id exists under several.
        #[arg(long)]
        tenant: Option<String>,
        /// Digest of the branch's last message.
        #[arg(long, conflicts_with = "request")]
        branch: Option<String>,
        /// The request's number, from 1, as `audit show` numbers them.
        #[arg(long, value_name = "N")]
        request: Option<usize>,
    },
    /// The model view the next request would be sent with (compactions applied).
    View {
        #[command(flatten)]
        config: ConfigArgs,
        /// Conversation id.
        id: String,
        /// Its tenant; needed only when the id exists under several.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Erase a conversation, a tenant, or a proxy key's tenant, as a deletion request
    /// asks: originals, records and indexes, from the store and the caches; writes a
    /// tombstone. Held conversations are left (exit 3).
    Erase {
        #[command(flatten)]
        config: ConfigArgs,
        /// One conversation.
        #[arg(long, conflicts_with = "key")]
        conversation: Option<String>,
        /// Every conversation of this tenant; with --conversation, the tenant of an id
        /// several tenants have.
        #[arg(long)]
        tenant: Option<String>,
        /// Every conversation of this proxy key's tenant.
        #[arg(long, conflicts_with_all = ["conversation", "tenant"])]
        key: Option<String>,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Keep a conversation from retention until released.
    Hold {
        #[command(flatten)]
        config: ConfigArgs,
        /// Conversation id.
        id: String,
        /// Its tenant; needed only when the id exists under several.
        #[arg(long)]
        tenant: Option<String>,
        /// Lift the hold.
        #[arg(long)]
        release: bool,
        /// Why, kept with the hold.
        #[arg(long)]
        reason: Option<String>,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Check JSON, digests, chain and torn lines; exits non-zero on any problem.
    Verify {
        #[command(flatten)]
        config: ConfigArgs,
        /// Conversation id; all when omitted.
        id: Option<String>,
        /// Its tenant; needed only when the id exists under several.
        #[arg(long)]
        tenant: Option<String>,
    },
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Remove conversations whose last request is older than their retention
    /// (store.retention and its overrides) or --older-than; held ones stay.
    Prune {
        #[command(flatten)]
        config: ConfigArgs,
        /// One age for every tenant, e.g. 90d.
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Option<std::time::Duration>,
        /// Only this tenant's conversations.
        #[arg(long)]
        tenant: Option<String>,
        /// List what would go; remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Conversations, requests and bytes (raw and on disk) per tenant.
    Stats {
        #[command(flatten)]
        config: ConfigArgs,
        /// Only this tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Copy a disk data dir into the postgres store of a config; run it again to
    /// finish an interrupted copy (conversations already there are left alone).
    Copy {
        /// The data dir to read.
        #[arg(long, value_name = "DIR")]
        from_data_dir: PathBuf,
        /// A config whose [store] is the postgres backend to write.
        #[arg(long, value_name = "FILE")]
        to_config: PathBuf,
        /// Copy conversations whose logs do not verify, without their unreadable
        /// lines; by default such a log stops the copy before anything is written.
        #[arg(long)]
        allow_problems: bool,
    },
}

#[derive(Args, Clone)]
struct ConfigArgs {
    /// Config file; replaces config/handoff.toml.
    #[arg(long, env = "HANDOFF_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:8080.
    #[arg(long)]
    listen: Option<String>,
    /// Upstream base URL, e.g. `https://api.openai.com`.
    #[arg(long)]
    upstream: Option<String>,
    /// Folder for conversation logs.
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

impl ConfigArgs {
    fn overrides(&self) -> Overrides {
        Overrides {
            config_file: self.config.clone(),
            listen: self.listen.clone(),
            upstream: self.upstream.clone(),
            data_dir: self.data_dir.clone(),
        }
    }
}

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() == Some(std::ffi::OsStr::new(handoff_strategy_exec::GUARD_ARG)) {
        // This process stands between a handoff and an exec plugin (strategies.rs).
        let code = handoff_strategy_exec::guard_main(args.collect());
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    if let Ok(binary) = std::env::current_exe() {
        crate::plugins::guard_exec_with(binary);
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(&args),
        Command::CheckConfig(args) => check_config(&args),
        Command::Audit { command } => audit(command),
        Command::Eval(args) => eval(args),
        Command::Store { command } => store(command),
    }
}

fn store(command: StoreCommand) -> ExitCode {
    use crate::tools::upkeep::command::Ask;
    let (from_data_dir, to_config, allow_problems) = match command {
        StoreCommand::Copy {
            from_data_dir,
            to_config,
            allow_problems,
        } => (from_data_dir, to_config, allow_problems),
        StoreCommand::Prune {
            config,
            older_than,
            tenant,
            dry_run,
            json,
        } => {
            let ask = Ask::Prune {
                older_than,
                tenant,
                dry_run,
            };
            return upkeep(&config, &ask, json);
        }
        StoreCommand::Stats {
            config,
            tenant,
            json,
        } => return upkeep(&config, &Ask::Stats { tenant }, json),
    };
    let config = match load(&ConfigArgs {
        config: Some(to_config),
        listen: None,
        upstream: None,
        data_dir: None,
    }) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let Some(url) = config
        .store
        .url
        .as_deref()
        .filter(|_| config.store.backend == config::StoreBackend::Postgres)
    else {
        eprintln!(
            "handoff store copy: --to-config must set [store] backend = \"postgres\" and a url"
        );
        return ExitCode::from(2);
    };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let copied = runtime.block_on(async {
        let store = crate::store::PgStore::connect(url, config.store.pool_size).await?;
        let verify = |log: &crate::store::ConversationLog| {
            let mut problems = crate::audit::verify_log(log);
            problems.extend(crate::adoption::compaction_problems(log));
            problems
        };
        let unverified = if allow_problems {
            crate::store::Unverified::Copy
        } else {
            crate::store::Unverified::Refuse
        };
        crate::store::copy_data_dir(&from_data_dir, &store, &verify, unverified).await
    });
    match copied {
        Ok(report) => {
            println!(
                "copied {} conversation(s) ({} lines, {} compactions); {} already present; {} that did not verify, {} unreadable line(s) skipped",
                report.copied, report.lines, report.records, report.present, report.unverified, report.skipped_lines
            );
            if !report.same_secret {
                eprintln!("warning: the database already had another tenant secret: conversations of callers without a proxy key will be under new tenants");
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("handoff store copy: {err}");
            ExitCode::FAILURE
        }
    }
}

fn eval(args: EvalArgs) -> ExitCode {
    let config = match load(&args.config) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let probe = match args.probe.as_deref().map(regex::Regex::new).transpose() {
        Ok(probe) => probe,
        Err(err) => {
            eprintln!("handoff eval: --probe: {err}");
            return ExitCode::from(2);
        }
    };
    let options = crate::tools::eval::EvalOptions {
        // --data-dir (or the config's data_dir) is read only when named explicitly or
        // when no file is given.
        data_dir: (args.config.data_dir.is_some() || args.files.is_empty())
            .then(|| config.data_dir.clone()),
        conversations: args.conversations,
        files: args.files,
        chain: args.chain,
        window: args.window,
        summary_model: args.summary_model,
        summary_window: args.summary_window,
        upstream: args.config.upstream.clone(),
        probe,
        file_model: args.file_model,
    };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let replays = match crate::tools::eval::load(&options) {
        Ok(replays) => replays,
        Err(err) => {
            eprintln!("handoff eval: {err}");
            return ExitCode::FAILURE;
        }
    };
    let steps: usize = replays.iter().map(|r| r.steps.len()).sum();
    let bar = progress_bar(steps as u64);
    let tick = || bar.inc(1);
    let reports = runtime.block_on(crate::tools::eval::evaluate(
        config, &options, &replays, &tick,
    ));
    bar.finish_and_clear();
    let reports = match reports {
        Ok(reports) => reports,
        Err(err) => {
            eprintln!("handoff eval: {err}");
            return ExitCode::FAILURE;
        }
    };
    match crate::tools::eval::write_report(&reports, args.json, &mut std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("handoff eval: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The multi-threaded runtime, with rustls's process-wide crypto provider installed
/// (ring, the one we build with).
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    built(&mut tokio::runtime::Builder::new_multi_thread())
}

/// Worker 0's runtime: a current-thread one, like every worker's ([`crate::server`]).
fn worker_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    built(&mut tokio::runtime::Builder::new_current_thread())
}

/// `builder`'s runtime with every driver, after installing the crypto provider.
fn built(builder: &mut tokio::runtime::Builder) -> Result<tokio::runtime::Runtime, ExitCode> {
    install_crypto_provider();
    builder.enable_all().build().map_err(|err| {
        eprintln!("handoff: cannot start the runtime: {err}");
        ExitCode::FAILURE
    })
}

/// rustls's process-wide crypto provider: ring, the one we build with.
fn install_crypto_provider() {
    if rustls::crypto::ring::default_provider()
        .install_default()
        .is_err()
    {
        tracing::debug!("a rustls crypto provider was already installed");
    }
}

/// A progress bar on stderr, drawn only when stderr is a terminal.
fn progress_bar(length: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(length);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{bar:40} {pos}/{len} requests, {elapsed} ({eta} left)",
    ) {
        bar.set_style(style);
    }
    bar
}

/// Runs an upkeep command with the config of `args`.
fn upkeep(args: &ConfigArgs, ask: &crate::tools::upkeep::command::Ask, json: bool) -> ExitCode {
    match load(args) {
        Ok(config) => {
            install_crypto_provider();
            crate::tools::upkeep::command::run(&config, ask, json)
        }
        Err(code) => code,
    }
}

fn audit(command: AuditCommand) -> ExitCode {
    use crate::tools::upkeep::command::Ask;
    let command = match command {
        AuditCommand::Erase {
            config,
            conversation,
            tenant,
            key,
            json,
        } => {
            let ask = Ask::Erase {
                conversation,
                tenant,
                key,
            };
            return upkeep(&config, &ask, json);
        }
        AuditCommand::Hold {
            config,
            id,
            tenant,
            release,
            reason,
            json,
        } => {
            let ask = Ask::Hold {
                id,
                tenant,
                release,
                reason,
            };
            return upkeep(&config, &ask, json);
        }
        other => other,
    };
    let args = match &command {
        AuditCommand::List { config, .. }
        | AuditCommand::Show { config, .. }
        | AuditCommand::Replay { config, .. }
        | AuditCommand::View { config, .. }
        | AuditCommand::Verify { config, .. } => config,
        AuditCommand::Erase { config, .. } | AuditCommand::Hold { config, .. } => config,
    };
    let config = match load(args) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let store = match runtime.block_on(crate::store::open(
        &config.store,
        &config.data_dir,
        Default::default(),
    )) {
        Ok(opened) => opened.store,
        Err(err) => {
            eprintln!("handoff audit: {err}");
            return ExitCode::FAILURE;
        }
    };
    let audit =
        crate::audit::Audit::new(store, runtime.handle().clone()).priced(config.prices.clone());
    let mut out = std::io::stdout().lock();
    let result = match &command {
        AuditCommand::List { json, tenant, .. } => audit.list(tenant.as_deref(), *json, &mut out),
        AuditCommand::Show { id, tenant, .. } => audit.show(id, tenant.as_deref(), &mut out),
        AuditCommand::Replay {
            id,
            tenant,
            branch,
            request,
            ..
        } => audit.replay(
            id,
            tenant.as_deref(),
            branch.as_deref(),
            *request,
            &mut out,
            &mut std::io::stderr(),
        ),
        AuditCommand::View { id, tenant, .. } => audit.view(id, tenant.as_deref(), &mut out),
        AuditCommand::Verify { id, tenant, .. } => {
            audit.verify(id.as_deref(), tenant.as_deref(), &mut out)
        }
        AuditCommand::Erase { .. } | AuditCommand::Hold { .. } => Ok(()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `handoff audit list | head`: the reader has what it wanted; stop quietly.
        Err(err) if err.is_broken_pipe() => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("handoff audit: {err}");
            ExitCode::FAILURE
        }
    }
}

fn load(args: &ConfigArgs) -> Result<config::Config, ExitCode> {
    crate::settings::load(&args.overrides()).map_err(|err| {
        eprintln!("handoff: {err}");
        ExitCode::from(2)
    })
}

fn check_config(args: &ConfigArgs) -> ExitCode {
    let config = match load(args) {
        Ok(config) => config,
        Err(code) => return code,
    };
    match serde_json::to_string_pretty(&config::masked(&config)) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("handoff: cannot print config: {err}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: &ConfigArgs) -> ExitCode {
    let config = match load(args) {
        Ok(config) => config,
        Err(code) => return code,
    };
    if let Err(err) = config::check_serve(&config) {
        eprintln!("handoff: {err}");
        return ExitCode::from(2);
    }
    let _log = crate::telemetry::init(&config.log);
    // N workers (one per core by default): N threads, each its own current-thread
    // runtime and listener (crate::server); 0: one work-stealing runtime.
    let runtime = match config.workers.threads() {
        None => {
            // tokio's default for the work-stealing runtime: a thread per core.
            crate::worker::set_stealing(config::cores());
            runtime()
        }
        Some(count) => {
            crate::worker::set_count(count);
            worker_runtime()
        }
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(crate::server::serve(config, args.overrides())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = %err, "handoff stopped");
            eprintln!("handoff: {err}");
            ExitCode::FAILURE
        }
    }
}
