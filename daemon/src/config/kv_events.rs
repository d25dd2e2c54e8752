//! `[kv_events]`: KV-cache events for prefix-aware routers (`crate::kv_events`), in
//! vLLM's `--kv-events-config` format (ZeroMQ PUB of msgpack `EventBatch`es with a
//! ROUTER socket for replay).

use serde::{Deserialize, Serialize};

use super::{whole_number, ConfigError};

/// Largest `buffer_steps`.
pub const MAX_BUFFER: usize = 1_000_000;

/// How each event of a batch is laid out (`kv_events.event_encoding`; see
/// `crate::kv_events::wire`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventEncoding {
    /// A tagged array (`array_like=True`): llm-d, vLLM's array-like events, Dynamo.
    #[default]
    Array,
    /// A map tagged by `"type"`: later vLLM versions, Dynamo.
    Map,
}

/// `[kv_events]` settings (off by default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvEventsConfig {
    /// Publish the events.
    pub enabled: bool,
    /// The PUB socket: `tcp://HOST:PORT` to bind (`*` or `0.0.0.0` for every
    /// interface; port 0 picks a free one, printed on stdout at start).
    pub endpoint: String,
    /// The ROUTER socket answering replay requests (an 8-byte big-endian start
    /// sequence number); empty for none.
    pub replay_endpoint: String,
    /// The topic frame of every message (subscribers filter on its prefix).
    pub topic: String,
    /// Messages kept for replay, in `[1, 1000000]`: the bounded queue between the
    /// engine and the publishing thread too. A message pushed out before the thread
    /// sent it is dropped (`inferd_kv_events_dropped_total`).
    #[serde(deserialize_with = "whole_number")]
    pub buffer_steps: usize,
    /// `"array"` (each event a tagged array, the default) or `"map"` (a map tagged by
    /// `"type"`).
    pub event_encoding: EventEncoding,
    /// Reported as the batches' `data_parallel_rank`.
    #[serde(deserialize_with = "whole_number")]
    pub data_parallel_rank: usize,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: "tcp://*:5558".into(),
            topic: "kv-events".into(),
            buffer_steps: 10_000,
            event_encoding: EventEncoding::Array,
            data_parallel_rank: 0,
        }
    }
}

impl KvEventsConfig {
    /// Checks the endpoints' form and the bounds.
    ///
    /// # Errors
    /// The first bad value, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        check_endpoint("kv_events.endpoint", &self.endpoint)?;
        if !self.replay_endpoint.is_empty() {
            check_endpoint("kv_events.replay_endpoint", &self.replay_endpoint)?;
            if self.replay_endpoint == self.endpoint && !self.endpoint.ends_with(":0") {
                return Err(ConfigError(format!(
                    "kv_events.replay_endpoint must differ from kv_events.endpoint (both {:?})",
                    self.endpoint
                )));
            }
        }
        if !(1..=MAX_BUFFER).contains(&self.buffer_steps) {
            return Err(ConfigError(format!(
                "kv_events.buffer_steps must be in [1, {MAX_BUFFER}] (got {})",
                self.buffer_steps
            )));
        }
        if self.data_parallel_rank > i32::MAX as usize {
            return Err(ConfigError(format!(
                "kv_events.data_parallel_rank must be in [0, {}] (got {})",
                i32::MAX,
                self.data_parallel_rank
            )));
        }
        Ok(())
    }

    /// The endpoints as the ZeroMQ library binds them: `*` becomes `0.0.0.0`.
    pub fn bind_address(endpoint: &str) -> String {
        endpoint.replacen("tcp://*:", "tcp://0.0.0.0:", 1)
    }
}

/// `tcp://HOST:PORT` with a port in `[0, 65535]`.
fn check_endpoint(key: &str, value: &str) -> Result<(), ConfigError> {
    let bad = || {
        ConfigError(format!(
            "{key} must be tcp://HOST:PORT, e.g. \"tcp://*:5557\" (got {value:?})"
        ))
    };
    let rest = value.strip_prefix("tcp://").ok_or_else(bad)?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        let on = KvEventsConfig {
            enabled: true,
            ..KvEventsConfig::default()
        };
        assert!(on.validate().is_ok());
        let e = KvEventsConfig {
            endpoint: "ipc:///tmp/x".into(),
            ..on.clone()
        };
        let msg = e.validate().expect_err("ipc").to_string();
        assert!(
            msg.contains("kv_events.endpoint must be tcp://HOST:PORT"),
            "{msg}"
        );
        assert!(msg.contains("\"ipc:///tmp/x\""), "{msg}");
        let e = KvEventsConfig {
            replay_endpoint: "tcp://*:99999".into(),
            ..on.clone()
        };
        assert!(e.validate().is_err());
        let e = KvEventsConfig {
            replay_endpoint: on.endpoint.clone(),
            ..on.clone()
        };
        assert!(e
            .validate()
            .expect_err("same")
            .to_string()
            .contains("must differ"));
        let e = KvEventsConfig {
            buffer_steps: 0,
            ..on.clone()
        };
        assert_eq!(
            e.validate().expect_err("0").to_string(),
            "configuration error: kv_events.buffer_steps must be in [1, 1000000] (got 0)"
        );
        let off = KvEventsConfig {
            endpoint: "nonsense".into(),
            ..KvEventsConfig::default()
        };
        assert!(off.validate().is_ok(), "off: not checked");
        assert_eq!(
            KvEventsConfig::bind_address("tcp://*:5557"),
            "tcp://0.0.0.0:5557"
        );
    }
}
