//! A minimal HTTP/1.1 client for the benchmark: a POST whose response is a stream of
//! server-sent events, read as it arrives and timestamped per event, and a plain GET.
//! One request per connection (`Connection: close`); the body may be chunked or
//! delimited by the connection's end.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Connects to `addr` (`host:port`) with Nagle's algorithm off.
pub async fn connect(addr: &str) -> Result<TcpStream> {
    let sock = TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    sock.set_nodelay(true)?;
    Ok(sock)
}

/// The events of one streamed response.
pub struct EventStream {
    sock: TcpStream,
    /// When the request was written (events are timed from here).
    pub sent: Instant,
    deadline: Instant,
    timeout: Duration,
    /// Bytes read but not yet decoded (head, chunk framing).
    raw: Vec<u8>,
    /// Decoded body bytes not yet split into events.
    body: Vec<u8>,
    /// `None` until the head is read; then whether the body is chunked.
    chunked: Option<bool>,
    finished: bool,
    events: VecDeque<(f64, String)>,
}

impl EventStream {
    /// Writes `POST path` with a JSON `body` on `sock` (already connected to `addr`) and
    /// returns the stream of its response's events. `timeout` bounds the whole response.
    pub async fn post(
        mut sock: TcpStream,
        addr: &str,
        path: &str,
        body: &str,
        timeout: Duration,
    ) -> Result<Self> {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Accept: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let sent = Instant::now();
        sock.write_all(request.as_bytes())
            .await
            .with_context(|| format!("cannot send to {addr}"))?;
        Ok(EventStream {
            sock,
            sent,
            deadline: sent + timeout,
            timeout,
            raw: Vec::new(),
            body: Vec::new(),
            chunked: None,
            finished: false,
            events: VecDeque::new(),
        })
    }

