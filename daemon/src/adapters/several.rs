//! Loads and unloads across the registries of several engines (`[[engines]]`): every
//! engine keeps its own resident set on its own device, under the same names. A load
//! reaches all or none; an unload is refused while any engine's requests hold the
//! adapter.

use std::path::Path;
use std::sync::Arc;

use super::{AdapterInfo, AdapterRegistry, UnloadError};
use crate::model::lora::LoraError;

/// Loads `path` as `name` into every registry (file reading: off the async executor);
/// when one refuses, those already loaded drop it again. Returns the first registry's
/// entry.
///
/// # Errors
/// The first refusal ([`AdapterRegistry::register`]).
pub fn register_all(
    registries: &[Arc<AdapterRegistry>],
    name: &str,
    path: &Path,
) -> Result<AdapterInfo, LoraError> {
    let mut first = None;
    for (i, r) in registries.iter().enumerate() {
        match r.register(name, path) {
            Ok(info) => {
                first.get_or_insert(info);
            }
            Err(e) => {
                for done in &registries[..i] {
                    let _ = done.unregister(name);
                }
                return Err(e);
            }
        }
    }
    first.ok_or_else(|| LoraError {
        adapter: name.into(),
        message: "no engine to load it into".into(),
    })
}

/// Unloads `name` from every registry, after checking that no engine's requests hold
/// it (a request placed in between keeps its own engine's entry: the lease check of
/// that registry refuses it, and the others are unloaded).
///
/// # Errors
/// [`UnloadError::NotFound`] when the first registry lacks it; [`UnloadError::InUse`]
/// with the requests of all engines while any holds it.
pub fn unregister_all(registries: &[Arc<AdapterRegistry>], name: &str) -> Result<(), UnloadError> {
    if !registries.first().is_some_and(|r| r.contains(name)) {
        return Err(UnloadError::NotFound(name.into()));
    }
    let active: usize = registries
        .iter()
        .filter_map(|r| r.info(name))
        .map(|i| i.active)
        .sum();
    if active > 0 {
        return Err(UnloadError::InUse {
            name: name.into(),
            active,
        });
    }
    let mut result = Ok(());
    for r in registries {
        match r.unregister(name) {
            Ok(()) | Err(UnloadError::NotFound(_)) => {}
            Err(e) => result = Err(e),
        }
    }
    result
}
