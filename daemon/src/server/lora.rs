//! `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter` (vLLM's bodies,
//! `vllm/entrypoints/openai/protocol.py` `LoadLoRAAdapterRequest` /
//! `UnloadLoRAAdapterRequest`: `lora_name`, `lora_path`), behind the API key like every
//! `/v1/` route. Success answers 200 with a line of text, as vLLM does; a refusal is an
//! OpenAI-style error naming the field and value: 400 for a bad body or an adapter that
//! does not load or fit, 404 for an unknown name, 409 while requests use it.

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::Value;

use super::http::{error, error_with_param, full, Body};
use super::openai::read_body;
use super::Engine;
use crate::adapters::UnloadError;
use crate::model::source::quote;

/// An error whose OpenAI `param` is the body field the message starts with
/// (`lora_name`, `lora_path`), where the generate endpoints' field list does not know
/// them.
fn refusal(status: StatusCode, kind: &str, code: &str, message: &str) -> Response<Body> {
    let field = message
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .next()
        .filter(|w| matches!(*w, "lora_name" | "lora_path"));
    error_with_param(status, kind, code, message, field)
}

fn bad(message: &str) -> Response<Body> {
    refusal(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "validation",
        message,
    )
}

fn ok_text(message: String) -> Response<Body> {
    let mut r = Response::new(full(message));
    *r.status_mut() = StatusCode::OK;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The body's string fields `fields` (`lora_path` optional when not listed as
/// required); any other key is refused.
fn fields(
    bytes: &[u8],
    required: &[&str],
    optional: &[&str],
) -> Result<Vec<Option<String>>, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| {
        format!(
            "malformed JSON in the request body: {}",
            crate::api::validate::json_error(&e)
        )
    })?;
    let Value::Object(o) = v else {
        return Err("the request body must be a JSON object".into());
    };
    let all: Vec<&str> = required.iter().chain(optional).copied().collect();
    if let Some(k) = o.keys().find(|k| !all.contains(&k.as_str())) {
        return Err(format!(
            "unknown field {}; this endpoint accepts {}",
            quote(k),
            all.join(", ")
        ));
    }
    all.iter()
        .map(|&f| match o.get(f) {
            None | Some(Value::Null) if required.contains(&f) => Err(format!("{f} is required")),
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(format!(
                "{f} must be a string (got {})",
                quote(&other.to_string())
            )),
        })
        .collect()
}

/// `POST /v1/load_lora_adapter {lora_name, lora_path}`: loads and checks the adapter
/// (on a blocking thread), then requests may name it.
pub async fn load(req: Request<Incoming>, engine: &Engine) -> Response<Body> {
    let bytes = match read_body(req, engine.max_message_bytes).await {
        Ok(b) => b,
        Err(r) => return *r.0,
    };
    let f = match fields(&bytes, &["lora_name", "lora_path"], &[]) {
        Ok(f) => f,
        Err(m) => return bad(&m),
    };
    let (Some(name), Some(path)) = (f[0].clone(), f[1].clone()) else {
        return bad("lora_name and lora_path are required");
    };
    if let Err(m) = engine.adapters.check_new_name(&name) {
        return bad(&m);
    }
    let registries = engine.adapter_registries();
    let (n, p) = (name.clone(), path.clone());
    let loaded = tokio::task::spawn_blocking(move || {
        crate::adapters::several::register_all(&registries, &n, std::path::Path::new(&p))
    })
    .await;
    match loaded {
        Ok(Ok(info)) => {
            tracing::info!(adapter = %name, path = %path, rank = info.rank, "LoRA adapter loaded (API)");
            ok_text(format!(
                "Success: LoRA adapter '{name}' added successfully.\n"
            ))
        }
        // Taken meanwhile by a concurrent load: the name's message, as above.
        Ok(Err(e)) if e.message.starts_with("lora_name") => bad(&e.message),
        Ok(Err(e)) => bad(&format!("lora_path {}: {e}", quote(&path))),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal",
            &format!("loading the adapter failed: {e}"),
        ),
    }
}

/// `POST /v1/unload_lora_adapter {lora_name}` (vLLM also sends `lora_int_id`, which is
/// accepted and ignored).
pub async fn unload(req: Request<Incoming>, engine: &Engine) -> Response<Body> {
    let bytes = match read_body(req, engine.max_message_bytes).await {
        Ok(b) => b,
        Err(r) => return *r.0,
    };
    let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let bytes = match v {
        Value::Object(mut o) => {
            o.remove("lora_int_id");
            Value::Object(o).to_string().into_bytes()
        }
        _ => bytes.to_vec(),
    };
    let f = match fields(&bytes, &["lora_name"], &[]) {
        Ok(f) => f,
        Err(m) => return bad(&m),
    };
    let Some(name) = f[0].clone() else {
        return bad("lora_name is required");
    };
    match crate::adapters::several::unregister_all(&engine.adapter_registries(), &name) {
        Ok(()) => {
            tracing::info!(adapter = %name, "LoRA adapter unloaded (API)");
            ok_text(format!(
                "Success: LoRA adapter '{name}' removed successfully.\n"
            ))
        }
        Err(e @ UnloadError::NotFound(_)) => refusal(
            StatusCode::NOT_FOUND,
            "not_found_error",
            "model_not_found",
            &format!("lora_name: {e}"),
        ),
        Err(e @ UnloadError::InUse { .. }) => refusal(
            StatusCode::CONFLICT,
            "conflict_error",
            "adapter_in_use",
            &format!("lora_name: {e}"),
        ),
    }
}
