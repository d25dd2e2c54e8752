//! `models`: the base model and the LoRA adapters the daemon serves, from
//! `GET /v1/models` on the WebSocket's host and port (the `/ws` of `--url` becomes
//! `/models`), printed for people or, with `--json`, as the daemon's body.
//!
//! The request is one plain HTTP/1.1 `GET` with `Connection: close` (the CLI has no
//! TLS, as for the WebSocket): the answer is read to the end of the connection.

use std::fmt::Write as _;
use std::io::Write;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::http::Uri;

use crate::answer::ServerError;
use crate::connection::{Endpoint, OpenError};

/// Where `GET /v1/models` goes for a WebSocket URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `HOST:PORT` to dial (an IPv6 host in brackets).
    pub address: String,
    /// The `Host` header: the URL's authority.
    pub host: String,
    /// `/v1/models` (with any prefix the WebSocket path had).
    pub path: String,
}

impl Target {
    /// `http://HOST:PORT/v1/models`, for messages.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.host, self.path)
    }
}

/// The models endpoint next to the WebSocket at `url` (`ws://HOST[:PORT]/…/ws`).
pub fn target(url: &str) -> Result<Target, OpenError> {
    let failed = |message: String| OpenError {
        tag: "client",
        message: format!("--url {url}: {message}"),
    };
    let uri: Uri = url
        .parse()
        .map_err(|e| failed(format!("not a WebSocket URL ({e})")))?;
    match uri.scheme_str() {
        Some("ws") => {}
        Some("wss") => {
            return Err(failed(
                "inferd-cli speaks plain ws:// and http:// only (no TLS)".into(),
            ))
        }
        other => {
            let hint = match (other, uri.authority()) {
                (Some("http"), Some(a)) => {
                    format!("; the daemon's WebSocket there is ws://{a}/v1/ws")
                }
                _ => String::new(),
            };
            return Err(failed(format!(
                "the scheme must be ws (got {:?}){hint}",
                other.unwrap_or("")
            )));
        }
    }
    let authority = uri.authority().map_or("", |a| a.as_str());
    let host = uri.host().unwrap_or("");
    if host.is_empty() || authority.contains('@') {
        return Err(failed("expected ws://HOST:PORT/v1/ws".into()));
    }
    // http's Uri has no port for one it cannot read as u16: read the authority's own.
    let port = match authority
        .rsplit_once(':')
        .map(|(_, port)| port)
        .filter(|port| !port.contains(']')) // "[::1]" has no port
    {
        None => 80,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => return Err(failed(format!("the port must be 1 to 65535 (got {p})"))),
        },
    };
    let Some(prefix) = uri.path().strip_suffix("/ws") else {
        return Err(failed(format!(
            "the path must end in /ws (as /v1/ws does) to find /v1/models beside it (got {:?})",
            uri.path()
        )));
    };
    Ok(Target {
        address: format!("{host}:{port}"),
        host: authority.to_owned(),
        path: format!("{prefix}/models"),
    })
}

/// The `GET` request for `target`, with the API key as a bearer token.
pub fn request_text(target: &Target, api_key: Option<&str>) -> Result<String, OpenError> {
    let mut text = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\nUser-Agent: inferd-cli\r\n",
        target.path, target.host
    );
    if let Some(key) = api_key {
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(OpenError {
                tag: "client",
                message: "--api-key must be printable ASCII without spaces".into(),
            });
        }
        let _ = write!(text, "Authorization: Bearer {key}\r\n");
    }
    text.push_str("Connection: close\r\n\r\n");
    Ok(text)
}

/// An HTTP response: the status code and the body (de-chunked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// `200`, `401`, …
    pub status: u16,
    /// The body's bytes.
    pub body: Vec<u8>,
}

