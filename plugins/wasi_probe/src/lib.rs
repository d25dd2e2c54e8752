//! `wasi_probe`: a test fixture written against Rust `std`, so its component imports
//! WASI 0.2 (environment, clocks, random, filesystem, sockets, stdio) like a Python or
//! JavaScript plugin's does. `configure` tries everything a plugin should not be able to
//! do and rejects the config with a one-line report of what happened, which the host
//! tests read from the `validation` error:
//!
//! `file=<err kind> dir=<err kind> env=<n vars> arg=<n args> tcp=<err kind>
//!  dns=<err kind> wall=<secs since epoch> mono=<ns elapsed over a 1.5 s sleep>
//!  random=<hex u64> stdin=<bytes read>`
//!
//! Config `{}` configures normally; `process` then answers `keep`, and `{"spin": true}`
//! makes each `process` sleep 10 s of (virtual) time in 100 sleeps, which must neither
//! hold the host nor fail inside the scheduler's Tokio runtime.
use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::io::Read;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

wit_bindgen::generate!({ path: "../../wit", world: "logits-processor-plugin" });

use exports::inferd::plugin::logits_processor::{Guest, LogitsEdit, PluginInfo, StepContext};

thread_local! {
    static SPIN: Cell<bool> = const { Cell::new(false) };
}

fn kind<T>(r: std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("{:?}", e.kind()),
    }
}

fn report() -> String {
    let file = kind(std::fs::read("/etc/passwd"));
    let dir = kind(std::fs::read_dir("."));
    let env = std::env::vars_os().count();
    let arg = std::env::args_os().count();
    let tcp = kind(std::net::TcpStream::connect("127.0.0.1:80"));
    let dns = kind(std::net::ToSocketAddrs::to_socket_addrs("localhost:80"));
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let start = Instant::now();
    std::thread::sleep(Duration::from_millis(1500));
    let mono = start.elapsed().as_nanos();
    let random = RandomState::new().hash_one(42u64);
    let mut buf = Vec::new();
    let stdin = std::io::stdin()
        .read_to_end(&mut buf)
        .map_or(-1, |n| n as i64);
    println!("wasi_probe: hello on stdout");
    eprintln!("wasi_probe: hello on stderr");
    format!(
        "file={file} dir={dir} env={env} arg={arg} tcp={tcp} dns={dns} wall={wall} \
         mono={mono} random={random:016x} stdin={stdin}"
    )
}

/// The exported component.
struct Probe;

impl Guest for Probe {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "wasi_probe".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Test fixture: probes the WASI sandbox".into(),
        }
    }

    fn configure(config: String, _seed: u64) -> Result<(), String> {
        let compact: String = config.chars().filter(|c| !c.is_whitespace()).collect();
        match compact.as_str() {
            "{}" => Ok(()),
            r#"{"spin":true}"# => {
                SPIN.with(|s| s.set(true));
                Ok(())
            }
            r#"{"report":true}"# => Err(report()),
            other => Err(format!(
                "config must be {{}}, {{\"spin\": true}} or {{\"report\": true}}, got {other}"
            )),
        }
    }

    fn process(_ctx: StepContext, _logits: Vec<f32>) -> Result<LogitsEdit, String> {
        if SPIN.with(Cell::get) {
            for _ in 0..100 {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(LogitsEdit::Keep)
    }
}

export!(Probe);
