//! The two fuzz targets: one input through the edge's entry point
//! (`api::parse_client_message` for a WebSocket text frame, as `server/session.rs`
//! calls it; `api::openai::parse_body` for an HTTP body), checked against what the
//! case must come to.

use serde_json::Value;

use super::mutate::{Case, Want};
use super::oracle::{check_options, check_request};
use super::{Edge, WsMsg, HTTP_ID, MODEL, VOCAB};
use crate::api::openai::{parse_body, BodyError, Endpoint};
use crate::api::{parse_client_message, SamplingDefaults};
use crate::error::ErrorKind;

/// How a case ended, every property holding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Parsed into a request (or message).
    Accepted,
    /// Refused with a validation error.
    Rejected,
}

/// Runs `case` through its edge's entry point with `defaults`; `Err` says which
/// property broke.
pub fn run(case: &Case, defaults: &SamplingDefaults) -> Result<Outcome, String> {
    match case.edge {
        Edge::Ws => run_ws(case, defaults),
        Edge::Chat | Edge::Completion => run_http(case, defaults),
    }
}

fn run_ws(case: &Case, defaults: &SamplingDefaults) -> Result<Outcome, String> {
    let text =
        std::str::from_utf8(&case.bytes).map_err(|e| format!("a text frame is UTF-8: {e}"))?;
    match parse_client_message(text, defaults, VOCAB) {
        Ok(msg) => match &case.want {
            Want::Accept => case.origin.check(&msg).map(|()| Outcome::Accepted),
            Want::Any => Ok(Outcome::Accepted),
            want => Err(format!("accepted, wanted {want:?}: {msg:?}")),
        },
        Err(e) => {
            let frame: Value = serde_json::from_str(&e.to_frame())
                .map_err(|err| format!("error frame is not JSON: {err}"))?;
            if frame["type"] != "error"
                || frame["error"]["type"] != "validation"
                || frame["error"]["message"] != e.error.message.as_str()
                || frame["id"].as_str() != e.id.as_deref()
            {
                return Err(format!("error frame {frame} does not carry {e:?}"));
            }
            let id = match &case.want {
                Want::Malformed => None,
                Want::Reject(f) if f == "id" => None,
                _ => case.origin.id(),
            };
            if case.want != Want::Any && e.id.as_deref() != id {
                return Err(format!(
                    "error id {:?}, wanted {id:?} ({})",
                    e.id, e.error.message
                ));
            }
            refusal(
                &case.want,
                e.error.kind,
                &e.error.message,
                "malformed JSON: ",
            )
        }
    }
}

fn run_http(case: &Case, defaults: &SamplingDefaults) -> Result<Outcome, String> {
    let endpoint = match case.edge {
        Edge::Chat => Endpoint::Chat,
        _ => Endpoint::Completion,
    };
    match parse_body(
        &case.bytes,
        endpoint,
        MODEL,
        HTTP_ID.into(),
        defaults,
        VOCAB,
    ) {
        Ok((request, options)) => match (&case.want, &case.origin) {
            (Want::Accept, WsMsg::Generate(b)) => {
                check_request(b, case.edge, &request)?;
                check_options(b, &options)?;
                Ok(Outcome::Accepted)
            }
            (Want::Any, _) => Ok(Outcome::Accepted),
            (want, _) => Err(format!("accepted, wanted {want:?}: {request:?}")),
        },
        Err(BodyError::Invalid(e)) => refusal(
            &case.want,
            e.kind,
            &e.message,
            "malformed JSON in the request body: ",
        ),
    }
}

/// Checks a refusal against `want`: a validation error with a message, naming the
/// field of a `Reject`, saying "malformed JSON" for a `Malformed`.
fn refusal(
    want: &Want,
    kind: ErrorKind,
    message: &str,
    malformed: &str,
) -> Result<Outcome, String> {
    if kind != ErrorKind::Validation || message.trim().is_empty() {
        return Err(format!("refusal of kind {kind:?} with message {message:?}"));
    }
    match want {
        Want::Accept => Err(format!("refused a valid input: {message}")),
        Want::Reject(field) if !names(message, field) => {
            Err(format!("the message does not name {field:?}: {message}"))
        }
        Want::Malformed if !message.starts_with(malformed) => {
            Err(format!("wanted a malformed-JSON refusal: {message}"))
        }
        _ => Ok(Outcome::Rejected),
    }
}

/// Whether `message` names `field`: as a word (`n must be …`, `messages[2].role …`,
/// `logit_bias["7"] …`), or quoted, for a key that is no identifier.
pub fn names(message: &str, field: &str) -> bool {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    let plain = !field.is_empty() && field.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        return message.match_indices(field).any(|(i, _)| {
            !word(message[..i].chars().next_back())
                && !word(message[i + field.len()..].chars().next())
        });
    }
    let json = serde_json::to_string(field).unwrap_or_default();
    message.contains(&json) || message.contains(&format!("{field:?}"))
}