/// Parses a whole HTTP/1.1 response as read until the server closed the connection.
pub fn parse_response(bytes: &[u8]) -> Result<Response> {
    let end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("the server's answer is not HTTP (no end of headers)")?;
    let head = String::from_utf8_lossy(&bytes[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = status_line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse::<u16>().ok())
        .with_context(|| format!("the server's answer is not HTTP: {status_line:?}"))?;
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .with_context(|| format!("bad Content-Length {value:?}"))?,
            );
        }
    }
    let rest = &bytes[end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(n) = length {
        if rest.len() < n {
            bail!(
                "the server closed the connection after {} of {n} body bytes",
                rest.len()
            );
        }
        rest[..n].to_vec()
    } else {
        rest.to_vec()
    };
    Ok(Response { status, body })
}

/// The body of a `Transfer-Encoding: chunked` message (trailers ignored).
fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("a chunk size line is cut off")?;
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        if rest.len() < size {
            bail!("a chunk is cut off");
        }
        body.extend_from_slice(&rest[..size]);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
}

/// Fetches `GET /v1/models` and returns the body's text. HTTP 401 is an
/// [`OpenError`] (`invalid_api_key`) as for the WebSocket; any other refusal is a
/// [`ServerError`] with the daemon's `error.code` as its tag (`loading`, …).
pub async fn fetch(endpoint: &Endpoint) -> Result<String> {
    let target = target(&endpoint.url)?;
    let request = request_text(&target, endpoint.api_key.as_deref())?;
    let url = target.url();
    let unreachable = |e: std::io::Error| OpenError {
        tag: "connection",
        message: format!("cannot connect to {url}: is inferd running? ({e})"),
    };
    let mut stream = TcpStream::connect(&target.address)
        .await
        .map_err(unreachable)?;
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(unreachable)?;
    let mut bytes = Vec::new();
    stream
        .read_to_end(&mut bytes)
        .await
        .with_context(|| format!("reading the answer of {url}"))?;
    let response = parse_response(&bytes).with_context(|| format!("GET {url}"))?;
    let text = String::from_utf8_lossy(&response.body).into_owned();
    if response.status == 200 {
        return Ok(text);
    }
    let error = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v.get("error").cloned());
    let field = |key: &str| {
        error
            .as_ref()
            .and_then(|e| e.get(key))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    if response.status == 401 {
        return Err(OpenError {
            tag: "invalid_api_key",
            message: crate::connection::key_refused(&url, endpoint.api_key.is_some()),
        }
        .into());
    }
    let tag = field("code").unwrap_or_else(|| format!("http_{}", response.status));
    let message = match field("message") {
        Some(m) => format!("{m} (HTTP {} from {url})", response.status),
        None => format!("HTTP {} from {url}: {}", response.status, text.trim()),
    };
    Err(ServerError {
        error: json!({"type": tag, "message": message}),
    }
    .into())
}

/// Fetches the models and prints them to `out`: the body as received with `json`
/// (or a refusal as `{"error": …}`), else a table.
pub async fn run(endpoint: &Endpoint, json: bool, out: &mut impl Write) -> Result<()> {
    match fetch(endpoint).await {
        Ok(text) if json => writeln!(out, "{}", text.trim_end())?,
        Ok(text) => {
            let body: Value = serde_json::from_str(&text)
                .with_context(|| format!("the daemon's /v1/models is not JSON: {text}"))?;
            write!(out, "{}", render(&body))?;
        }
        Err(e) => {
            if json {
                if let Some(server) = e.downcast_ref::<ServerError>() {
                    writeln!(out, "{}", server.to_json())?;
                    out.flush()?;
                }
            }
            return Err(e);
        }
    }
    out.flush()?;
    Ok(())
}

