//! `inferd`: the daemon binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use inferd::config::{CliOverrides, Settings};

/// inferd: a local LLM inference daemon streaming tokens over WebSocket.
#[derive(Debug, Parser)]
#[command(name = "inferd", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load the model and serve `ws://ADDR/v1/ws` until SIGINT/SIGTERM.
    Serve {
        /// TOML config file (layers: defaults < file < INFERD__SECTION__KEY env < flags).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// GGUF model file (overrides model.path).
        #[arg(long, value_name = "PATH")]
        model: Option<PathBuf>,
        /// Listen address host:port (overrides server.listen); port 0 picks a free one.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve {
            config,
            model,
            listen,
        } => {
            let settings = match Settings::load(config.as_deref(), &CliOverrides { model, listen })
            {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("inferd: {e}");
                    return ExitCode::from(2);
                }
            };
            if let Err(e) = inferd::telemetry::init(&settings.log.level) {
                eprintln!("inferd: configuration error: {e}");
                return ExitCode::from(2);
            }
            match inferd::app::run(settings) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("inferd: error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
