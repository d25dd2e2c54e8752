//! The speculative scenario's table, goals and mismatch list.

use std::fmt::Write;

use crate::report::{cell, goal_list, table, Goal};
use crate::spec_figures::{ratio, Arm, Mismatch, Workload};

/// Goal: extractive workload, inferd speculation on / off.
pub const GOAL_EXTRACTIVE: f64 = 2.0;
/// Goal: open-ended workload, on / off (speculation must not cost more than 3 %).
pub const GOAL_OPEN_ENDED: f64 = 0.97;
/// Goal: the concurrent streams, on / off.
pub const GOAL_STREAMS: f64 = 1.0;

/// The bound of workload `name` (`extractive`, `open-ended`, else the streams).
pub fn bound_of(name: &str) -> f64 {
    match name {
        "extractive" => GOAL_EXTRACTIVE,
        "open-ended" => GOAL_OPEN_ENDED,
        _ => GOAL_STREAMS,
    }
}

fn status(measured: Option<f64>, bound: f64) -> &'static str {
    match measured {
        None => "n/a",
        Some(m) if m >= bound => "pass",
        Some(_) => "fail",
    }
}

/// The goals: each workload's on / off ratio, and greedy identity over all of them.
pub fn goals(inferd: &[Workload]) -> Vec<Goal> {
    let mut goals: Vec<Goal> = inferd
        .iter()
        .map(|w| {
            let bound = bound_of(&w.name);
            Goal {
                goal: format!("{}: decode with speculation >= {bound:.2}x without", w.name),
                measured: w.ratio,
                bound,
                status: status(w.ratio, bound).to_owned(),
            }
        })
        .collect();
    let mismatches: usize = inferd.iter().map(|w| w.mismatches.len()).sum();
    goals.push(Goal {
        goal: "greedy token ids with speculation equal those without (every prompt and run)".into(),
        measured: Some(mismatches as f64),
        bound: 0.0,
        status: if mismatches == 0 { "pass" } else { "fail" }.into(),
    });
    goals
}

fn x(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}x"))
}

fn identical(ok: bool) -> String {
    if ok { "yes" } else { "MISMATCH" }.into()
}

fn accept(arm: &Arm) -> String {
    arm.acceptance_rate
        .map_or("-".into(), |a| format!("{:.0} %", a * 100.0))
}

fn per_verification(arm: &Arm) -> String {
    arm.tokens_per_verification
        .map_or("-".into(), |t| format!("{t:.2}"))
}

/// One row: figures of inferd's `ours` and llama.cpp's `peer` (same workload or prompt).
struct Line<'a> {
    label: String,
    off: &'a Arm,
    on: &'a Arm,
    ratio: Option<f64>,
    identical: bool,
    goal: Option<f64>,
    peer: Option<(&'a Arm, &'a Arm, Option<f64>, bool)>,
}

fn cells(l: &Line) -> Vec<String> {
    let goal = l.goal.map_or("-".into(), |b| {
        format!("{b:.2}x {}", status(l.ratio, b).to_uppercase())
    });
    let mut row = vec![
        l.label.clone(),
        cell(l.off.tok_per_s),
        cell(l.on.tok_per_s),
        x(l.ratio),
        goal,
        accept(l.on),
        per_verification(l.on),
        identical(l.identical),
    ];
    match l.peer {
        Some((off, on, r, _)) => row.extend([
            cell(off.tok_per_s),
            cell(on.tok_per_s),
            x(r),
            x(ratio(l.on.tok_per_s, on.tok_per_s)),
        ]),
        None => row.extend(std::iter::repeat_n("-".to_owned(), 4)),
    }
    row
}

fn peer_cells(l: &Line) -> Option<Vec<String>> {
    let (off, on, _, same) = l.peer?;
    Some(vec![
        l.label.clone(),
        accept(on),
        per_verification(on),
        identical(same),
        x(ratio(l.off.tok_per_s, off.tok_per_s)),
    ])
}

