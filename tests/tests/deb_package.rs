//! The Debian package `scripts/package-deb.sh` builds: its control data, maintainer
//! scripts and exact file list, its systemd unit under `systemd-analyze verify`, and the
//! unit's command line started from the extracted files, serving the llama.cpp reference
//! completion through the packaged CLI. The package checked is $INFERD_DEB, else the
//! newest inferd_*.deb in target/debian-dev/ (what the test command builds, with
//! `--profile dev`), else in target/debian/ (the release package). docs/install.md
//! describes the package.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use inferd_e2e::{fixture, model_path, systemd_analyze_verify, workspace_root};
use serde_json::Value;

/// The newest inferd_*.deb in `dir`.
fn newest_in(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("inferd_") && n.ends_with(".deb"))
        })
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
}

/// The package to check (see the module's doc).
fn package() -> PathBuf {
    if let Some(p) = std::env::var_os("INFERD_DEB") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from);
    newest_in(&target.join("debian-dev"))
        .or_else(|| newest_in(&target.join("debian")))
        .unwrap_or_else(|| {
            panic!(
                "no inferd_*.deb in {0}/debian-dev or {0}/debian: run scripts/package-deb.sh",
                target.display()
            )
        })
}

/// stdout of `program args`, which must succeed.
fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// The bundled plugins the package must carry: what build-plugins.sh put in target/plugins.
fn bundled_plugins() -> BTreeSet<String> {
    let names: BTreeSet<String> = std::fs::read_dir(workspace_root().join("target/plugins"))
        .expect("target/plugins (scripts/build-plugins.sh)")
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".wasm").map(str::to_string))
        .collect();
    assert!(names.contains("min_tokens"), "the C plugin: {names:?}");
    names
}

#[test]
fn control_data_scripts_and_file_list() {
    let deb = package();
    let deb = path_str(&deb);
    let field = |name: &str| run("dpkg-deb", &["--field", deb, name]).trim().to_string();
    assert_eq!(field("Package"), "inferd");
    let version = run(
        "cargo",
        &[
            "pkgid",
            "--manifest-path",
            path_str(&workspace_root().join("daemon/Cargo.toml")),
        ],
    );
    let version = version
        .trim()
        .rsplit(['#', '@'])
        .next()
        .expect("version")
        .to_string();
    assert_eq!(field("Version"), format!("{version}-1"));
    assert_eq!(
        field("Architecture"),
        run("dpkg", &["--print-architecture"]).trim()
    );
    let depends = field("Depends");
    for dep in ["libc6", "adduser"] {
        assert!(depends.contains(dep), "Depends lacks {dep}: {depends}");
    }

    let ctrl = tempfile::tempdir().expect("tempdir");
    run("dpkg-deb", &["--control", deb, path_str(ctrl.path())]);
    let read = |name: &str| {
        std::fs::read_to_string(ctrl.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    assert_eq!(read("conffiles").trim(), "/etc/inferd/inferd.toml");
    for script in ["postinst", "prerm", "postrm"] {
        let text = read(script);
        assert!(text.starts_with("#!/bin/sh\n"), "{script}: {text}");
        assert!(text.contains("\nset -e\n"), "{script} lacks set -e");
        let checked = Command::new("sh")
            .arg("-n")
            .arg(ctrl.path().join(script))
            .status()
            .expect("sh -n");
        assert!(checked.success(), "{script} does not parse");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(ctrl.path().join(script))
                .expect("stat")
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o755, "{script} mode");
    }
    let postinst = read("postinst");
    assert!(postinst.contains("adduser --system --group --home /var/lib/inferd"));
    assert!(postinst.contains("install -d -o inferd -g inferd -m 0750 /var/lib/inferd\n"));
    let postrm = read("postrm");
    let purge = postrm.split("purge)").nth(1).expect("a purge branch");
    assert!(purge.contains("rm -rf /var/lib/inferd/prefix-store /var/lib/inferd/plugin-cache"));
    assert!(
        !purge.contains("rm -rf /var/lib/inferd\n") && !purge.contains("rm -rf /var/lib/inferd "),
        "purge must keep /var/lib/inferd/models: {purge}"
    );

    // The exact list of regular files, with modes.
    let listing = run("dpkg-deb", &["--contents", deb]);
    let files: BTreeSet<(String, String)> = listing
        .lines()
        .filter(|l| l.starts_with('-'))
        .map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let path = cols
                .last()
                .expect("path")
                .trim_start_matches('.')
                .to_string();
            (path, cols[0].to_string())
        })
        .collect();
    let mut want: BTreeSet<(String, String)> = [
        ("/usr/bin/inferd", "-rwxr-xr-x"),
        ("/usr/bin/inferd-cli", "-rwxr-xr-x"),
        ("/etc/inferd/inferd.toml", "-rw-r--r--"),
        ("/lib/systemd/system/inferd.service", "-rw-r--r--"),
        ("/usr/share/doc/inferd/README.md", "-rw-r--r--"),
        ("/usr/share/doc/inferd/install.md", "-rw-r--r--"),
        ("/usr/share/doc/inferd/copyright", "-rw-r--r--"),
    ]
    .into_iter()
    .map(|(p, m)| (p.to_string(), m.to_string()))
    .collect();
    // README.md's links into docs/.
    for doc in std::fs::read_dir(workspace_root().join("docs")).expect("docs") {
        let name = doc
            .expect("entry")
            .file_name()
            .into_string()
            .expect("utf-8");
        if name.ends_with(".md") {
            want.insert((
                format!("/usr/share/doc/inferd/docs/{name}"),
                "-rw-r--r--".into(),
            ));
        }
    }
    for name in bundled_plugins() {
        want.insert((
            format!("/usr/lib/inferd/plugins/{name}.wasm"),
            "-rw-r--r--".into(),
        ));
    }
    assert_eq!(files, want, "{listing}");
}

