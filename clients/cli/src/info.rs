//! `stats` and `plugins`: ask the daemon for its engine state or its loaded plugins and
//! print the answer for people, or the server's frame as is with `--json`.

use std::fmt::Write as _;
use std::io::Write;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::answer::{count, ServerError};
use crate::connection::{Connection, Endpoint};
use crate::request;

/// The id of the query a `stats` / `plugins` run sends.
const QUERY_ID: &str = "cli-1";

/// Which query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Query {
    /// `{"type":"stats"}`: the engine's counters.
    Stats,
    /// `{"type":"plugins"}`: the loaded Wasm plugins.
    Plugins,
}

impl Query {
    /// The frame type of the request and of its answer.
    fn kind(self) -> &'static str {
        match self {
            Self::Stats => "stats",
            Self::Plugins => "plugins",
        }
    }
}

/// Sends `query` and prints its answer to `out`: the frame's text as received with
/// `json`, else a human-readable summary.
pub async fn run(
    endpoint: &Endpoint,
    query: Query,
    json: bool,
    out: &mut impl Write,
) -> Result<()> {
    let mut connection = Connection::open(endpoint).await?;
    let text = fetch(&mut connection, query).await?;
    connection.close().await;
    if json {
        writeln!(out, "{text}")?;
    } else {
        let frame: Value = serde_json::from_str(&text)?;
        match query {
            Query::Stats => write!(out, "{}", render_stats(&frame))?,
            Query::Plugins => write!(out, "{}", render_plugins(&frame))?,
        }
    }
    out.flush()?;
    Ok(())
}

/// Sends `query` on `connection` and returns its answer frame's text; an `error` frame
/// is a [`ServerError`].
pub async fn fetch(connection: &mut Connection, query: Query) -> Result<String> {
    let kind = query.kind();
    connection
        .send(&request::query(kind, QUERY_ID), kind)
        .await?;
    loop {
        let text = connection.next_text().await?;
        let frame: Value = serde_json::from_str(&text)
            .with_context(|| format!("server sent invalid JSON: {text}"))?;
        let id = frame.get("id");
        let for_us = id.is_none_or(Value::is_null)
            || matches!(id, Some(Value::String(id)) if id == QUERY_ID);
        match frame.get("type").and_then(Value::as_str) {
            Some(t) if t == kind && for_us => return Ok(text),
            Some("error") if for_us => {
                let error = frame.get("error").cloned().unwrap_or(Value::Null);
                return Err(ServerError { error }.into());
            }
            _ => {}
        }
    }
}

