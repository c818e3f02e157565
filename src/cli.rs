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
    /// Read the log of originals (read-only; safe while the server runs).
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
}

#[derive(Subcommand)]
enum AuditCommand {
    /// One conversation per line.
    List {
        #[command(flatten)]
        config: ConfigArgs,
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
    },
    /// The originals of the latest branch (or of --branch) as a JSON array.
    Replay {
        #[command(flatten)]
        config: ConfigArgs,
        /// Conversation id.
        id: String,
        /// Digest of the branch's last message.
        #[arg(long)]
        branch: Option<String>,
    },
    /// The model view the next request would be sent with (compactions applied).
    View {
        #[command(flatten)]
        config: ConfigArgs,
        /// Conversation id.
        id: String,
    },
    /// Check JSON, digests, chain and torn lines; exits non-zero on any problem.
    Verify {
        #[command(flatten)]
        config: ConfigArgs,
        /// Conversation id; all when omitted.
        id: Option<String>,
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
    /// Upstream base URL, e.g. https://api.openai.com.
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
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(&args),
        Command::CheckConfig(args) => check_config(&args),
        Command::Audit { command } => audit(command),
    }
}

fn audit(command: AuditCommand) -> ExitCode {
    let args = match &command {
        AuditCommand::List { config, .. }
        | AuditCommand::Show { config, .. }
        | AuditCommand::Replay { config, .. }
        | AuditCommand::View { config, .. }
        | AuditCommand::Verify { config, .. } => config,
    };
    let config = match load(args) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let audit = crate::audit::Audit::new(&config.data_dir);
    let mut out = std::io::stdout().lock();
    let result = match &command {
        AuditCommand::List { json, .. } => audit.list(*json, &mut out),
        AuditCommand::Show { id, .. } => audit.show(id, &mut out),
        AuditCommand::Replay { id, branch, .. } => audit.replay(id, branch.as_deref(), &mut out),
        AuditCommand::View { id, .. } => audit.view(id, &mut out),
        AuditCommand::Verify { id, .. } => audit.verify(id.as_deref(), &mut out),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("handoff audit: {err}");
            ExitCode::FAILURE
        }
    }
}

fn load(args: &ConfigArgs) -> Result<config::Config, ExitCode> {
    config::load(&args.overrides()).map_err(|err| {
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
    crate::telemetry::init(&config.log);
    // rustls needs one process-wide crypto provider; ring is the one we build with.
    if rustls::crypto::ring::default_provider()
        .install_default()
        .is_err()
    {
        tracing::debug!("a rustls crypto provider was already installed");
    }
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
    match runtime.block_on(crate::server::serve(config, args.overrides())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = %err, "handoff stopped");
            eprintln!("handoff: {err}");
            ExitCode::FAILURE
        }
    }
}
