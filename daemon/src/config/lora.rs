//! `[lora]`: LoRA adapters served over the base model (`crate::adapters`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{whole_number, ConfigError};

/// Most adapters `max_loras` may keep resident.
pub const MAX_MAX_LORAS: usize = 256;
/// Largest `max_rank`.
pub const MAX_MAX_RANK: usize = 4096;

/// `[lora]` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraConfig {
    /// `NAME = PATH`: adapters loaded at start (and on SIGHUP, which adds, replaces
    /// and removes them to match): a PEFT directory (`adapter_config.json` +
    /// `adapter_model.safetensors`) or a llama.cpp GGUF adapter. Requests name one in
    /// OpenAI `model` or the WebSocket's `adapter`. `inferd serve --lora-modules
    /// NAME=PATH` adds to these.
    pub adapters: BTreeMap<String, PathBuf>,
    /// Adapters resident at once, in `[1, 256]`: a request for another waits until an
    /// idle one is evicted (least recently used) and its adapter loaded; others run
    /// meanwhile. Each resident adapter of rank r costs `r · (in + out)` values per
    /// adapted projection.
    #[serde(deserialize_with = "whole_number")]
    pub max_loras: usize,
    /// Largest rank an adapter may have, in `[1, 4096]`.
    #[serde(deserialize_with = "whole_number")]
    pub max_rank: usize,
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self {
            adapters: BTreeMap::new(),
            max_loras: 4,
            max_rank: 64,
        }
    }
}

impl LoraConfig {
    /// Checks the bounds and the names.
    ///
    /// # Errors
    /// The first bad value, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=MAX_MAX_LORAS).contains(&self.max_loras) {
            return Err(ConfigError(format!(
                "lora.max_loras must be in [1, {MAX_MAX_LORAS}] (got {})",
                self.max_loras
            )));
        }
        if !(1..=MAX_MAX_RANK).contains(&self.max_rank) {
            return Err(ConfigError(format!(
                "lora.max_rank must be in [1, {MAX_MAX_RANK}] (got {})",
                self.max_rank
            )));
        }
        for (name, path) in &self.adapters {
            crate::adapters::registry::check_name(name)
                .map_err(|e| ConfigError(format!("lora.adapters: {e}")))?;
            if path.as_os_str().is_empty() {
                return Err(ConfigError(format!(
                    "lora.adapters.{name} must be a path (got \"\")"
                )));
            }
        }
        Ok(())
    }
}
