//! HTTP routes (`docs/http-api.md`): the chat page at `/` (in [`super::page`]),
//! `/health`, `/ready`, `/metrics`, the WebSocket upgrade at `/v1/ws`, and the
//! OpenAI-compatible `/v1/*` API (in [`super::openai`]).
//!
//! `/v1/*` requires `Authorization: Bearer <server.api_key>` when a key is set (the
//! WebSocket upgrade also takes it as the subprotocol `inferd.key.<base64url(key)>`,
//! see [`super::subprotocol`]); the page, the probes and `/metrics` stay open (as in
//! vLLM and llama.cpp's server). Every error body under `/v1/` is
//! OpenAI's error JSON: `{"error": {"message", "type", "param", "code"}}`.

use std::convert::Infallible;
use std::rc::Rc;

use bytes::Bytes;
use futures_util::stream::LocalBoxStream;
use http_body_util::{Either, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;

use super::session::{self, WS_PATH};
use super::{openai, page, subprotocol, Engine, State};
use crate::error::{ErrorKind, InferError};
use crate::metrics::metrics;

/// The frames of a streamed body (server-sent events); not `Send`: it lives on the
/// actix system thread with the request it streams.
pub type FrameStream = LocalBoxStream<'static, Result<Frame<Bytes>, Infallible>>;

/// A response body: whole, or streamed.
pub type Body = Either<Full<Bytes>, StreamBody<FrameStream>>;

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Either::Left(Full::new(bytes.into()))
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// A JSON response.
pub fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(full(value.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// An error in OpenAI's shape; `code` is inferd's error tag (`validation`, ...) or an
/// HTTP-level code (`invalid_api_key`, `not_found`, ...).
pub fn error(status: StatusCode, kind: &str, code: &str, message: &str) -> Response<Body> {
    error_with_param(status, kind, code, message, error_param(message).as_deref())
}

/// [`error`] with the OpenAI `param` given (`None`: null).
pub fn error_with_param(
    status: StatusCode,
    kind: &str,
    code: &str,
    message: &str,
    param: Option<&str>,
) -> Response<Body> {
    let mut r = json(
        status,
        &serde_json::json!({
            "error": { "message": message, "type": kind, "param": param, "code": code }
        }),
    );
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    r
}

/// OpenAI's `param`: the request field a validation message is about. Messages name
/// it first (`tools[0].function.name must be …`, `logit_bias key "7" must …`,
/// `response_format.json_schema.schema: …`); `None` when the first word is not a path
/// into a known request field.
pub fn error_param(message: &str) -> Option<String> {
    let is_path = |word: &str| {
        let root = word.split(['.', '[']).next().unwrap_or("");
        word.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']' | '"'))
            && crate::api::validate::is_request_field(root)
    };
    // `unknown field "x" in tools[0] (allowed: …)` → `tools[0].x`; at the top level
    // (`… in generate message`, or the HTTP edge's `unknown field "x"; …`) → `x`.
    if let Some(rest) = message.strip_prefix("unknown field \"") {
        let (key, after) = rest.split_once('"')?;
        let inside = after
            .strip_prefix(" in ")
            .and_then(|a| a.split_whitespace().next());
        return Some(match inside {
            Some(path) if is_path(path) => format!("{path}.{key}"),
            _ => key.to_string(),
        });
    }
    let word = message.split_whitespace().next()?.trim_end_matches(':');
    is_path(word).then(|| word.to_string())
}

/// The HTTP status and OpenAI error `type` of a request error.
pub fn status_of(kind: ErrorKind) -> (StatusCode, &'static str) {
    match kind {
        ErrorKind::Validation | ErrorKind::ContextLengthExceeded => {
            (StatusCode::BAD_REQUEST, "invalid_request_error")
        }
        ErrorKind::Overloaded => (StatusCode::SERVICE_UNAVAILABLE, "overloaded_error"),
        // A client closing its connection never reads this; a drain that cancels a
        // request before it starts does.
        ErrorKind::Cancelled => (StatusCode::SERVICE_UNAVAILABLE, "cancelled"),
        // The plugin the request named failed (trap, deadline, limit, bad answer): a
        // client error that retrying would repeat (OpenAI clients retry 5xx).
        ErrorKind::PluginTrap => (StatusCode::UNPROCESSABLE_ENTITY, "plugin_error"),
        ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
        ErrorKind::ModelNotFound => (StatusCode::NOT_FOUND, "not_found_error"),
    }
}

/// The error response for a request error.
pub fn infer_error(e: &InferError) -> Response<Body> {
    let (status, kind) = status_of(e.kind);
    error(status, kind, e.kind.as_str(), &e.message)
}

/// Routes one request.
pub async fn route(req: Request<Incoming>, state: Rc<State>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    match path.as_str() {
        "/health" => match method {
            Method::GET | Method::HEAD => text(StatusCode::OK, "ok\n"),
            _ => method_not_allowed("GET, HEAD"),
        },
        "/ready" => match method {
            Method::GET | Method::HEAD if state.is_ready() => text(StatusCode::OK, "ready\n"),
            Method::GET | Method::HEAD if state.engine().is_none() => {
                text(StatusCode::SERVICE_UNAVAILABLE, "loading\n")
            }
            Method::GET | Method::HEAD => text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n"),
            _ => method_not_allowed("GET, HEAD"),
        },
        "/metrics" => match method {
            Method::GET | Method::HEAD => metrics_page(&state).await,
            _ => method_not_allowed("GET, HEAD"),
        },
        p if p.starts_with("/v1/") => v1(req, &state, &method, p).await,
        p => page::serve(&method, p).unwrap_or_else(|| not_found(p)),
    }
}

fn not_found(path: &str) -> Response<Body> {
    error(
        StatusCode::NOT_FOUND,
        "not_found_error",
        "not_found",
        &format!(
            "no route {path}: the endpoints are / (the chat page), /v1/chat/completions, \
             /v1/completions, /v1/models, /v1/models/{{id}}, /v1/load_lora_adapter, \
             /v1/unload_lora_adapter, {WS_PATH} (WebSocket), /health, /ready and /metrics"
        ),
    )
}

/// `405` with an `Allow` header listing `allow`.
pub fn method_not_allowed(allow: &'static str) -> Response<Body> {
    let mut r = error(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method_not_allowed",
        &format!("method not allowed: use {allow}"),
    );
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

async fn metrics_page(state: &State) -> Response<Body> {
    let engine = state.engine();
    let stats = match &engine {
        Some(engine) => engine.stats().await.ok(),
        None => None,
    };
    let adapters = engine
        .as_ref()
        .map(Engine::adapter_registries)
        .unwrap_or_default();
    let mut r = Response::new(full(metrics().render(stats.as_ref(), &adapters)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// Compares the `Authorization` header with the key in constant time (for equal
/// lengths).
fn authorized(req: &Request<Incoming>, key: &str) -> bool {
    bearer(req).is_some_and(|given| same_key(given.trim().as_bytes(), key.as_bytes()))
}

/// The token of an `Authorization: Bearer <token>` header (scheme in any case).
fn bearer(req: &Request<Incoming>) -> Option<&str> {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token)
}

/// Whether `given` is the key, in time independent of where they differ (for equal
/// lengths).
fn same_key(given: &[u8], key: &[u8]) -> bool {
    given.len() == key.len() && given.iter().zip(key).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The subprotocols a WebSocket upgrade offers.
fn ws_offer(req: &Request<Incoming>) -> subprotocol::Offer {
    subprotocol::parse(req.headers().get_all(header::SEC_WEBSOCKET_PROTOCOL))
}

/// Whether a request carries the key: the `Authorization` header, or for the
/// WebSocket upgrade its `inferd.key.` subprotocol (browsers cannot set headers on a
/// WebSocket).
fn has_key(req: &Request<Incoming>, path: &str, key: &str) -> bool {
    authorized(req, key)
        || (path == WS_PATH
            && ws_offer(req)
                .key
                .is_some_and(|given| same_key(&given, key.as_bytes())))
}

async fn v1(
    req: Request<Incoming>,
    state: &Rc<State>,
    method: &Method,
    path: &str,
) -> Response<Body> {
    let key = state.api_key.borrow().clone();
    if let Some(key) = key {
        if !has_key(&req, path, &key) {
            let given = req.headers().contains_key(header::AUTHORIZATION)
                || (path == WS_PATH && ws_offer(&req).key.is_some());
            let message = match (given, path == WS_PATH) {
                (true, false) => {
                    "incorrect API key: send the daemon's server.api_key as \
                     \"Authorization: Bearer <key>\""
                }
                (true, true) => {
                    "incorrect API key: send the daemon's server.api_key as \
                     \"Authorization: Bearer <key>\" or as the subprotocol \
                     \"inferd.key.<base64url of the key>\""
                }
                (false, false) => {
                    "missing API key: this daemon requires \"Authorization: Bearer <key>\" \
                     (server.api_key)"
                }
                (false, true) => {
                    "missing API key: this daemon requires \"Authorization: Bearer <key>\" \
                     or the subprotocol \"inferd.key.<base64url of the key>\" (server.api_key)"
                }
            };
            return error(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid_api_key",
                message,
            );
        }
    }
    let Some(engine) = state.engine() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded_error",
            "loading",
            "the model is still loading; retry when GET /ready answers 200",
        );
    };
    match (path, method) {
        (WS_PATH, &Method::GET) => ws_upgrade(req, state, &engine),
        ("/v1/models", &Method::GET | &Method::HEAD) => models(&engine),
        ("/v1/chat/completions", &Method::POST) => {
            openai::generate(req, state, &engine, openai::Endpoint::Chat).await
        }
        ("/v1/completions", &Method::POST) => {
            openai::generate(req, state, &engine, openai::Endpoint::Completion).await
        }
        ("/v1/load_lora_adapter", &Method::POST) => super::lora::load(req, &engine).await,
        ("/v1/unload_lora_adapter", &Method::POST) => super::lora::unload(req, &engine).await,
        ("/v1/load_lora_adapter" | "/v1/unload_lora_adapter", _) => method_not_allowed("POST"),
        (p, &Method::GET | &Method::HEAD) if p.starts_with("/v1/models/") => {
            model(&engine, &p["/v1/models/".len()..])
        }
        (WS_PATH, _) => method_not_allowed("GET"),
        ("/v1/models", _) => method_not_allowed("GET, HEAD"),
        (p, _) if p.starts_with("/v1/models/") => method_not_allowed("GET, HEAD"),
        ("/v1/chat/completions" | "/v1/completions", _) => method_not_allowed("POST"),
        _ => not_found(path),
    }
}

fn model_object(engine: &Engine) -> serde_json::Value {
    serde_json::json!({
        "id": engine.model_id,
        "object": "model",
        "created": engine.created,
        "owned_by": "inferd",
        "root": engine.model_id,
        "parent": null,
    })
}

/// A LoRA adapter as vLLM lists one: `root` its path, `parent` the base model.
fn adapter_object(engine: &Engine, a: &crate::adapters::AdapterInfo) -> serde_json::Value {
    serde_json::json!({
        "id": a.name,
        "object": "model",
        "created": engine.created,
        "owned_by": "inferd",
        "root": a.path.display().to_string(),
        "parent": engine.model_id,
    })
}

/// `GET /v1/models`: the base model, then each LoRA adapter.
fn models(engine: &Engine) -> Response<Body> {
    let mut data = vec![model_object(engine)];
    data.extend(
        engine
            .adapters
            .list()
            .iter()
            .map(|a| adapter_object(engine, a)),
    );
    json(
        StatusCode::OK,
        &serde_json::json!({ "object": "list", "data": data }),
    )
}

/// `GET /v1/models/{id}` (the `openai` package's `models.retrieve`).
fn model(engine: &Engine, id: &str) -> Response<Body> {
    if id == engine.model_id {
        json(StatusCode::OK, &model_object(engine))
    } else if let Some(a) = engine.adapters.info(id) {
        json(StatusCode::OK, &adapter_object(engine, &a))
    } else {
        error(
            StatusCode::NOT_FOUND,
            "not_found_error",
            "model_not_found",
            &format!(
                "the model {id:?} does not exist; this daemon serves {:?}",
                engine.model_id
            ),
        )
    }
}

fn header_has(req: &Request<Incoming>, name: header::HeaderName, token: &str) -> bool {
    req.headers().get_all(name).iter().any(|v| {
        v.to_str()
            .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

/// A header value as an error message quotes it ([`crate::api::validate::quote`]: a
/// JSON string, bytes that are not UTF-8 replaced, cut to a readable length).
fn quoted(value: &[u8]) -> String {
    crate::api::validate::quote(&serde_json::Value::String(
        String::from_utf8_lossy(value).into_owned(),
    ))
}

/// Answers a WebSocket handshake (RFC 6455 §4.2) and runs the session on the upgraded
/// connection.
fn ws_upgrade(mut req: Request<Incoming>, state: &Rc<State>, engine: &Engine) -> Response<Body> {
    let bad = |m: &str| {
        error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "validation",
            m,
        )
    };
    if !header_has(&req, header::UPGRADE, "websocket")
        || !header_has(&req, header::CONNECTION, "upgrade")
    {
        return bad(&format!(
            "{WS_PATH} is the WebSocket endpoint: send an upgrade request \
             (Connection: Upgrade, Upgrade: websocket)"
        ));
    }
    let version = req.headers().get(header::SEC_WEBSOCKET_VERSION);
    if version.is_none_or(|v| v.as_bytes() != b"13") {
        let got = version.map_or_else(|| "none".to_owned(), |v| quoted(v.as_bytes()));
        let mut r = bad(&format!("Sec-WebSocket-Version must be 13 (got {got})"));
        r.headers_mut().insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        return r;
    }
    let Some(accept) = req
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|k| derive_accept_key(k.as_bytes()))
    else {
        return bad("Sec-WebSocket-Key is missing");
    };
    let Ok(accept) = HeaderValue::from_str(&accept) else {
        return bad("Sec-WebSocket-Key is invalid");
    };
    // A client that offers subprotocols must get one of them back (browsers fail the
    // connection otherwise): the protocol's own, `inferd.v1`.
    let offer = ws_offer(&req);
    if offer.any && !offer.v1 {
        let got = quoted(
            subprotocol::offered_redacted(req.headers().get_all(header::SEC_WEBSOCKET_PROTOCOL))
                .as_bytes(),
        );
        return bad(&format!(
            "Sec-WebSocket-Protocol must include \"{}\" when subprotocols are offered \
             (got {got}; the API key goes in \"{}<base64url of the key>\")",
            subprotocol::PROTOCOL,
            subprotocol::KEY_PREFIX
        ));
    }
    let upgrade = hyper::upgrade::on(&mut req);
    let config = session::ws_config(engine.max_message_bytes);
    let state = state.clone();
    actix_rt::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let ws = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(config),
                )
                .await;
                session::run(ws, state).await;
            }
            Err(e) => tracing::debug!(error = %e, "websocket upgrade failed"),
        }
    });
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    if offer.v1 {
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(subprotocol::PROTOCOL),
        );
    }
    r
}