fn lines<'a>(inferd: &'a [Workload], peer: Option<&'a [Workload]>) -> Vec<Line<'a>> {
    let mut out = Vec::new();
    for w in inferd {
        let p = peer.and_then(|p| p.iter().find(|q| q.name == w.name));
        out.push(Line {
            label: w.name.clone(),
            off: &w.off,
            on: &w.on,
            ratio: w.ratio,
            identical: w.identical,
            goal: Some(bound_of(&w.name)),
            peer: p.map(|p| (&p.off, &p.on, p.ratio, p.identical)),
        });
        for r in &w.prompts {
            let q = p.and_then(|p| p.prompts.iter().find(|q| q.prompt == r.prompt));
            out.push(Line {
                label: format!("  {}", r.prompt),
                off: &r.off,
                on: &r.on,
                ratio: r.ratio,
                identical: r.identical,
                goal: None,
                peer: q.map(|q| (&q.off, &q.on, q.ratio, q.identical)),
            });
        }
    }
    out
}

/// One mismatch as a line.
pub fn mismatch_line(engine: &str, workload: &str, m: &Mismatch) -> String {
    format!(
        "MISMATCH ({engine}, {workload}): {} rep {} speculation {}: token ids differ from the \
         first speculation-off run at index {} ({} vs {} ids): {:?} vs {:?}",
        m.prompt,
        m.rep,
        if m.speculative { "on" } else { "off" },
        m.at,
        m.len,
        m.reference_len,
        m.ids,
        m.reference_ids
    )
}

/// The tables, the goals and every mismatch, as text.
pub fn render(inferd: &[Workload], peer: Option<&[Workload]>, goals: &[Goal]) -> String {
    let lines = lines(inferd, peer);
    let rows: Vec<Vec<String>> = lines.iter().map(cells).collect();
    let mut out = table(
        &[
            ("workload (tok/s)", 0),
            ("inferd off", 10),
            ("inferd on", 9),
            ("on/off", 6),
            ("goal", 10),
            ("accept", 6),
            ("tok/verif", 9),
            ("identical", 9),
            ("llama off", 9),
            ("llama ngram", 11),
            ("ngram/off", 9),
            ("inferd on/llama ngram", 21),
        ],
        &rows,
    );
    let peer_rows: Vec<Vec<String>> = lines.iter().filter_map(peer_cells).collect();
    if !peer_rows.is_empty() {
        out.push_str("\nllama.cpp with n-gram speculation:\n");
        out.push_str(&table(
            &[
                ("workload", 0),
                ("accept", 6),
                ("tok/verif", 9),
                ("identical", 9),
                ("inferd off/llama off", 20),
            ],
            &peer_rows,
        ));
    }
    let list: Vec<(String, String, String)> = goals
        .iter()
        .map(|g| {
            let measured = if g.bound == 0.0 {
                g.measured
                    .map_or("-".into(), |m| format!("{m:.0} mismatching runs"))
            } else {
                x(g.measured)
            };
            (g.status.clone(), g.goal.clone(), measured)
        })
        .collect();
    out.push_str(&goal_list("goals (inferd, speculation on / off):", &list));
    let mut loud = String::new();
    for (engine, workloads) in [("inferd", Some(inferd)), ("llama.cpp", peer)] {
        for w in workloads.unwrap_or_default() {
            for m in &w.mismatches {
                let _ = writeln!(loud, "{}", mismatch_line(engine, &w.name, m));
            }
        }
    }
    if !loud.is_empty() {
        out.push('\n');
        out.push_str(&loud);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec_figures::{single_stream, Drafts, Run};
    use serde_json::Value;

    fn run(prompt: &str, on: bool, tok_per_s: f64, ids: &[u32]) -> Run {
        Run {
            prompt: prompt.into(),
            speculative: on,
            rep: 0,
            prompt_tokens: 10,
            tokens: 11,
            tokens_after_first: 10,
            span_s: 10.0 / tok_per_s,
            tok_per_s,
            ttft_ms: 1.0,
            finish_reason: "length".into(),
            drafts: Drafts::ZERO,
            token_ids: ids.to_vec(),
            text: String::new(),
            extra: Value::Null,
        }
    }

    #[test]
    fn goals_and_loud_mismatches() {
        let runs = vec![
            run("a", false, 50.0, &[1, 2]),
            run("a", true, 120.0, &[1, 3]),
        ];
        let w = vec![single_stream("extractive", &["a"], &runs)];
        let g = goals(&w);
        assert_eq!(g[0].status, "pass");
        assert_eq!(g[1].status, "fail");
        let text = render(&w, None, &g);
        assert!(text.contains("MISMATCH (inferd, extractive): a rep 0 speculation on"));
        assert!(text.contains("2.00x PASS"));
    }
}
