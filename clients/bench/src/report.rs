//! The comparison table and the goals of issue 3.

use std::fmt::Write;

use serde::Serialize;

use crate::figures::{Figures, Level};
use crate::llama_bench::LlamaBench;

/// One table row: a metric for both engines.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Metric name, with its unit.
    pub metric: String,
    /// inferd's value.
    pub inferd: Option<f64>,
    /// llama.cpp's value.
    pub peer: Option<f64>,
    /// `inferd / peer`.
    pub ratio: Option<f64>,
    /// Whether a higher value is better (tok/s) or a lower one (latency, memory);
    /// `None` for informational rows.
    pub higher_is_better: Option<bool>,
}

/// One goal of issue 3 with its outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    /// What is required, e.g. `single-stream decode >= 1.2x llama.cpp`.
    pub goal: String,
    /// The measured ratio.
    pub measured: Option<f64>,
    /// The bound the ratio is compared with.
    pub bound: f64,
    /// `"pass"`, `"fail"`, or `"n/a"` (a figure is missing).
    pub status: String,
}

fn level(figures: &Figures, n: usize) -> Option<&Level> {
    figures.concurrency.iter().find(|l| l.n == n)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// The rows of the table, for the levels `ours` ran.
pub fn rows(ours: &Figures, peer: Option<&Figures>) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut push = |metric: String, f: &dyn Fn(&Figures) -> Option<f64>, higher: Option<bool>| {
        let a = f(ours);
        let b = peer.and_then(f);
        rows.push(Row {
            metric,
            inferd: a,
            peer: b,
            ratio: ratio(a, b),
            higher_is_better: higher,
        });
    };
    push(
        format!(
            "prefill tok/s ({} tok prompt, best)",
            ours.prefill.prompt_tokens
        ),
        &|f| Some(f.prefill.tok_per_s),
        Some(true),
    );
    push(
        "prefill TTFT ms (best)".into(),
        &|f| f.prefill.ttft_ms.iter().copied().reduce(f64::min),
        Some(false),
    );
    push(
        "decode tok/s (single stream)".into(),
        &|f| Some(f.decode.tok_per_s),
        Some(true),
    );
    push(
        "decode tokens generated".into(),
        &|f| Some(f.decode.tokens as f64),
        None,
    );
    for l in &ours.concurrency {
        let n = l.n;
        push(
            format!("aggregate tok/s @{n}"),
            &move |f| level(f, n).map(|l| l.aggregate_tok_per_s),
            Some(true),
        );
        push(
            format!("mean TTFT ms @{n}"),
            &move |f| level(f, n).map(|l| l.mean_ttft_ms),
            Some(false),
        );
        push(
            format!("mean ITL ms @{n}"),
            &move |f| level(f, n).map(|l| l.mean_itl_ms),
            Some(false),
        );
    }
    push(
        "peak RSS MiB".into(),
        &|f| Some(f.peak_rss_bytes as f64 / (1024.0 * 1024.0)),
        Some(false),
    );
    rows
}

/// Rows comparing inferd's served prefill and decode with llama-bench's `pp` and `tg`
/// (llama.cpp without a server).
pub fn bench_rows(ours: &Figures, bench: &LlamaBench) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut push = |metric: String, a: f64, b: Option<f64>| {
        rows.push(Row {
            metric,
            inferd: Some(a),
            peer: b,
            ratio: ratio(Some(a), b),
            higher_is_better: Some(true),
        })
    };
    if let Some(pp) = &bench.pp {
        push(
            format!("prefill tok/s vs llama-bench {}", pp.name),
            ours.prefill.tok_per_s,
            Some(pp.avg_tok_per_s),
        );
    }
    if let Some(tg) = &bench.tg {
        push(
            format!("decode tok/s vs llama-bench {}", tg.name),
            ours.decode.tok_per_s,
            Some(tg.avg_tok_per_s),
        );
    }
    rows
}

/// The goals of issue 3.
pub fn goals(ours: &Figures, peer: Option<&Figures>) -> Vec<Goal> {
    let goal = |text: &str, measured: Option<f64>, bound: f64, at_least: bool| {
        let status = match measured {
            None => "n/a",
            Some(m) if (at_least && m >= bound) || (!at_least && m <= bound) => "pass",
            Some(_) => "fail",
        };
        Goal {
            goal: text.to_owned(),
            measured,
            bound,
            status: status.to_owned(),
        }
    };
    let ours16 = level(ours, 16).map(|l| l.aggregate_tok_per_s);
    let peer16 = peer
        .and_then(|p| level(p, 16))
        .map(|l| l.aggregate_tok_per_s);
    vec![
        goal(
            "single-stream decode >= 1.5x llama.cpp",
            ratio(
                Some(ours.decode.tok_per_s),
                peer.map(|p| p.decode.tok_per_s),
            ),
            1.5,
            true,
        ),
        goal(
            "prefill >= 1.2x llama.cpp",
            ratio(
                Some(ours.prefill.tok_per_s),
                peer.map(|p| p.prefill.tok_per_s),
            ),
            1.2,
            true,
        ),
        goal(
            "aggregate tok/s @16 >= 1.5x llama.cpp @16",
            ratio(ours16, peer16),
            1.5,
            true,
        ),
        goal(
            "peak RSS <= 1.2x llama.cpp",
            ratio(
                Some(ours.peak_rss_bytes as f64),
                peer.map(|p| p.peak_rss_bytes as f64),
            ),
            1.2,
            false,
        ),
    ]
}