/// The `/v1/models` list for people: the base model (`parent` null) and each LoRA
/// adapter with its file, then how to pick one.
pub fn render(body: &Value) -> String {
    let field = |m: &Value, key: &str| m.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
    let models: Vec<&Value> = body
        .get("data")
        .and_then(Value::as_array)
        .map(|d| d.iter().collect())
        .unwrap_or_default();
    let rows: Vec<[String; 3]> = models
        .iter()
        .map(|m| {
            if m.get("parent").is_none_or(Value::is_null) {
                [field(m, "id"), "base model".into(), String::new()]
            } else {
                [field(m, "id"), "LoRA adapter".into(), field(m, "root")]
            }
        })
        .collect();
    let adapters = rows.iter().filter(|r| r[1] != "base model").count();
    let header = ["NAME", "KIND", "PATH"].map(String::from);
    let width = |i| crate::info::column_width(&rows, &header, i);
    let (w0, w1) = (width(0), width(1));
    let mut text = String::new();
    for [name, kind, path] in [&header].into_iter().chain(&rows) {
        let line = format!("{name:<w0$}  {kind:<w1$}  {path}");
        let _ = writeln!(text, "{}", line.trim_end());
    }
    if adapters == 0 {
        let _ = writeln!(
            text,
            "no LoRA adapters loaded (the daemon's [lora] adapters, --lora-modules, or \
             POST /v1/load_lora_adapter add them)"
        );
    } else {
        let _ = writeln!(
            text,
            "chat and complete use an adapter with --adapter NAME (--lora-scale X scales it)"
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::*;

    #[test]
    fn the_models_url_is_beside_the_websocket() {
        let t = target("ws://127.0.0.1:8080/v1/ws").expect("target");
        assert_eq!(
            t,
            Target {
                address: "127.0.0.1:8080".into(),
                host: "127.0.0.1:8080".into(),
                path: "/v1/models".into()
            }
        );
        assert_eq!(t.url(), "http://127.0.0.1:8080/v1/models");
        let t = target("ws://[::1]/proxy/inferd/v1/ws").expect("target");
        assert_eq!(
            (t.address.as_str(), t.host.as_str(), t.path.as_str()),
            ("[::1]:80", "[::1]", "/proxy/inferd/v1/models")
        );
        for (url, message) in [
            ("wss://h/v1/ws", "no TLS"),
            (
                "http://h:1/v1/ws",
                "the scheme must be ws (got \"http\"); the daemon's WebSocket there is \
                 ws://h:1/v1/ws",
            ),
            (
                "ws://h:99999/v1/ws",
                "the port must be 1 to 65535 (got 99999)",
            ),
            ("ws://h:0/v1/ws", "the port must be 1 to 65535 (got 0)"),
            ("ws://h:1/v1/chat", "the path must end in /ws"),
        ] {
            let e = target(url).expect_err(url);
            assert_eq!(e.tag, "client");
            assert!(
                e.message.starts_with(&format!("--url {url}: ")) && e.message.contains(message),
                "{url}: {}",
                e.message
            );
        }
    }

    #[test]
    fn the_request_carries_the_key() {
        let t = target("ws://localhost:9/v1/ws").expect("target");
        assert_eq!(
            request_text(&t, Some("k3y")).expect("request"),
            "GET /v1/models HTTP/1.1\r\nHost: localhost:9\r\nAccept: application/json\r\n\
             User-Agent: inferd-cli\r\nAuthorization: Bearer k3y\r\nConnection: close\r\n\r\n"
        );
        assert!(!request_text(&t, None)
            .expect("request")
            .contains("Authorization"));
        let e = request_text(&t, Some("sec ret")).expect_err("a space");
        assert_eq!(e.tag, "client");
    }

    #[test]
    fn responses_parse_with_length_chunks_or_neither() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").expect("ok");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"{}"[..]));
        let r = parse_response(
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=1\r\n\":1}\r\n0\r\n\r\n",
        )
        .expect("chunked");
        assert_eq!((r.status, r.body.as_slice()), (404, &b"{\"a\":1}"[..]));
        let r = parse_response(b"HTTP/1.0 503 Service Unavailable\r\n\r\nbusy").expect("to eof");
        assert_eq!((r.status, r.body.as_slice()), (503, &b"busy"[..]));
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}").is_err());
    }

    const MODELS: &str = r#"{"object":"list","data":[
        {"id":"SmolLM2-135M-Instruct.Q4_1","object":"model","created":1,"owned_by":"inferd","root":"SmolLM2-135M-Instruct.Q4_1","parent":null},
        {"id":"sql","object":"model","created":1,"owned_by":"inferd","root":"/lora/sql.gguf","parent":"SmolLM2-135M-Instruct.Q4_1"}]}"#;

    #[test]
    fn models_are_a_table() {
        let body: Value = serde_json::from_str(MODELS).expect("json");
        assert_eq!(
            render(&body),
            "\
NAME                        KIND          PATH
SmolLM2-135M-Instruct.Q4_1  base model
sql                         LoRA adapter  /lora/sql.gguf
chat and complete use an adapter with --adapter NAME (--lora-scale X scales it)
"
        );
        let base_only = json!({"object": "list", "data": [body["data"][0]]});
        assert!(render(&base_only).contains("\nno LoRA adapters loaded"));
    }

    /// A fake daemon answering one HTTP request with `response`; returns its WebSocket
    /// URL and the request it got.
    async fn fake_http(response: String) -> (String, tokio::sync::oneshot::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.expect("accept");
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.ends_with(b"\r\n\r\n") {
                let n = tcp.read(&mut buf).await.expect("read");
                assert!(n > 0, "the client closed early");
                request.extend_from_slice(&buf[..n]);
            }
            let _ = tx.send(String::from_utf8(request).expect("utf8"));
            tcp.write_all(response.as_bytes()).await.expect("write");
        });
        (format!("ws://{addr}/v1/ws"), rx)
    }

    fn http(status: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    fn endpoint(url: &str, key: Option<&str>) -> Endpoint {
        Endpoint {
            url: url.into(),
            api_key: key.map(Into::into),
        }
    }

    #[tokio::test]
    async fn models_are_fetched_and_printed() {
        let (url, request) = fake_http(http("200 OK", MODELS)).await;
        let mut out = Vec::new();
        run(&endpoint(&url, Some("k")), false, &mut out)
            .await
            .expect("listed");
        let request = request.await.expect("request");
        assert!(
            request.starts_with("GET /v1/models HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(
            request.contains("\r\nAuthorization: Bearer k\r\n"),
            "{request}"
        );
        let out = String::from_utf8(out).expect("utf8");
        assert!(
            out.contains("\nsql                         LoRA adapter  /lora/sql.gguf\n"),
            "{out}"
        );

        let (url, _) = fake_http(http("200 OK", MODELS)).await;
        let mut out = Vec::new();
        run(&endpoint(&url, None), true, &mut out)
            .await
            .expect("listed");
        let printed: Value = serde_json::from_slice(&out).expect("one JSON body");
        assert_eq!(printed["data"][1]["id"], "sql");
    }

    #[tokio::test]
    async fn refusals_name_the_daemons_error() {
        let body = r#"{"error":{"message":"missing API key: this daemon requires \"Authorization: Bearer <key>\" (server.api_key)","type":"authentication_error","param":null,"code":"invalid_api_key"}}"#;
        let (url, _) = fake_http(http("401 Unauthorized", body)).await;
        let e = run(&endpoint(&url, None), true, &mut Vec::new())
            .await
            .expect_err("401");
        let open = e.downcast_ref::<OpenError>().expect("an OpenError");
        assert_eq!(open.tag, "invalid_api_key");
        assert!(
            open.message.contains("requires an API key"),
            "{}",
            open.message
        );

        let body = r#"{"error":{"message":"the model is still loading; retry when GET /ready answers 200","type":"overloaded_error","param":null,"code":"loading"}}"#;
        let (url, _) = fake_http(http("503 Service Unavailable", body)).await;
        let mut out = Vec::new();
        let e = run(&endpoint(&url, None), true, &mut out)
            .await
            .expect_err("503");
        let server = e.downcast_ref::<ServerError>().expect("a ServerError");
        assert_eq!(server.tag(), "loading");
        assert!(server.message().starts_with("the model is still loading"));
        let printed: Value = serde_json::from_slice(&out).expect("the error as JSON");
        assert_eq!(printed["error"]["type"], "loading");
    }
}
