//! The native llama.cpp build the benchmark compares with: where its binaries are, and
//! what it is (version, commit, cmake flags from `build-info.txt`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Serialize;

/// A llama.cpp build.
#[derive(Debug, Clone, Serialize)]
pub struct LlamaCpp {
    /// Folder holding `llama-server` and `llama-bench`.
    pub bin_dir: PathBuf,
    /// How the folder was found.
    pub found_by: String,
    /// `build-info.txt` (written by `scripts/llamacpp.sh`: source, version, commit,
    /// compiler, cmake flags), the nearest one in the folder or above it.
    pub build_info_path: Option<PathBuf>,
    pub build_info: Option<String>,
    /// `llama-server --version`.
    pub server_version: String,
}

impl LlamaCpp {
    /// `bin_dir` when given, else the folder `scripts/llamacpp.sh bin llama-server
    /// llama-bench` prints (that script builds llama.cpp first when it is missing, about
    /// 15 minutes on 2 cores).
    pub fn locate(root: &Path, bin_dir: Option<PathBuf>) -> Result<Self> {
        Self::locate_tools(root, bin_dir, &["llama-server", "llama-bench"])
    }

    /// As [`Self::locate`], for the named tools only (`scripts/llamacpp.sh bin TOOL...`
    /// builds just those when they are missing); `llama-server` must be among them.
    pub fn locate_tools(root: &Path, bin_dir: Option<PathBuf>, tools: &[&str]) -> Result<Self> {
        let (bin_dir, found_by) = match bin_dir {
            Some(d) => (d, "--llama-bin".to_owned()),
            None => {
                let script = root.join("scripts/llamacpp.sh");
                eprintln!(
                    "inferd-bench: llama.cpp: {} bin {}",
                    script.display(),
                    tools.join(" ")
                );
                let out = Command::new("bash")
                    .arg(&script)
                    .arg("bin")
                    .args(tools)
                    .current_dir(root)
                    .output()
                    .with_context(|| format!("cannot run {}", script.display()))?;
                if !out.status.success() {
                    bail!(
                        "{} bin failed ({}): {}",
                        script.display(),
                        out.status,
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                }
                let stdout = String::from_utf8_lossy(&out.stdout);
                let dir = stdout.lines().last().unwrap_or("").trim().to_owned();
                (PathBuf::from(dir), "scripts/llamacpp.sh bin".to_owned())
            }
        };
        for tool in tools {
            if !bin_dir.join(tool).is_file() {
                bail!("{} has no {tool} (pass --llama-bin DIR)", bin_dir.display());
            }
        }
        let build_info_path = bin_dir
            .ancestors()
            .map(|d| d.join("build-info.txt"))
            .find(|p| p.is_file());
        let build_info = build_info_path
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map(|s| s.trim().to_owned());
        let server_version = Command::new(bin_dir.join("llama-server"))
            .arg("--version")
            .output()
            .map(|o| {
                let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
                text.push_str(&String::from_utf8_lossy(&o.stderr));
                text.lines()
                    .filter(|l| l.contains("version") || l.contains("built with"))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_else(|e| format!("(cannot run llama-server --version: {e})"));
        Ok(LlamaCpp {
            bin_dir,
            found_by,
            build_info_path,
            build_info,
            server_version,
        })
    }

    /// A binary of the build.
    pub fn tool(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }
}
