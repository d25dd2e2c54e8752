//! `inferd`: the daemon binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use inferd::config::CliOverrides;

/// jemalloc with the `jemalloc` feature (off by default: it held RSS flat under the soak
/// but cost decode and prefill speed on this machine; docs/performance.md, section
/// Soak).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The default on Linux: the C library's malloc for small allocations, trimmed every
/// [`inferd::allocator::TRIM_PERIOD`], and mappings of their own, reused, for those of
/// 128 KiB and more (`inferd::allocator::large`).
#[cfg(all(not(feature = "jemalloc"), target_os = "linux"))]
#[global_allocator]
static GLOBAL: inferd::allocator::large::LargeFirst = inferd::allocator::large::LargeFirst;

/// inferd: a local LLM inference daemon streaming tokens over WebSocket.
#[derive(Debug, Parser)]
#[command(name = "inferd", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load the model and serve HTTP and `ws://ADDR/v1/ws` until SIGINT/SIGTERM
    /// (SIGHUP reloads the config file and the plugin directory).
    Serve {
        /// TOML config file (layers: defaults < file < INFERD__SECTION__KEY env < flags).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// GGUF model file or Hugging Face checkpoint directory (overrides model.path).
        #[arg(long, value_name = "PATH")]
        model: Option<PathBuf>,
        /// A vision projector GGUF for a GGUF model, llama.cpp's mmproj file (overrides
        /// model.mmproj).
        #[arg(long, value_name = "FILE")]
        mmproj: Option<PathBuf>,
        /// Listen address host:port (overrides server.listen); port 0 picks a free one.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// A LoRA adapter to serve, NAME=PATH (a PEFT directory or a GGUF adapter);
        /// repeatable; requests choose it with `model: NAME` (adds to lora.adapters).
        #[arg(long = "lora-modules", value_name = "NAME=PATH", value_parser = parse_lora_module)]
        lora_modules: Vec<(String, PathBuf)>,
    },
}

/// `NAME=PATH` of `--lora-modules`.
fn parse_lora_module(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_string(), PathBuf::from(path)))
        }
        _ => Err(format!("expected NAME=PATH (got {s:?})")),
    }
}

fn main() -> ExitCode {
    // Before any other thread exists (allocator::bound_arenas).
    inferd::allocator::bound_arenas();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve {
            config,
            model,
            mmproj,
            listen,
            lora_modules,
        } => {
            let source = inferd::app::SettingsSource {
                file: config,
                cli: CliOverrides {
                    model,
                    listen,
                    mmproj,
                    lora_modules,
                },
            };
            let settings = match source.load() {
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
            inferd::allocator::spawn_trimmer();
            match inferd::app::run(settings, source) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("inferd: error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
