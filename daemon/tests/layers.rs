//! The module picture of `README.md` (Layout) and `DESIGN.md` §1: data flows one way,
//! so no module imports one that comes before it, and only `prepare/` submits to the
//! scheduler. Read from the sources, so a new back-arrow fails here.

use std::path::{Path, PathBuf};

/// `(module, modules it must not name)`: the arrows that would run back up the flow.
const FORBIDDEN: &[(&str, &[&str])] = &[
    (
        "request",
        &[
            "sampling",
            "scheduler",
            "tokenizer",
            "prepare",
            "detokenizer",
            "api",
            "server",
            "engine",
        ],
    ),
    (
        "tokenizer",
        &[
            "scheduler",
            "sampling",
            "prepare",
            "detokenizer",
            "engine",
            "server",
        ],
    ),
    (
        "sampling",
        &["scheduler", "tokenizer", "prepare", "engine", "server"],
    ),
    (
        "detokenizer",
        &[
            "scheduler",
            "sampling",
            "tokenizer",
            "prepare",
            "engine",
            "server",
        ],
    ),
    ("api", &["scheduler", "prepare", "engine", "server"]),
    ("scheduler", &["prepare", "engine", "server", "tokenizer"]),
    (
        "prefix_store",
        &["scheduler", "model_runner", "prepare", "engine", "server"],
    ),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The code lines of `module`'s files that name `crate::<other>` (unit-test files, whose
/// fixtures may load anything, and comments left out).
fn arrows(module: &str, other: &str) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(&src().join(module), &mut files);
    let needle = format!("crate::{other}");
    let mut hits = Vec::new();
    for f in files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.contains("tests") {
            continue;
        }
        let text = std::fs::read_to_string(&f).expect("read source");
        for (i, line) in text.lines().enumerate() {
            let Some(at) = line.find(&needle) else {
                continue;
            };
            if line.trim_start().starts_with("//") {
                continue;
            }
            let after = line[at + needle.len()..].chars().next();
            if after.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // a longer module name
            }
            hits.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
        }
    }
    hits
}

#[test]
fn no_module_imports_one_before_it() {
    let mut back = Vec::new();
    for (module, before) in FORBIDDEN {
        for other in *before {
            back.extend(arrows(module, other));
        }
    }
    assert!(
        back.is_empty(),
        "arrows running back up:\n{}",
        back.join("\n")
    );
}

#[test]
fn only_prepare_submits_to_the_scheduler() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let senders: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).expect("read source");
            text.contains("Submit(") && !f.ends_with("scheduler/actor.rs")
        })
        .map(|f| f.strip_prefix(src()).unwrap_or(f).display().to_string())
        .collect();
    assert_eq!(senders, ["prepare/placement.rs"]);
}

#[test]
fn the_check_sees_an_arrow_where_there_is_one() {
    // The scheduler does use the model runner: the scan finds it.
    assert!(!arrows("scheduler", "model_runner").is_empty());
}
