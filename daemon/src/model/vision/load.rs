//! Reading a VLM checkpoint's vision side: `config.json` keys with transformers'
//! defaults (a key the config class defaults is optional, a key of the wrong type or
//! value is an error naming it) and the stored tensors, checked for shape and moved to
//! the device as f32.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use crate::model::source::{bounded, quote};
use crate::model::ModelError;

/// A `ModelError::Metadata` for `config.json: {key}`.
pub(super) fn meta(key: &str, message: impl Into<String>) -> ModelError {
    ModelError::Metadata {
        key: format!("config.json: {key}"),
        message: message.into(),
    }
}

/// A JSON value as it may appear in a message (escaped, cut).
pub(super) fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => quote(s),
        other => bounded(&other.to_string()),
    }
}

/// `config.json` read by dotted paths (`vision_config.hidden_size`); `null` counts as absent.
#[derive(Clone, Copy)]
pub(super) struct Config<'a> {
    pub(super) root: &'a Value,
}

impl<'a> Config<'a> {
    /// The value at `key`, if present and not null.
    pub(super) fn get(&self, key: &str) -> Option<&'a Value> {
        key.split('.')
            .try_fold(self.root, |v, part| v.get(part))
            .filter(|v| !v.is_null())
    }

    /// A positive integer at `key`, or `default` when absent (`None`: required).
    pub(super) fn usize(&self, key: &str, default: Option<usize>) -> Result<usize, ModelError> {
        match self.get(key) {
            None => default.ok_or_else(|| meta(key, "missing")),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .filter(|&x| x > 0)
                .ok_or_else(|| {
                    meta(
                        key,
                        format!("expected a positive integer, found {}", shown(v)),
                    )
                }),
        }
    }

    /// A positive finite number at `key`, or `default` when absent.
    pub(super) fn f64(&self, key: &str, default: f64) -> Result<f64, ModelError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| {
                    meta(
                        key,
                        format!("expected a positive number, found {}", shown(v)),
                    )
                }),
        }
    }

    /// A string at `key`, or `default` when absent.
    pub(super) fn str(&self, key: &str, default: &'a str) -> Result<&'a str, ModelError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_str()
                .ok_or_else(|| meta(key, format!("expected a string, found {}", shown(v)))),
        }
    }

    /// A boolean at `key`, or `default` when absent.
    pub(super) fn bool(&self, key: &str, default: bool) -> Result<bool, ModelError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| meta(key, format!("expected true or false, found {}", shown(v)))),
        }
    }
}

/// The vision side's tensors by stored name, taken one by one.
pub(super) struct Weights<'d> {
    tensors: HashMap<String, Tensor>,
    device: &'d Device,
}

impl<'d> Weights<'d> {
    pub(super) fn new(tensors: HashMap<String, Tensor>, device: &'d Device) -> Self {
        Self { tensors, device }
    }

    /// Whether `name` is stored.
    pub(super) fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Axis `axis` of the stored 2-D tensor `name` (a width the vision config does not
    /// give: the text model's hidden size), which must equal `expected` when known.
    pub(super) fn dim2(
        &self,
        name: &str,
        axis: usize,
        expected: Option<usize>,
    ) -> Result<usize, ModelError> {
        let err = |message: String| ModelError::Tensor {
            name: name.to_string(),
            message,
        };
        let dims = self
            .tensors
            .get(name)
            .ok_or_else(|| err("missing".into()))?
            .dims();
        let n = match dims {
            [_, _] => dims[axis.min(1)],
            _ => return Err(err(format!("shape {dims:?}, expected 2 dimensions"))),
        };
        match expected {
            _ if n == 0 => Err(err(format!("shape {dims:?} is empty"))),
            Some(e) if e != n => Err(err(format!(
                "shape {dims:?}: dimension {axis} should be text_config.hidden_size = {e}"
            ))),
            _ => Ok(n),
        }
    }

    /// The tensor `name`, which must have shape `dims`, as f32 on the device.
    pub(super) fn take(&mut self, name: &str, dims: &[usize]) -> Result<Tensor, ModelError> {
        let t = self
            .tensors
            .remove(name)
            .ok_or_else(|| ModelError::Tensor {
                name: name.to_string(),
                message: "missing".into(),
            })?;
        if t.dims() != dims {
            return Err(ModelError::Tensor {
                name: name.to_string(),
                message: format!("shape {:?}, expected {dims:?}", t.dims()),
            });
        }
        let on_device = |t: &Tensor| -> candle_core::Result<Tensor> {
            t.to_device(self.device)?.to_dtype(DType::F32)?.contiguous()
        };
        on_device(&t).map_err(|e| ModelError::Tensor {
            name: name.to_string(),
            message: format!(
                "cannot move to the device as f32: {}",
                crate::model::candle_error_message(&e)
            ),
        })
    }
}
