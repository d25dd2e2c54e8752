//! `[[engines]]`: several engines of one model in one process behind one port (the
//! data-parallel mode of vLLM's `--data-parallel-size` and SGLang's `--dp-size`), each
//! with its own device, compute threads, KV pool, scheduler and prefix-store directory.
//! Requests are placed by prefix score (`crate::engine::placement`).
//!
//! An empty list (the default) is one engine as `[model]` and `[scheduler]` say.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{whole_number, ConfigError, Settings};

/// Most engines in one process.
pub const MAX_ENGINES: usize = 64;

/// One `[[engines]]` entry: what differs from `[model]` and `[scheduler]` for it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// `"cpu"` or `"cuda:N"` (or `"auto"`); empty = `model.device`.
    pub device: String,
    /// Compute threads of this engine's kernels, in `[0, 1024]`; 0 = an even share of
    /// the available cores (at least 1).
    #[serde(deserialize_with = "whole_number")]
    pub threads: usize,
    /// This engine's KV-cache budget, bytes; 0 = `scheduler.kv_cache_bytes`.
    #[serde(deserialize_with = "whole_number")]
    pub kv_cache_bytes: u64,
    /// Subdirectory of `prefix_store.path` holding this engine's disk tier (one plain
    /// name); empty = `engine-N` (N: the entry's index from 0).
    pub prefix_store_dir: String,
}

impl Settings {
    /// Checks `[[engines]]`: each message names the entry's key, the bound and the value.
    ///
    /// # Errors
    /// The first bad entry.
    pub(super) fn validate_engines(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError(m));
        if self.engines.len() > MAX_ENGINES {
            return bad(format!(
                "engines: at most {MAX_ENGINES} entries (got {})",
                self.engines.len()
            ));
        }
        let mut dirs = std::collections::HashSet::new();
        for (i, e) in self.engines.iter().enumerate() {
            let key = |k: &str| format!("engines[{i}].{k}");
            if !e.device.is_empty() && !super::is_device(&e.device) {
                return bad(format!(
                    "{} must be \"auto\", \"cpu\" or \"cuda:N\" (got {:?})",
                    key("device"),
                    e.device
                ));
            }
            if e.threads > 1024 {
                return bad(format!(
                    "{} must be in [0, 1024] (got {})",
                    key("threads"),
                    e.threads
                ));
            }
            if e.kv_cache_bytes != 0 && !((1 << 20)..=(1u64 << 40)).contains(&e.kv_cache_bytes) {
                return bad(format!(
                    "{} must be 0 or in [1048576, 1099511627776] (got {})",
                    key("kv_cache_bytes"),
                    e.kv_cache_bytes
                ));
            }
            let dir = engine_dir(i, e);
            let plain = Path::new(&dir).components().count() == 1
                && !matches!(dir.as_str(), "." | "..")
                && !dir.contains('/');
            if !plain {
                return bad(format!(
                    "{} must be one plain directory name (got {:?})",
                    key("prefix_store_dir"),
                    e.prefix_store_dir
                ));
            }
            if !dirs.insert(dir.clone()) {
                return bad(format!(
                    "{}: {dir:?} is another engine's directory too; each engine needs its own",
                    key("prefix_store_dir")
                ));
            }
        }
        self.check_engine_ports()
    }

    /// With `[kv_events]` on, engine N binds the configured ports plus N: no two of
    /// the engines' sockets may share a port (port 0 picks free ones).
    fn check_engine_ports(&self) -> Result<(), ConfigError> {
        if !self.kv_events.enabled || self.engines.len() < 2 {
            return Ok(());
        }
        let mut seen = std::collections::HashMap::new();
        for (i, s) in self.engine_settings().iter().enumerate() {
            for (key, endpoint) in [
                ("endpoint", &s.kv_events.endpoint),
                ("replay_endpoint", &s.kv_events.replay_endpoint),
            ] {
                if endpoint.is_empty() || endpoint.ends_with(":0") {
                    continue;
                }
                let port = endpoint.rsplit_once(':').map_or("", |(_, p)| p).to_string();
                if let Some((j, other)) = seen.insert(port, (i, key)) {
                    return Err(ConfigError(format!(
                        "kv_events.{key}: engine {i} would bind {endpoint:?}, the port of \
                         engine {j}'s kv_events.{other} (engine N binds the configured ports \
                         plus N); leave {} ports after each, e.g. replay_endpoint = \
                         \"tcp://*:{}\"",
                        self.engines.len(),
                        port_of(&self.kv_events.endpoint) + self.engines.len()
                    )));
                }
            }
        }
        Ok(())
    }

    /// The settings of each engine: `[model]` and `[scheduler]` with the entry's
    /// overrides, the prefix store in the entry's subdirectory, and the KV-event
    /// endpoints and `data_parallel_rank` offset by the engine's index as vLLM offsets
    /// them per data-parallel rank (`vllm/distributed/kv_events.py`,
    /// `ZmqEventPublisher.offset_endpoint_port`: a TCP port plus the rank; port 0
    /// stays 0). One engine, as given, when `[[engines]]` is empty.
    pub fn engine_settings(&self) -> Vec<Settings> {
        if self.engines.is_empty() {
            return vec![self.clone()];
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let share = (cores / self.engines.len()).max(1);
        self.engines
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let mut s = self.clone();
                s.engines.clear();
                if !e.device.is_empty() {
                    s.model.device = e.device.clone();
                }
                s.model.threads = if e.threads == 0 { share } else { e.threads };
                if e.kv_cache_bytes != 0 {
                    s.scheduler.kv_cache_bytes = e.kv_cache_bytes;
                }
                s.prefix_store.path = self.prefix_store.path.join(engine_dir(i, e));
                let kv = &mut s.kv_events;
                kv.endpoint = offset_port(&kv.endpoint, i);
                if !kv.replay_endpoint.is_empty() {
                    kv.replay_endpoint = offset_port(&kv.replay_endpoint, i);
                }
                kv.data_parallel_rank += i;
                s
            })
            .collect()
    }
}

