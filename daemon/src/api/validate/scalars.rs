//! Scalar reading shared by the validators: numbers with their text as sent, integers
//! classified by range, token-id arrays, and client values quoted back in messages.

use serde_json::{Number, Value};

use super::VResult;
use crate::api::body::{Int, Num};
use crate::error::InferError;

/// Longest rendering of a client value quoted back in an error message.
const MAX_QUOTED_CHARS: usize = 64;

/// `field`'s items as token ids, each an integer below `vocab_size`.
pub(super) fn token_ids(field: &str, items: &[Value], vocab_size: usize) -> VResult<Vec<u32>> {
    let name = field;
    // Ids are u32 on the wire; a vocabulary never exceeds that.
    let limit = u64::try_from(vocab_size)
        .unwrap_or(u64::MAX)
        .min(u64::from(u32::MAX) + 1);
    let mut token_ids = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let field = format!("{name}[{i}]");
        let id = match integer(&field, item)? {
            IntClass::Unsigned(n) if n < limit => n,
            IntClass::Negative => {
                return Err(InferError::validation(format!(
                    "{field} must be >= 0 (got {})",
                    quote(item)
                )))
            }
            IntClass::Unsigned(_) | IntClass::TooLarge => {
                return Err(InferError::validation(format!(
                    "{field} must be < the vocabulary size {vocab_size} (got {})",
                    quote(item)
                )))
            }
        };
        token_ids.push(u32::try_from(id).unwrap_or(u32::MAX));
    }
    Ok(token_ids)
}

/// A number field as `f64` plus its text as sent. (Only `arbitrary_precision` builds
/// could yield no `f64`; that reads as NaN, which every bound refuses.)
pub(super) fn number(v: &Num) -> (f64, String) {
    (v.0.as_f64().unwrap_or(f64::NAN), v.0.to_string())
}

/// A JSON value that must be a number (inside a structured field), as [`number`], or
/// a type error naming `field`.
pub(super) fn number_value(field: &str, v: &Value) -> VResult<(f64, String)> {
    match v {
        Value::Number(n) => Ok(number(&Num(n.clone()))),
        other => Err(InferError::validation(format!(
            "{field} must be a number (got {})",
            quote(other)
        ))),
    }
}

/// Classification of a JSON number expected to be an integer.
pub(super) enum IntClass {
    /// Fits a `u64`.
    Unsigned(u64),
    /// Below zero (any magnitude).
    Negative,
    /// An integer above `u64::MAX`.
    TooLarge,
}

/// Reads an integer from a JSON value: a non-number is a type error naming `field`.
pub(super) fn integer(field: &str, v: &Value) -> VResult<IntClass> {
    match v {
        Value::Number(n) => integer_number(field, n),
        _ => Err(InferError::validation(format!(
            "{field} must be an integer (got {})",
            quote(v)
        ))),
    }
}

/// Reads an integer literal. Integers beyond the 64-bit range arrive as floats; they
/// are classified by sign. Other non-integral numbers (`1.5`, `40.0`, `1e3`) are type
/// errors.
pub(super) fn integer_number(field: &str, n: &Number) -> VResult<IntClass> {
    if let Some(u) = n.as_u64() {
        return Ok(IntClass::Unsigned(u));
    }
    if n.as_i64().is_some() {
        return Ok(IntClass::Negative);
    }
    // An integer literal outside [-2^63, 2^64) overflows to a float; a float literal
    // (`40.0`, `1e3`, `1.5`) stays a type error.
    const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
    const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;
    let f = n.as_f64().unwrap_or(f64::NAN);
    if f.fract() == 0.0 || f.is_infinite() {
        if f >= TWO_POW_64 {
            return Ok(IntClass::TooLarge);
        }
        if f <= -TWO_POW_63 {
            return Ok(IntClass::Negative);
        }
    }
    Err(InferError::validation(format!(
        "{field} must be an integer (got {n})"
    )))
}

/// An integer field in `[min, max]`. `max_label` precedes `max` in the message
/// (e.g. `"the vocabulary size "`).
pub(super) fn unsigned(field: &str, v: &Int, min: u64, max: u64, max_label: &str) -> VResult<u64> {
    let given = &v.0;
    let too_small = || InferError::validation(format!("{field} must be >= {min} (got {given})"));
    let too_large =
        || InferError::validation(format!("{field} must be <= {max_label}{max} (got {given})"));
    match integer_number(field, given)? {
        IntClass::Negative => Err(too_small()),
        IntClass::TooLarge => Err(too_large()),
        IntClass::Unsigned(n) if n < min => Err(too_small()),
        IntClass::Unsigned(n) if n > max => Err(too_large()),
        IntClass::Unsigned(n) => Ok(n),
    }
}

/// Compact JSON of a client value for an error message, cut to a readable length.
pub fn quote(v: &Value) -> String {
    shorten(v.to_string())
}

/// A string as a JSON string literal, cut to a readable length.
pub(super) fn quote_str(s: &str) -> String {
    quote(&Value::String(s.to_owned()))
}

pub(super) fn shorten(text: String) -> String {
    match text.char_indices().nth(MAX_QUOTED_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}