/// A table cell: `-` when missing, fewer decimals for larger values.
pub fn cell(value: Option<f64>) -> String {
    match value {
        None => "-".into(),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// Renders the table and the goals as text.
pub fn render(rows: &[Row], goals: &[Goal]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.metric.clone(),
                cell(r.inferd),
                cell(r.peer),
                r.ratio.map_or("-".into(), |x| format!("{x:.2}x")),
                match r.higher_is_better {
                    Some(true) => "higher",
                    Some(false) => "lower",
                    None => "-",
                }
                .into(),
            ]
        })
        .collect();
    let mut out = table(
        &[
            ("metric", 0),
            ("inferd", 10),
            ("llama.cpp", 10),
            ("ratio", 6),
            ("better", 0),
        ],
        &cells,
    );
    let lines: Vec<(String, String, String)> = goals
        .iter()
        .map(|g| {
            (
                g.status.clone(),
                g.goal.clone(),
                g.measured.map_or("-".into(), |x| format!("{x:.2}x")),
            )
        })
        .collect();
    out.push_str(&goal_list(
        "goals of issue 3 (ratio = inferd / llama.cpp):",
        &lines,
    ));
    out
}

/// A plain-text table. `columns` are (header, width): the first column is left-aligned
/// to its widest cell, the others right-aligned to `width` characters (0: unpadded).
pub fn table(columns: &[(&str, usize)], rows: &[Vec<String>]) -> String {
    let first = rows
        .iter()
        .filter_map(|r| r.first())
        .map(String::len)
        .chain(columns.first().map(|c| c.0.len()))
        .max()
        .unwrap_or(6)
        .max(6);
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, (c, (_, w))) in cells.zip(columns).enumerate() {
            if i == 0 {
                let _ = write!(l, "{c:<first$}");
            } else {
                let _ = write!(l, " | {c:>w$}");
            }
        }
        l.push('\n');
        l
    };
    let mut out = line(&mut columns.iter().map(|c| c.0));
    let rule = first
        + columns
            .iter()
            .skip(1)
            .map(|c| 3 + c.1.max(c.0.len()))
            .sum::<usize>();
    let _ = writeln!(out, "{}", "-".repeat(rule));
    for r in rows {
        out.push_str(&line(&mut r.iter().map(String::as_str)));
    }
    out
}

/// The goals under a title: `  [STATUS] goal (measured m)` per (status, goal, m).
pub fn goal_list(title: &str, goals: &[(String, String, String)]) -> String {
    let mut out = format!("\n{title}\n");
    for (status, goal, measured) in goals {
        let _ = writeln!(
            out,
            "  [{:>4}] {goal} (measured {measured})",
            status.to_uppercase()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figures::{Decode, Prefill};

    fn figures(decode: f64, agg16: f64, rss: u64) -> Figures {
        Figures {
            prefill: Prefill {
                prompt_tokens: 512,
                ttft_ms: vec![100.0, 90.0],
                tok_per_s: 5000.0,
            },
            decode: Decode {
                prompt_tokens: 20,
                tokens: 128,
                span_s: 1.0,
                tok_per_s: decode,
                ttft_ms: 10.0,
            },
            concurrency: vec![Level {
                n: 16,
                tokens: 2048,
                wall_s: 1.0,
                aggregate_tok_per_s: agg16,
                mean_ttft_ms: 1.0,
                max_ttft_ms: 1.0,
                mean_itl_ms: 1.0,
                p50_itl_ms: 1.0,
                p99_itl_ms: 1.0,
                short_streams: 0,
            }],
            peak_rss_bytes: rss,
            extra: serde_json::Value::Null,
        }
    }

    #[test]
    fn goals_pass_and_fail() {
        // decode 1.6x (>= 1.5: pass), prefill 1.0x (< 1.2: fail), 16 streams 1.33x
        // (< 1.5: fail), RSS 1.1x (<= 1.2: pass).
        let ours = figures(160.0, 400.0, 110);
        let peer = figures(100.0, 300.0, 100);
        let g = goals(&ours, Some(&peer));
        let status: Vec<&str> = g.iter().map(|g| g.status.as_str()).collect();
        assert_eq!(status, ["pass", "fail", "fail", "pass"]);
        // Without a peer every goal is a ratio to it: none can be judged.
        let g = goals(&ours, None);
        let status: Vec<&str> = g.iter().map(|g| g.status.as_str()).collect();
        assert_eq!(status, ["n/a", "n/a", "n/a", "n/a"]);
    }

    #[test]
    fn table_aligns_columns() {
        let t = table(
            &[("metric", 0), ("a", 4)],
            &[vec!["long metric".into(), "1.5".into()]],
        );
        assert_eq!(
            t,
            "metric      |    a\n------------------\nlong metric |  1.5\n"
        );
    }

    #[test]
    fn table_has_rows_for_levels() {
        let ours = figures(120.0, 400.0, 110);
        let r = rows(&ours, None);
        assert!(r.iter().any(|r| r.metric == "aggregate tok/s @16"));
        let text = render(&r, &goals(&ours, None));
        assert!(text.contains("N/A"));
    }
}