/// `part` of `whole` as a percentage with one decimal (0 when `whole` is 0).
/// Characters of the widest cell of column `i`, the header's included.
pub fn column_width<const N: usize>(rows: &[[String; N]], header: &[String; N], i: usize) -> usize {
    rows.iter()
        .chain([header])
        .map(|r| r[i].chars().count())
        .max()
        .unwrap_or(0)
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "0.0%".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

/// A byte count with a binary unit (`1.5 GiB`).
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

fn flag(frame: &Value, pointer: &str) -> bool {
    frame
        .pointer(pointer)
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

fn number(frame: &Value, pointer: &str) -> f64 {
    frame
        .pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or(0.0)
}

/// The `stats` frame for people: one labelled line per figure, the prefix cache and
/// speculative decoding indented under their headings.
pub fn render_stats(frame: &Value) -> String {
    let c = |p: &str| count(frame, p);
    let mut lines: Vec<(String, String)> = vec![
        ("running".into(), c("/running").to_string()),
        (
            "waiting".into(),
            format!(
                "{} ({} preempted; {} preemptions since start)",
                c("/waiting"),
                c("/preempted"),
                c("/preemptions_total")
            ),
        ),
        (
            "KV blocks".into(),
            format!(
                "{} / {} used ({}), {} tokens each",
                c("/kv_blocks_used"),
                c("/kv_blocks_total"),
                percent(c("/kv_blocks_used"), c("/kv_blocks_total")),
                c("/kv_block_size")
            ),
        ),
        (
            "tokens generated".into(),
            format!("{} in {} engine steps", c("/tokens_generated"), c("/steps")),
        ),
        (
            "prompt computed".into(),
            format!("{} tokens", c("/prompt_tokens_computed")),
        ),
    ];
    if flag(frame, "/prefix_cache/enabled") {
        let disk = flag(frame, "/prefix_cache/disk_enabled");
        lines.push((
            "prefix cache".into(),
            format!("on (disk tier {})", if disk { "on" } else { "off" }),
        ));
        lines.push((
            "  hit rate".into(),
            format!(
                "{} ({} of {} prompt tokens; {} from memory, {} from disk)",
                percent(
                    c("/prefix_cache/hit_tokens"),
                    c("/prefix_cache/prompt_tokens")
                ),
                c("/prefix_cache/hit_tokens"),
                c("/prefix_cache/prompt_tokens"),
                c("/prefix_cache/memory_hit_tokens"),
                c("/prefix_cache/disk_hit_tokens"),
            ),
        ));
        lines.push((
            "  memory".into(),
            format!(
                "{} blocks ({} evictable)",
                c("/prefix_cache/memory_blocks"),
                c("/prefix_cache/memory_evictable_blocks")
            ),
        ));
        if disk {
            lines.push((
                "  disk".into(),
                format!(
                    "{} blocks, {}; {} written, {} evicted; dropped: {} corrupt, {} writes, \
                     {} unreachable",
                    c("/prefix_cache/disk_blocks"),
                    bytes(c("/prefix_cache/disk_bytes")),
                    c("/prefix_cache/disk_written_blocks"),
                    c("/prefix_cache/disk_evicted_blocks"),
                    c("/prefix_cache/disk_dropped_corrupt"),
                    c("/prefix_cache/disk_dropped_writes"),
                    c("/prefix_cache/disk_unreachable_writes"),
                ),
            ));
        }
    } else {
        lines.push(("prefix cache".into(), "off".into()));
    }
    let method = frame
        .pointer("/speculative/method")
        .and_then(Value::as_str)
        .unwrap_or("off");
    if method == "off" {
        lines.push(("speculative".into(), "off".into()));
    } else {
        lines.push((
            "speculative".into(),
            format!(
                "{method}, k = {} (row cost {:.2}, draft cost {:.2})",
                c("/speculative/k"),
                number(frame, "/speculative/row_cost"),
                number(frame, "/speculative/draft_cost"),
            ),
        ));
        lines.push((
            "  acceptance".into(),
            format!(
                "{} ({} of {} draft tokens)",
                percent(
                    c("/speculative/accepted_tokens"),
                    c("/speculative/draft_tokens")
                ),
                c("/speculative/accepted_tokens"),
                c("/speculative/draft_tokens"),
            ),
        ));
        lines.push((
            "  verifications".into(),
            format!(
                "{} steps, {:.2} tokens each",
                c("/speculative/verification_steps"),
                number(frame, "/speculative/tokens_per_verification"),
            ),
        ));
    }
    let mut text = String::new();
    for (label, value) in lines {
        let _ = writeln!(text, "{label:<18}{value}");
    }
    text
}

/// The `plugins` frame for people: a table of name, world, version and description,
/// then the interface the daemon implements.
pub fn render_plugins(frame: &Value) -> String {
    let field = |p: &Value, key: &str| p.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
    let rows: Vec<[String; 4]> = frame
        .get("plugins")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|p| {
                    [
                        field(p, "name"),
                        field(p, "world"),
                        field(p, "version"),
                        field(p, "description"),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    let interface = frame
        .get("interface")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let mut text = String::new();
    if rows.is_empty() {
        let _ = writeln!(
            text,
            "no plugins loaded (the daemon's plugins.dir is unset or holds none)"
        );
    } else {
        let header = ["NAME", "WORLD", "VERSION", "DESCRIPTION"].map(String::from);
        let width = |i| column_width(&rows, &header, i);
        let (w0, w1, w2) = (width(0), width(1), width(2));
        for [name, world, version, description] in [&header].into_iter().chain(&rows) {
            let line = format!("{name:<w0$}  {world:<w1$}  {version:<w2$}  {description}");
            let _ = writeln!(text, "{}", line.trim_end());
        }
    }
    let _ = writeln!(text, "interface: {interface}");
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sample_stats() -> Value {
        json!({"type": "stats", "id": "cli-1", "running": 3, "waiting": 1, "preempted": 0,
         "preemptions_total": 2, "kv_blocks_used": 41, "kv_blocks_total": 728,
         "kv_block_size": 16, "tokens_generated": 5120, "steps": 1874, "prompt_tokens_computed": 3072,
         "prefix_cache": {"enabled": true, "disk_enabled": true, "prompt_tokens": 12288,
           "hit_tokens": 9216, "hit_rate": 0.75, "memory_hit_tokens": 8192,
           "disk_hit_tokens": 1024, "memory_blocks": 310, "memory_evictable_blocks": 288,
           "disk_blocks": 4410, "disk_bytes": 1625000000u64, "disk_written_blocks": 4410,
           "disk_evicted_blocks": 0, "disk_dropped_corrupt": 0, "disk_dropped_writes": 0,
           "disk_unreachable_writes": 0},
         "speculative": {"method": "ngram", "k": 8, "row_cost": 0.61, "draft_cost": 0.0,
           "draft_tokens": 2400, "accepted_tokens": 1800,
           "acceptance_rate": 0.75, "verification_steps": 600, "tokens_per_verification": 4.0}})
    }

    #[test]
    fn stats_are_rendered_line_by_line() {
        let text = render_stats(&sample_stats());
        let expected = "\
running           3
waiting           1 (0 preempted; 2 preemptions since start)
KV blocks         41 / 728 used (5.6%), 16 tokens each
tokens generated  5120 in 1874 engine steps
prompt computed   3072 tokens
prefix cache      on (disk tier on)
  hit rate        75.0% (9216 of 12288 prompt tokens; 8192 from memory, 1024 from disk)
  memory          310 blocks (288 evictable)
  disk            4410 blocks, 1.5 GiB; 4410 written, 0 evicted; dropped: 0 corrupt, 0 writes, 0 unreachable
speculative       ngram, k = 8 (row cost 0.61, draft cost 0.00)
  acceptance      75.0% (1800 of 2400 draft tokens)
  verifications   600 steps, 4.00 tokens each
";
        assert_eq!(text, expected);
    }

    #[test]
    fn stats_with_features_off_are_short() {
        let mut frame = sample_stats();
        frame["prefix_cache"]["enabled"] = json!(false);
        frame["speculative"]["method"] = json!("off");
        let text = render_stats(&frame);
        assert!(text.contains("prefix cache      off\n"), "{text}");
        assert!(text.ends_with("speculative       off\n"), "{text}");
        assert!(!text.contains("hit rate"));
    }

    #[test]
    fn plugins_are_a_table() {
        let frame = json!({"type": "plugins", "interface": "inferd:plugin@0.1.0", "plugins": [
            {"name": "ban_words", "world": "logits-processor", "version": "0.1.0",
             "description": "Bans words", "interface": "inferd:plugin@0.1.0", "file": "ban_words.wasm"},
            {"name": "mirostat", "world": "sampler", "version": "0.2.0", "description": "",
             "interface": "inferd:plugin@0.1.0", "file": "mirostat.wasm"}]});
        assert_eq!(
            render_plugins(&frame),
            "\
NAME       WORLD             VERSION  DESCRIPTION
ban_words  logits-processor  0.1.0    Bans words
mirostat   sampler           0.2.0
interface: inferd:plugin@0.1.0
"
        );
        let none = json!({"type": "plugins", "interface": "inferd:plugin@0.1.0", "plugins": []});
        assert!(render_plugins(&none).starts_with("no plugins loaded"));
    }

    #[test]
    fn units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(2048), "2.0 KiB");
        assert_eq!(bytes(3 * 1024 * 1024 * 1024), "3.0 GiB");
        assert_eq!(percent(1, 0), "0.0%");
        assert_eq!(percent(1, 3), "33.3%");
    }
}