/// Extracts the package into a throwaway root.
fn extract() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("tempdir");
    run(
        "dpkg-deb",
        &["-x", path_str(&package()), path_str(root.path())],
    );
    root
}

#[test]
fn the_packaged_unit_and_config_are_the_repository_ones_with_package_paths() {
    let root = extract();
    let unit = std::fs::read_to_string(root.path().join("lib/systemd/system/inferd.service"))
        .expect("unit");
    let source = std::fs::read_to_string(workspace_root().join("configs/inferd.service"))
        .expect("configs/inferd.service");
    // Every line of the repository's unit (after its header comment) is there, but the
    // three the package changes.
    let changed = [
        "ExecStart=/usr/local/bin/inferd serve --config /etc/inferd/inferd.toml",
        "DynamicUser=yes",
        "Environment=INFERD__PLUGINS__DIR=/var/lib/inferd/plugins",
    ];
    let body = source.split_once("\n\n").expect("header").1;
    for line in body.lines().filter(|l| !changed.contains(l)) {
        assert!(
            unit.lines().any(|u| u == line),
            "the packaged unit lacks {line:?}"
        );
    }
    assert!(unit.contains("\nExecStart=/usr/bin/inferd serve --config /etc/inferd/inferd.toml\n"));
    assert!(unit.contains("\nUser=inferd\n") && unit.contains("\nStateDirectory=inferd\n"));
    assert!(unit.contains("\nDocumentation=file:///usr/share/doc/inferd/install.md\n"));
    assert!(!unit.contains("DynamicUser") && !unit.contains("INFERD__PLUGINS__DIR"));

    // systemd-analyze verify, with ExecStart at the extracted binary.
    let inferd = root.path().join("usr/bin/inferd");
    systemd_analyze_verify(&unit.replace("/usr/bin/inferd", path_str(&inferd)));

    // The config: the repository's, but for the two absolute paths.
    let config =
        std::fs::read_to_string(root.path().join("etc/inferd/inferd.toml")).expect("config");
    let source =
        std::fs::read_to_string(workspace_root().join("configs/inferd.toml")).expect("toml");
    let diff: Vec<(&str, &str)> = source
        .lines()
        .zip(config.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert_eq!(source.lines().count(), config.lines().count());
    assert_eq!(
        diff,
        vec![
            (
                "path = \"models/SmolLM2-135M-Instruct.Q4_1.gguf\"",
                "path = \"/var/lib/inferd/models/SmolLM2-135M-Instruct.Q4_1.gguf\""
            ),
            (
                "dir = \"target/plugins\"",
                "dir = \"/usr/lib/inferd/plugins\""
            ),
        ]
    );
}

/// The unit's ExecStart from the extracted files: paths under the throwaway root, the
/// environment systemd gives it (STATE_DIRECTORY, the working directory), the model
/// linked where the config names it; only the listen port (0) and the two absolute paths
/// of the config are redirected, through the environment the daemon reads.
#[test]
fn the_unit_command_line_serves_from_the_installed_paths() {
    let root = extract();
    let unit = std::fs::read_to_string(root.path().join("lib/systemd/system/inferd.service"))
        .expect("unit");
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    let mapped = |arg: &str| {
        if arg.starts_with('/') {
            root.path().join(arg.trim_start_matches('/'))
        } else {
            PathBuf::from(arg)
        }
    };
    let argv: Vec<PathBuf> = exec.split_whitespace().map(mapped).collect();
    let state = root.path().join("var/lib/inferd");
    let models = state.join("models");
    std::fs::create_dir_all(&models).expect("models dir");
    let model = models.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    std::os::unix::fs::symlink(model_path(), &model).expect("link the model");
    let plugins = root.path().join("usr/lib/inferd/plugins");

    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(&state)
        .env("STATE_DIRECTORY", &state)
        .env("INFERD__SERVER__LISTEN", "127.0.0.1:0")
        .env("INFERD__MODEL__PATH", &model)
        .env("INFERD__PLUGINS__DIR", &plugins)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the packaged inferd");
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    let errors = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
            .join("\n")
    });
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("inferd: listening on ") {
                let _ = tx.send(url.trim().to_string());
            }
        }
    });
    let Ok(url) = rx.recv_timeout(Duration::from_secs(120)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "the packaged daemon did not listen:\n{}",
            errors.join().unwrap_or_default()
        );
    };

    let cli = root.path().join("usr/bin/inferd-cli");
    let cli_json = |args: &[&str]| -> Value {
        let out = Command::new(&cli)
            .arg("--url")
            .arg(&url)
            .arg("--json")
            .args(args)
            .output()
            .expect("run the packaged inferd-cli");
        assert!(
            out.status.success(),
            "inferd-cli {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("inferd-cli --json output")
    };
    // The plugins came from the package's directory.
    let listed: BTreeSet<String> = cli_json(&["plugins"])["plugins"]
        .as_array()
        .expect("plugins")
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect();
    assert_eq!(listed, bundled_plugins());
    // llama.cpp's greedy continuation of the reference prompt.
    let reference = fixture("llamacpp/reference.json");
    let raw = &reference["raw_completion"];
    let answer = cli_json(&[
        "complete",
        raw["prompt"].as_str().expect("prompt"),
        "--max-tokens",
        "48",
        "--temperature",
        "0",
    ]);
    assert_eq!(answer["text"], raw["generated_text"]);
    assert_eq!(answer["finish_reason"], "length");
    // The state went where systemd's StateDirectory= points.
    assert!(
        state.join("prefix-store/STORE").is_file(),
        "no prefix store under {}",
        state.display()
    );

    // SIGTERM (systemctl stop) ends it cleanly.
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .expect("kill");
    assert!(status.success());
    let end = std::time::Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s.code();
        }
        assert!(
            std::time::Instant::now() < end,
            "no exit within 30 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(0), "{}", errors.join().unwrap_or_default());
}