/// The port of `tcp://HOST:PORT` (0 when there is none).
fn port_of(endpoint: &str) -> usize {
    endpoint
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or(0)
}

/// The prefix-store subdirectory of engine `i`.
fn engine_dir(i: usize, e: &EngineConfig) -> String {
    if e.prefix_store_dir.is_empty() {
        format!("engine-{i}")
    } else {
        e.prefix_store_dir.clone()
    }
}

/// `tcp://HOST:PORT` with `PORT + offset` (port 0, any free port, stays 0; a port
/// past 65535 is left for the endpoint check to refuse at bind).
fn offset_port(endpoint: &str, offset: usize) -> String {
    match endpoint
        .rsplit_once(':')
        .map(|(h, p)| (h, p.parse::<usize>()))
    {
        Some((host, Ok(port))) if port != 0 => format!("{host}:{}", port + offset),
        _ => endpoint.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(engines: Vec<EngineConfig>) -> Settings {
        let mut s = Settings::default();
        s.prefix_store.path = "/state/prefix-store".into();
        s.kv_events.endpoint = "tcp://*:5557".into();
        s.kv_events.replay_endpoint = "tcp://127.0.0.1:0".into();
        s.engines = engines;
        s
    }

    #[test]
    fn each_engine_gets_its_overrides_directory_and_ports() {
        let s = with(vec![
            EngineConfig {
                threads: 1,
                ..EngineConfig::default()
            },
            EngineConfig {
                device: "cpu".into(),
                threads: 3,
                kv_cache_bytes: 1 << 24,
                prefix_store_dir: "second".into(),
            },
        ]);
        s.validate_engines().expect("valid");
        let e = s.engine_settings();
        assert_eq!(e.len(), 2);
        assert_eq!((e[0].model.threads, e[1].model.threads), (1, 3));
        assert_eq!(e[0].model.device, "auto");
        assert_eq!(e[1].model.device, "cpu");
        assert_eq!(e[0].scheduler.kv_cache_bytes, s.scheduler.kv_cache_bytes);
        assert_eq!(e[1].scheduler.kv_cache_bytes, 1 << 24);
        assert_eq!(
            e[0].prefix_store.path,
            Path::new("/state/prefix-store/engine-0")
        );
        assert_eq!(
            e[1].prefix_store.path,
            Path::new("/state/prefix-store/second")
        );
        assert_eq!(e[0].kv_events.endpoint, "tcp://*:5557");
        assert_eq!(e[1].kv_events.endpoint, "tcp://*:5558");
        assert_eq!(e[1].kv_events.replay_endpoint, "tcp://127.0.0.1:0");
        assert_eq!(
            (
                e[0].kv_events.data_parallel_rank,
                e[1].kv_events.data_parallel_rank
            ),
            (0, 1)
        );
        assert!(e.iter().all(|s| s.engines.is_empty()));
        assert_eq!(with(vec![]).engine_settings(), vec![with(vec![])]);
    }

    #[test]
    fn bad_entries_are_refused_naming_the_key_and_value() {
        let cases = [
            (
                EngineConfig {
                    threads: 5000,
                    ..EngineConfig::default()
                },
                "engines[1].threads must be in [0, 1024] (got 5000)",
            ),
            (
                EngineConfig {
                    device: "tpu".into(),
                    ..EngineConfig::default()
                },
                "engines[1].device must be \"auto\", \"cpu\" or \"cuda:N\" (got \"tpu\")",
            ),
            (
                EngineConfig {
                    kv_cache_bytes: 5,
                    ..EngineConfig::default()
                },
                "engines[1].kv_cache_bytes must be 0 or in [1048576, 1099511627776] (got 5)",
            ),
            (
                EngineConfig {
                    prefix_store_dir: "../x".into(),
                    ..EngineConfig::default()
                },
                "engines[1].prefix_store_dir must be one plain directory name (got \"../x\")",
            ),
            (
                EngineConfig {
                    prefix_store_dir: "engine-0".into(),
                    ..EngineConfig::default()
                },
                "engines[1].prefix_store_dir: \"engine-0\" is another engine's directory too; \
                 each engine needs its own",
            ),
        ];
        for (second, msg) in cases {
            let s = with(vec![EngineConfig::default(), second]);
            let e = s.validate_engines().expect_err(msg).to_string();
            assert_eq!(e, format!("configuration error: {msg}"));
        }
        let many = with(vec![EngineConfig::default(); MAX_ENGINES + 1]);
        assert!(many
            .validate_engines()
            .expect_err("65")
            .to_string()
            .contains("engines: at most 64 entries (got 65)"));
    }

    #[test]
    fn kv_event_ports_of_two_engines_may_not_collide() {
        let mut s = with(vec![EngineConfig::default(), EngineConfig::default()]);
        s.kv_events.enabled = true;
        s.kv_events.endpoint = "tcp://*:5557".into();
        s.kv_events.replay_endpoint = "tcp://*:5558".into();
        let e = s.validate_engines().expect_err("5558 twice").to_string();
        assert_eq!(
            e,
            "configuration error: kv_events.endpoint: engine 1 would bind \"tcp://*:5558\", \
             the port of engine 0's kv_events.replay_endpoint (engine N binds the configured \
             ports plus N); leave 2 ports after each, e.g. replay_endpoint = \"tcp://*:5559\""
        );
        s.kv_events.replay_endpoint = "tcp://*:5559".into();
        s.validate_engines().expect("5557, 5558 and 5559, 5560");
        s.kv_events.endpoint = "tcp://127.0.0.1:0".into();
        s.kv_events.replay_endpoint = "tcp://127.0.0.1:0".into();
        s.validate_engines().expect("free ports");
    }

    #[test]
    fn ports_are_offset_as_vllm_offsets_them() {
        assert_eq!(offset_port("tcp://*:5557", 2), "tcp://*:5559");
        assert_eq!(offset_port("tcp://[::1]:5557", 1), "tcp://[::1]:5558");
        assert_eq!(offset_port("tcp://127.0.0.1:0", 3), "tcp://127.0.0.1:0");
    }
}