#[cfg(test)]
mod tests {
    use super::error_param;

    #[test]
    fn param_is_the_field_a_message_starts_with() {
        let p = |m: &str| error_param(m);
        assert_eq!(
            p("tools[0].function.name must be 1 to 64 characters").as_deref(),
            Some("tools[0].function.name")
        );
        assert_eq!(
            p("response_format.json_schema.schema: keyword \"x\"").as_deref(),
            Some("response_format.json_schema.schema")
        );
        assert_eq!(
            p("presence_penalty must be in [-2, 2]").as_deref(),
            Some("presence_penalty")
        );
        assert_eq!(
            p("unknown field \"x\" in tools[0].function (allowed: name)").as_deref(),
            Some("tools[0].function.x")
        );
        assert_eq!(
            p("unknown field \"temprature\"; this endpoint accepts …").as_deref(),
            Some("temprature")
        );
        assert_eq!(
            p("unknown field \"nam\" in messages[0] (allowed: role)").as_deref(),
            Some("messages[0].nam")
        );
        assert_eq!(
            p("unknown field \"x\" in generate message (allowed: …)").as_deref(),
            Some("x")
        );
        assert_eq!(p("malformed JSON in the request body"), None);
        assert_eq!(p("the request body must be a JSON object"), None);
        assert_eq!(p("id must be a string"), None);
    }
}
