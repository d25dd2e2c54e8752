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

/// The message of an HTTP 401 from the daemon at `url` (WebSocket handshake or HTTP
/// request), saying whether a key was sent.
pub fn key_refused(url: &str, sent_key: bool) -> String {
    format!(
        "{url} {} (HTTP 401): pass the daemon's server.api_key with --api-key or INFERD_API_KEY",
        if sent_key {
            "refused the API key"
        } else {
            "requires an API key"
        }
    )
}

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
    /// `invalid_api_key` for HTTP 401 (the daemon's own code), `client` for a bad
    /// `--url` or `--api-key`, else `connection`.
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
    /// A text frame read while a send failed (the daemon's error frame for an
    /// oversized message), returned by the next [`Self::next_text`].
    pending: Option<String>,
}

/// The message for a connection the daemon closed while a reply was awaited.
const CLOSED_EARLY: &str = "the daemon closed the connection before the answer finished";

impl Connection {
    /// Opens a connection to `endpoint`; the error says whether the daemon is not
    /// there or refused the key.
    pub async fn open(endpoint: &Endpoint) -> Result<Self> {
        let failed = |tag, message| OpenError { tag, message };
        let url = &endpoint.url;
        let mut request = url
            .as_str()
            .into_client_request()
            .map_err(|e| failed("client", format!("--url {url}: not a WebSocket URL ({e})")))?;
        // http's Uri keeps a port it cannot read as u16, and tungstenite then dials the
        // scheme's default port (80) instead: refuse it here.
        let scheme = request.uri().scheme_str().unwrap_or("");
        if !matches!(scheme, "ws" | "wss") {
            // The daemon's HTTP address is the one users see first: name its WebSocket.
            let hint = match (scheme, request.uri().authority()) {
                ("http" | "https", Some(a)) => {
                    let ws = if scheme == "https" { "wss" } else { "ws" };
                    format!("; the daemon's WebSocket there is {ws}://{a}/v1/ws")
                }
                _ => String::new(),
            };
            return Err(failed(
                "client",
                format!("--url {url}: the scheme must be ws or wss (got {scheme:?}){hint}"),
            )
            .into());
        }
        let authority = request.uri().authority().map_or("", |a| a.as_str());
        let port = authority
            .rsplit_once(':')
            .map(|(_, port)| port)
            .filter(|port| !port.contains(']')); // "[::1]" has no port
        if let Some(port) = port.filter(|p| p.parse::<u16>().map_or(true, |p| p == 0)) {
            return Err(failed(
                "client",
                format!("--url {url}: the port must be 1 to 65535 (got {port})"),
            )
            .into());
        }
        if let Some(key) = &endpoint.api_key {
            let value = HeaderValue::from_str(&format!("Bearer {key}"))
                .ok()
                .filter(|_| key.bytes().all(|b| b.is_ascii_graphic()))
                .ok_or_else(|| {
                    failed(
                        "client",
                        "--api-key must be printable ASCII without spaces".into(),
                    )
                })?;
            request.headers_mut().insert("authorization", value);
        }
        let (ws, _) = tokio_tungstenite::connect_async(request)
            .await
            .map_err(|e| match e {
                WsError::Http(r) if r.status() == 401 => failed(
                    "invalid_api_key",
                    key_refused(url, endpoint.api_key.is_some()),
                ),
                WsError::Http(r) => failed(
                    "connection",
                    format!(
                        "cannot connect to {url}: the server answered HTTP {} instead of a \
                         WebSocket upgrade (is the path /v1/ws?)",
                        r.status()
                    ),
                ),
                WsError::Url(e) => failed("client", format!("--url {url}: {e}")),
                e => failed(
                    "connection",
                    format!("cannot connect to {url}: is inferd running? ({e})"),
                ),
            })?;
        let (sink, stream) = ws.split();
        Ok(Self {
            sink,
            stream,
            pending: None,
        })
    }

    /// Sends one frame; `what` names it in the error.
    ///
    /// A message above the daemon's `server.max_message_bytes` makes the daemon answer
    /// with an error frame and close while the message is still being written; the
    /// write then fails, and the error frame, when it arrived, is what the next
    /// [`Self::next_text`] returns, so the user reads the daemon's reason rather than
    /// "connection reset".
    pub async fn send(&mut self, frame: &Value, what: &str) -> Result<()> {
        let text = frame.to_string();
        let bytes = text.len();
        let Err(e) = self.sink.send(Message::text(text)).await else {
            return Ok(());
        };
        let wait = std::time::Duration::from_secs(2);
        if let Ok(Some(Ok(Message::Text(t)))) = tokio::time::timeout(wait, self.stream.next()).await
        {
            self.pending = Some(t.as_str().to_owned());
            return Ok(());
        }
        Err(e).with_context(|| format!("sending {what} ({bytes} bytes)"))
    }

    /// The next text frame. A closed connection is an error.
    pub async fn next_text(&mut self) -> Result<String> {
        if let Some(text) = self.pending.take() {
            return Ok(text);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    async fn open_error(url: &str, api_key: Option<&str>) -> OpenError {
        let endpoint = Endpoint {
            url: url.into(),
            api_key: api_key.map(Into::into),
        };
        match Connection::open(&endpoint).await {
            Ok(_) => panic!("{url} opened"),
            Err(e) => e.downcast::<OpenError>().expect("an OpenError"),
        }
    }

    #[tokio::test]
    async fn bad_urls_and_keys_are_refused_before_dialing() {
        // Without the check, tungstenite would dial port 80 for these.
        for (port, url) in [
            ("99999", "ws://127.0.0.1:99999/v1/ws"),
            ("0", "ws://127.0.0.1:0/v1/ws"),
        ] {
            let e = open_error(url, None).await;
            assert_eq!(e.tag, "client", "{}", e.message);
            assert_eq!(
                e.message,
                format!("--url {url}: the port must be 1 to 65535 (got {port})")
            );
        }
        let e = open_error("http://127.0.0.1:1/v1/ws", None).await;
        assert_eq!(e.tag, "client", "{}", e.message);
        assert_eq!(
            e.message,
            "--url http://127.0.0.1:1/v1/ws: the scheme must be ws or wss (got \"http\"); \
             the daemon's WebSocket there is ws://127.0.0.1:1/v1/ws"
        );
        let e = open_error("ftp://127.0.0.1:1/", None).await;
        assert_eq!(
            e.message,
            "--url ftp://127.0.0.1:1/: the scheme must be ws or wss (got \"ftp\")"
        );
        for key in ["s\u{e9}cret", "sec ret", "sec\nret"] {
            let e = open_error("ws://127.0.0.1:1/v1/ws", Some(key)).await;
            assert_eq!(
                (e.tag, e.message.as_str()),
                ("client", "--api-key must be printable ASCII without spaces")
            );
        }
    }
}
