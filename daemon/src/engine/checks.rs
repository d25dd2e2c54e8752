//! Start-up checks of the engine's settings against the machine and the model: the KV
//! budget against RAM, the sampling defaults against the vocabulary, the operator's
//! chat template.

use anyhow::Context as _;

use crate::config::Settings;
use crate::tokenizer::TextTokenizer;

/// The CPU KV pool lives in RAM beside the weights: refuse a `scheduler.kv_cache_bytes`
/// larger than the machine's memory (`MemTotal` of `/proc/meminfo`) minus the model
/// file, rather than let the pool exhaust memory under load. Where `/proc/meminfo` is
/// unavailable the check is skipped.
///
/// # Errors
/// The budget exceeds the bound (the message names the setting, both figures in bytes).
pub(super) fn check_kv_fits_in_ram(
    kv_cache_bytes: u64,
    model_path: &std::path::Path,
) -> anyhow::Result<()> {
    let Some(mem_total) = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| mem_total_bytes(&s))
    else {
        return Ok(());
    };
    let weights = if model_path.is_dir() {
        std::fs::read_dir(model_path).map_or(0, |d| {
            d.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
    } else {
        std::fs::metadata(model_path).map_or(0, |m| m.len())
    };
    let bound = mem_total.saturating_sub(weights);
    if kv_cache_bytes > bound {
        anyhow::bail!(
            "scheduler.kv_cache_bytes = {kv_cache_bytes} exceeds the memory left for the KV \
             cache on this machine: {bound} bytes (MemTotal {mem_total} bytes minus the \
             {weights}-byte model file); lower it"
        );
    }
    Ok(())
}

/// `MemTotal` in bytes from the text of `/proc/meminfo` (`MemTotal:  123 kB`).
fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// Reads and compiles `model.chat_template` (`None` when empty).
///
/// # Errors
/// The file is unreadable, over 1 MiB, not UTF-8, or does not compile; the message names
/// the key and the file.
pub(crate) fn load_chat_template(
    path: &std::path::Path,
    tokenizer: &TextTokenizer,
) -> anyhow::Result<Option<crate::tokenizer::ChatTemplate>> {
    if path.as_os_str().is_empty() {
        return Ok(None);
    }
    let what = || format!("model.chat_template = {}", path.display());
    let bytes = crate::model::source::read_bounded(path, 1 << 20).with_context(what)?;
    let source = String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("{}: the file is not UTF-8", what()))?;
    if source.trim().is_empty() {
        anyhow::bail!("{}: the file is empty", what());
    }
    let t = tokenizer.compile_template(&source).with_context(what)?;
    tracing::info!(file = %path.display(), "chat template: the operator's file, not the model's");
    Ok(Some(t))
}

/// Checks `[sampling]`, then the defaults with the model's `generation_config.json`
/// values over them, each error naming where the bad value came from.
///
/// # Errors
/// A default out of its bound.
pub(crate) fn check_sampling(settings: &Settings, tokenizer: &TextTokenizer) -> anyhow::Result<()> {
    let vocab = tokenizer.vocab_size();
    settings
        .sampling
        .check(vocab)
        .map_err(|e| anyhow::anyhow!("configuration error: sampling: {}", e.message))?;
    effective_sampling(settings, tokenizer)
        .check(vocab)
        .map_err(|e| {
            anyhow::anyhow!(
                "the model's generation_config.json: {} (model.generation_config = \"ignore\" \
             uses [sampling] alone)",
                e.message
            )
        })
}

/// `[sampling]` with the model's `generation_config.json` values over it when
/// `model.generation_config = "auto"` (`do_sample: false` means greedy, temperature 0).
pub(crate) fn effective_sampling(
    settings: &Settings,
    tokenizer: &TextTokenizer,
) -> crate::api::SamplingDefaults {
    let mut d = settings.sampling.clone();
    if settings.model.generation_config == crate::config::GenerationConfig::Ignore {
        return d;
    }
    let g = tokenizer.generation_defaults();
    if let Some(t) = g.temperature {
        d.temperature = t;
    }
    if let Some(k) = g.top_k {
        d.top_k = k;
    }
    if let Some(p) = g.top_p {
        d.top_p = p;
    }
    if let Some(p) = g.min_p {
        d.min_p = p;
    }
    if g.do_sample == Some(false) {
        d.temperature = 0.0;
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_parses_proc_meminfo() {
        let text = "MemTotal:       24576000 kB\nMemFree:        1000 kB\n";
        assert_eq!(mem_total_bytes(text), Some(24_576_000 * 1024));
        assert_eq!(mem_total_bytes("MemFree: 1 kB\n"), None);
        assert_eq!(mem_total_bytes("MemTotal: lots kB\n"), None);
    }

    #[test]
    fn kv_budget_beyond_ram_is_refused_with_the_setting_named() {
        let err = check_kv_fits_in_ram(1 << 40, std::path::Path::new("/nonexistent"));
        let total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| mem_total_bytes(&s));
        if total.is_some_and(|t| t < 1 << 40) {
            let msg = format!("{:#}", err.expect_err("1 TiB exceeds this machine's RAM"));
            assert!(
                msg.contains("scheduler.kv_cache_bytes = 1099511627776"),
                "{msg}"
            );
            assert!(msg.contains("MemTotal"), "{msg}");
        }
        assert!(check_kv_fits_in_ram(1 << 20, std::path::Path::new("/nonexistent")).is_ok());
    }
}
