//! `[server]`: the listener, its authentication, its connection limits and the
//! shutdown grace period.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::{strict_bool, whole_number};

/// Bounds of `server.max_connections`.
pub const MAX_CONNECTIONS_RANGE: std::ops::RangeInclusive<usize> = 1..=1_048_576;
/// Bounds of `server.header_timeout_ms`.
pub const HEADER_TIMEOUT_MS_RANGE: std::ops::RangeInclusive<u64> = 100..=3_600_000;

/// `[server]`: the listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to listen on (`host:port`); port 0 picks a free port (logged at start-up).
    pub listen: String,
    /// Largest accepted WebSocket message or HTTP request body, in bytes.
    #[serde(deserialize_with = "whole_number")]
    pub max_message_bytes: usize,
    /// Bearer token required on `/v1/*` (HTTP `Authorization: Bearer KEY`, also for the
    /// WebSocket upgrade); `None` = no authentication. `/health`, `/ready` and `/metrics`
    /// stay open. Reloaded on SIGHUP.
    pub api_key: Option<String>,
    /// Allow a non-loopback `listen` address without `api_key` (default `false`: such a
    /// configuration is refused at start-up).
    #[serde(deserialize_with = "strict_bool")]
    pub allow_remote_without_api_key: bool,
    /// On SIGTERM/SIGINT, seconds running requests may take to finish before the rest are
    /// cancelled (`finish_reason: "cancelled"`). Bound `[0, 3600]`. Reloaded on SIGHUP.
    #[serde(deserialize_with = "whole_number")]
    pub shutdown_grace_s: u64,
    /// Most TCP connections open at once (HTTP, keep-alive and WebSocket alike); one
    /// beyond it is answered `503` with `Connection: close` and closed at once. Bound
    /// `[1, 1048576]`; with a reserve of descriptors it must fit the open-file limit
    /// (`RLIMIT_NOFILE`, whose soft limit is raised to the hard one at start-up).
    /// Reloaded on SIGHUP.
    #[serde(deserialize_with = "whole_number")]
    pub max_connections: usize,
    /// Milliseconds a client may take to send a request's headers, the WebSocket
    /// upgrade request included, counted from the connection's accept or, on a
    /// keep-alive connection, from the previous response: a client that dribbles its
    /// headers (slowloris) or idles between requests is disconnected. Bound
    /// `[100, 3600000]`. Reloaded on SIGHUP (for new connections).
    #[serde(deserialize_with = "whole_number")]
    pub header_timeout_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            max_message_bytes: 4 << 20,
            api_key: None,
            allow_remote_without_api_key: false,
            shutdown_grace_s: 30,
            max_connections: 1024,
            header_timeout_ms: 30_000,
        }
    }
}

impl ServerConfig {
    /// Checks the `[server]` values; the message names the key, the bound and the value.
    ///
    /// # Errors
    /// The first invalid value found.
    pub fn validate(&self) -> Result<(), String> {
        let Ok(addr) = self.listen.parse::<SocketAddr>() else {
            return Err(format!(
                "server.listen must be an address like 127.0.0.1:8080 (got \"{}\")",
                self.listen
            ));
        };
        if let Some(key) = &self.api_key {
            if key.is_empty() || key.len() > 1024 || !key.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "server.api_key must be 1 to 1024 printable ASCII characters without \
                     spaces (got {} bytes)",
                    key.len()
                ));
            }
        }
        if !addr.ip().is_loopback() && self.api_key.is_none() && !self.allow_remote_without_api_key
        {
            return Err(format!(
                "server.listen = \"{}\" is reachable from other machines but \
                 server.api_key is not set: set an API key, or set \
                 server.allow_remote_without_api_key = true to serve without one",
                self.listen
            ));
        }
        if self.shutdown_grace_s > 3600 {
            return Err(format!(
                "server.shutdown_grace_s must be in [0, 3600] seconds (got {})",
                self.shutdown_grace_s
            ));
        }
        if self.max_message_bytes < 1024 {
            return Err(format!(
                "server.max_message_bytes must be >= 1024 (got {})",
                self.max_message_bytes
            ));
        }
        if !MAX_CONNECTIONS_RANGE.contains(&self.max_connections) {
            return Err(format!(
                "server.max_connections must be in [{}, {}] (got {})",
                MAX_CONNECTIONS_RANGE.start(),
                MAX_CONNECTIONS_RANGE.end(),
                self.max_connections
            ));
        }
        if !HEADER_TIMEOUT_MS_RANGE.contains(&self.header_timeout_ms) {
            return Err(format!(
                "server.header_timeout_ms must be in [{}, {}] milliseconds (got {})",
                HEADER_TIMEOUT_MS_RANGE.start(),
                HEADER_TIMEOUT_MS_RANGE.end(),
                self.header_timeout_ms
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{CliOverrides, Settings};

    fn load_env(pairs: &[(&str, &str)]) -> Result<Settings, String> {
        let env = pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        Settings::load_with_env(None, &CliOverrides::default(), Some(env))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn connection_limits_have_defaults_and_bounds_naming_key_bound_and_value() {
        let s = load_env(&[]).expect("defaults");
        assert_eq!(
            (s.server.max_connections, s.server.header_timeout_ms),
            (1024, 30_000)
        );
        let s = load_env(&[
            ("INFERD__SERVER__MAX_CONNECTIONS", "1"),
            ("INFERD__SERVER__HEADER_TIMEOUT_MS", "100"),
        ])
        .expect("lower bounds");
        assert_eq!(
            (s.server.max_connections, s.server.header_timeout_ms),
            (1, 100)
        );
        let s = load_env(&[
            ("INFERD__SERVER__MAX_CONNECTIONS", "1048576"),
            ("INFERD__SERVER__HEADER_TIMEOUT_MS", "3600000"),
        ])
        .expect("upper bounds");
        assert_eq!(
            (s.server.max_connections, s.server.header_timeout_ms),
            (1_048_576, 3_600_000)
        );
        for (key, value, want) in [
            (
                "INFERD__SERVER__MAX_CONNECTIONS",
                "0",
                "configuration error: server.max_connections must be in [1, 1048576] (got 0)",
            ),
            (
                "INFERD__SERVER__MAX_CONNECTIONS",
                "1048577",
                "configuration error: server.max_connections must be in [1, 1048576] \
                 (got 1048577)",
            ),
            (
                "INFERD__SERVER__HEADER_TIMEOUT_MS",
                "99",
                "configuration error: server.header_timeout_ms must be in [100, 3600000] \
                 milliseconds (got 99)",
            ),
            (
                "INFERD__SERVER__HEADER_TIMEOUT_MS",
                "3600001",
                "configuration error: server.header_timeout_ms must be in [100, 3600000] \
                 milliseconds (got 3600001)",
            ),
        ] {
            let e = load_env(&[(key, value)]).expect_err(value);
            assert_eq!(e, want, "{key}={value}");
        }
        // Not a whole number: the deserializer names the key.
        for (key, value) in [
            ("INFERD__SERVER__MAX_CONNECTIONS", "-5"),
            ("INFERD__SERVER__HEADER_TIMEOUT_MS", "1.5"),
        ] {
            let e = load_env(&[(key, value)]).expect_err(value);
            let name = key.trim_start_matches("INFERD__SERVER__").to_lowercase();
            assert!(e.contains(&name) && e.contains(value), "{key}={value}: {e}");
        }
    }
}