    /// The next event's `data` (its `data:` lines joined by newlines) with the seconds
    /// from sending to the read that completed it; `None` at the end of the body.
    pub async fn next_event(&mut self) -> Result<Option<(f64, String)>> {
        loop {
            if let Some(e) = self.events.pop_front() {
                return Ok(Some(e));
            }
            if self.finished {
                return Ok(None);
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = tokio::time::timeout_at(self.deadline.into(), self.sock.read(&mut chunk))
                .await
                .map_err(|_| anyhow!("no end of stream within {} s", self.timeout.as_secs()))?
                .context("cannot read the stream")?;
            let at = self.sent.elapsed().as_secs_f64();
            if n == 0 {
                if self.chunked == Some(true) {
                    bail!("the server closed the stream inside a chunked body");
                }
                self.finished = true;
            }
            self.raw.extend_from_slice(&chunk[..n]);
            self.decode()?;
            self.split_events(at);
        }
    }

    /// Moves response bytes from `raw` to `body` (head checked, chunk framing removed).
    fn decode(&mut self) -> Result<()> {
        if self.chunked.is_none() {
            let Some(end) = find(&self.raw, b"\r\n\r\n") else {
                if self.finished {
                    bail!("the server closed the connection before a response head");
                }
                return Ok(());
            };
            let head = String::from_utf8_lossy(&self.raw[..end]).into_owned();
            if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
                let rest = String::from_utf8_lossy(&self.raw[end + 4..]).into_owned();
                bail!("HTTP error: {} {rest}", head.lines().next().unwrap_or(""));
            }
            self.chunked = Some(head.lines().any(|l| {
                l.to_ascii_lowercase()
                    .starts_with("transfer-encoding: chunked")
            }));
            self.raw.drain(..end + 4);
        }
        if self.chunked == Some(false) {
            self.body.append(&mut self.raw);
            return Ok(());
        }
        // "<hex size>[;ext]\r\n<data>\r\n" ... "0\r\n\r\n".
        while let Some(line_end) = find(&self.raw, b"\r\n") {
            let size_text = String::from_utf8_lossy(&self.raw[..line_end]).into_owned();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| anyhow!("bad chunk size {size_text:?}"))?;
            if self.raw.len() < line_end + 2 + size + 2 {
                break;
            }
            self.body
                .extend_from_slice(&self.raw[line_end + 2..line_end + 2 + size]);
            self.raw.drain(..line_end + 2 + size + 2);
            if size == 0 {
                self.finished = true;
                break;
            }
        }
        Ok(())
    }

    /// Splits complete events (ended by a blank line) off `body`.
    fn split_events(&mut self, at: f64) {
        loop {
            let lf = find(&self.body, b"\n\n").map(|i| (i, 2));
            let crlf = find(&self.body, b"\r\n\r\n").map(|i| (i, 4));
            let end = match (lf, crlf) {
                (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
                (a, b) => a.or(b),
            };
            let Some((end, sep)) = end else {
                if self.finished && !self.body.iter().all(u8::is_ascii_whitespace) {
                    let event = String::from_utf8_lossy(&self.body).into_owned();
                    self.push_event(at, &event);
                    self.body.clear();
                }
                return;
            };
            let event = String::from_utf8_lossy(&self.body[..end]).into_owned();
            self.body.drain(..end + sep);
            self.push_event(at, &event);
        }
    }

    fn push_event(&mut self, at: f64, event: &str) {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if !data.is_empty() {
            self.events.push_back((at, data.join("\n")));
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// `GET path` on `addr` (blocking, for start-up checks): the status code and the body.
pub fn get(addr: &str, path: &str, timeout: Duration) -> Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut sock =
        std::net::TcpStream::connect(addr).with_context(|| format!("cannot connect to {addr}"))?;
    sock.set_read_timeout(Some(timeout))?;
    sock.set_write_timeout(Some(timeout))?;
    write!(
        sock,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    sock.read_to_end(&mut raw)
        .with_context(|| format!("cannot read GET {path}"))?;
    let end = find(&raw, b"\r\n\r\n").ok_or_else(|| anyhow!("no response head"))?;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {head:?}"))?;
    let mut body = raw[end + 4..].to_vec();
    if head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    }) {
        let mut out = Vec::new();
        while let Some(line_end) = find(&body, b"\r\n") {
            let size_text = String::from_utf8_lossy(&body[..line_end]).into_owned();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| anyhow!("bad chunk size {size_text:?}"))?;
            if size == 0 || body.len() < line_end + 2 + size {
                break;
            }
            out.extend_from_slice(&body[line_end + 2..line_end + 2 + size]);
            body.drain(..(line_end + 4 + size).min(body.len()));
        }
        body = out;
    }
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    async fn serve_once(response: &'static [&'static [u8]]) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf).await;
            for part in response {
                sock.write_all(part).await.unwrap();
                sock.flush().await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        addr
    }

    async fn events_of(addr: &str) -> Vec<String> {
        let sock = connect(addr).await.unwrap();
        let mut s = EventStream::post(sock, addr, "/x", "{}", Duration::from_secs(5))
            .await
            .unwrap();
        let mut out = Vec::new();
        while let Some((_, e)) = s.next_event().await.unwrap() {
            out.push(e);
        }
        out
    }

    #[tokio::test]
    async fn chunked_events_split_across_reads() {
        let addr = serve_once(&[
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"11\r\ndata: {\"a\":1}\n\nda\r\n",
            b"b\r\nta: {\"b\":2}\r\n",
            b"2\r\n\n\n\r\n0\r\n\r\n",
        ])
        .await;
        assert_eq!(events_of(&addr).await, ["{\"a\":1}", "{\"b\":2}"]);
    }

    #[tokio::test]
    async fn close_delimited_body() {
        let addr = serve_once(&[
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n",
            b"data: one\n\ndata: two\n\n",
        ])
        .await;
        assert_eq!(events_of(&addr).await, ["one", "two"]);
    }
}
