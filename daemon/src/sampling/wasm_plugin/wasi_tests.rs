//! Host tests of the WASI sandbox, against the `wasi_probe` fixture (a Rust `std`
//! plugin, so its component imports WASI like a Python or JavaScript one does).

use super::tests::{chain, expect_trap, limits, logits, registry, spec, step, vocab};
use super::*;
use crate::error::ErrorKind;

/// The probe's report (see plugins/wasi_probe) for a request seeded with `seed`, as
/// `key=value` pairs.
fn report(seed: u64) -> Vec<(String, String)> {
    let e = registry()
        .instantiate(&[spec("wasi_probe", r#"{"report": true}"#)], seed, "t")
        .expect_err("the probe rejects its config with the report");
    assert_eq!(e.kind, ErrorKind::Validation, "{}", e.message);
    let prefix = "plugins[0].config: plugin \"wasi_probe\" rejected it: ";
    let body = e
        .message
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("{:?} lacks {prefix:?}", e.message));
    pairs(body)
}

/// A probe's one-line report, `key=value` pairs separated by spaces.
pub(super) fn pairs(report: &str) -> Vec<(String, String)> {
    report
        .split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("key=value");
            (k.to_string(), v.to_string())
        })
        .collect()
}

pub(super) fn field<'a>(r: &'a [(String, String)], key: &str) -> &'a str {
    r.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("{key} missing in {r:?}"))
}

#[test]
fn the_probe_loads_as_a_logits_processor() {
    let list = registry().list();
    let probe = list
        .iter()
        .find(|d| d.name == "wasi_probe")
        .expect("wasi_probe loaded (run scripts/build-plugins.sh)");
    assert_eq!(probe.world, PluginWorld::LogitsProcessor);
}

#[test]
fn files_sockets_environment_and_stdin_are_denied() {
    let r = report(7);
    // No preopened directory: wasi-libc finds no directory to resolve a path against.
    assert_eq!(field(&r, "file"), "NotFound", "{r:?}");
    assert_eq!(field(&r, "dir"), "NotFound", "{r:?}");
    assert_eq!(field(&r, "env"), "0");
    assert_eq!(field(&r, "arg"), "0");
    assert_eq!(field(&r, "tcp"), "PermissionDenied", "{r:?}");
    assert_ne!(field(&r, "dns"), "ok", "{r:?}");
    assert_eq!(field(&r, "stdin"), "0");
}

#[test]
fn clocks_are_virtual_and_sleeps_return_at_once() {
    let r = report(7);
    // Starts at the virtual epoch (2000-01-01), not the host's time.
    let wall: u64 = field(&r, "wall").parse().expect("secs");
    assert_eq!(wall, VIRTUAL_EPOCH_S);
    // The 1.5 s sleep took 1.5 s of virtual time (plus a few clock reads)...
    let mono: u64 = field(&r, "mono").parse().expect("ns");
    assert!(
        (1_500_000_000..1_500_000_000 + 100 * CLOCK_STEP_NS).contains(&mono),
        "{mono}"
    );
    // ...and none of the host's: configure's deadline is 500 ms, and the probe got to
    // write its report instead of being interrupted.
    assert!(limits().configure_deadline < std::time::Duration::from_millis(1500));
}

#[test]
fn random_comes_from_the_request_seed() {
    let a = report(7);
    let b = report(7);
    let c = report(8);
    assert_eq!(field(&a, "random"), field(&b, "random"));
    assert_ne!(field(&a, "random"), field(&c, "random"));
}

/// The scheduler calls plugins on an actix (Tokio current-thread) runtime thread, where
/// wasmtime-wasi's blocking host calls would panic if run in place.
#[test]
fn a_wasi_plugin_sleeps_inside_a_tokio_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut spin = chain(&[spec("wasi_probe", r#"{"spin": true}"#)]);
        let mut keep = chain(&[spec("noop", "{}")]);
        for n in 0..3u32 {
            let generated: Vec<u32> = (0..n).collect();
            let mut l = logits();
            spin.process(&step(&generated), &mut l)
                .expect("10 s of virtual sleep within a 100 ms deadline");
            assert_eq!(l, logits());
            keep.process(&step(&generated), &mut l).expect("neighbour");
        }
    });
}

#[test]
fn an_import_outside_the_list_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (file, import) in [
        ("http.wasm", "wasi:http/outgoing-handler@0.2.0"),
        ("future.wasm", "wasi:random/random@0.3.0"),
        ("other.wasm", "acme:spy/exfiltrate@1.0.0"),
    ] {
        let wat = format!(r#"(component (import "{import}" (instance)))"#);
        let bytes = wat::parse_str(&wat).expect("component text");
        std::fs::write(dir.path().join(file), bytes).expect("write");
    }
    let (reg, mut errors) =
        PluginRegistry::load_dir(dir.path(), vocab(), limits()).expect("engine");
    assert!(reg.list().is_empty());
    errors.sort_by(|a, b| a.path.cmp(&b.path));
    let reasons: Vec<&str> = errors.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    for (reason, import) in reasons.iter().zip([
        "wasi:random/random@0.3.0",
        "wasi:http/outgoing-handler@0.2.0",
        "acme:spy/exfiltrate@1.0.0",
    ]) {
        assert!(
            reason.starts_with(&format!(
                "imports `{import}`, which the sandbox does not provide"
            )),
            "{reason}"
        );
        assert!(reason.contains("wasi:sockets/tcp"), "{reason}");
    }
}

#[test]
fn a_trap_in_a_wasi_plugin_fails_only_its_request() {
    let mut probe = chain(&[spec("wasi_probe", "{}")]);
    let mut bad = chain(&[spec("trap", "{}")]);
    expect_trap(bad.process(&step(&[]), &mut logits()), &["plugin trap"]);
    probe
        .process(&step(&[]), &mut logits())
        .expect("unaffected");
}

/// The build scripts check components against `scripts/plugin-build-lib.sh`: the same list
/// as the daemon's, no more and no less (checked over every WASI 0.2 interface name).
#[test]
fn the_build_scripts_allow_exactly_the_daemons_wasi_list() {
    let others = [
        "wasi:cli/run",
        "wasi:cli/command",
        "wasi:http/types",
        "wasi:http/outgoing-handler",
        "wasi:http/incoming-handler",
        "wasi:keyvalue/store",
        "wasi:config/runtime",
        "wasi:random/secure",
        "wasi:filesystem/other",
        "wasi:sockets/dns",
    ];
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/plugin-build-lib.sh"
    );
    let names: Vec<&str> = ALLOWED_INTERFACES.iter().chain(&others).copied().collect();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(r#"source "$1"; shift; for n; do [[ ${n#wasi:} =~ ^($WASI_ALLOWED)$ ]] && echo "$n"; done; true"#)
        .arg("bash")
        .arg(script)
        .args(&names)
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let allowed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(allowed, ALLOWED_INTERFACES);
}
