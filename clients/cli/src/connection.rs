//! One WebSocket connection to the daemon: the handshake (with the API key and a clear
//! message when it fails), sending JSON frames and reading text frames.

use anyhow::{bail, Context, Result};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Where the daemon is and how to authenticate.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `ws://HOST:PORT/v1/ws`.
    pub url: String,
    /// `server.api_key`, sent as a bearer token.
    pub api_key: Option<String>,
}

/// Why [`Connection::open`] failed; `--json` prints it as
/// `{"error": {"type": TAG, "message": ...}}`.
#[derive(Debug)]
pub struct OpenError {
    /// `invalid_api_key` for HTTP 401 (the daemon's own code), else `connection`.
    pub tag: &'static str,
    /// What went wrong, naming the URL.
    pub message: String,
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for OpenError {}

/// An open connection.
pub struct Connection {
    sink: SplitSink<Ws, Message>,
    stream: SplitStream<Ws>,
}

/// The message for a connection the daemon closed while a reply was awaited.
const CLOSED_EARLY: &str = "the daemon closed the connection before the answer finished";

impl Connection {
    /// Opens a connection to `endpoint`; the error says whether the daemon is not
    /// there or refused the key.
    pub async fn open(endpoint: &Endpoint) -> Result<Self> {
        let failed = |tag, message| OpenError { tag, message };
        let mut request = endpoint.url.as_str().into_client_request().map_err(|e| {
            failed(
                "connection",
                format!("--url {}: not a WebSocket URL ({e})", endpoint.url),
            )
        })?;
        if let Some(key) = &endpoint.api_key {
            let value = HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| failed("connection", "--api-key must be printable ASCII".into()))?;
            request.headers_mut().insert("authorization", value);
        }
        let (ws, _) = tokio_tungstenite::connect_async(request)
            .await
            .map_err(|e| match e {
                WsError::Http(r) if r.status() == 401 => failed(
                    "invalid_api_key",
                    format!(
                        "{} {} (HTTP 401): pass the daemon's server.api_key with --api-key or \
                         INFERD_API_KEY",
                        endpoint.url,
                        if endpoint.api_key.is_some() {
                            "refused the API key"
                        } else {
                            "requires an API key"
                        }
                    ),
                ),
                e => failed(
                    "connection",
                    format!(
                        "cannot connect to {}: is inferd running? ({e})",
                        endpoint.url
                    ),
                ),
            })?;
        let (sink, stream) = ws.split();
        Ok(Self { sink, stream })
    }

    /// Sends one frame; `what` names it in the error.
    pub async fn send(&mut self, frame: &Value, what: &str) -> Result<()> {
        self.sink
            .send(Message::text(frame.to_string()))
            .await
            .with_context(|| format!("sending {what}"))
    }

    /// The next text frame. A closed connection is an error.
    pub async fn next_text(&mut self) -> Result<String> {
        loop {
            let message = match self.stream.next().await {
                None => bail!(CLOSED_EARLY),
                Some(m) => m.context("reading from the daemon")?,
            };
            match message {
                Message::Text(text) => return Ok(text.as_str().to_owned()),
                Message::Close(_) => bail!(CLOSED_EARLY),
                _ => {}
            }
        }
    }

    /// Closes the connection politely; best effort (the work is done either way).
    pub async fn close(mut self) {
        let _ = self.sink.send(Message::Close(None)).await;
    }
}
