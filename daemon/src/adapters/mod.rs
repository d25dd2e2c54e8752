//! LoRA adapters while serving: which adapters the daemon knows by name (from
//! `[lora]`, `--lora-modules` and `POST /v1/load_lora_adapter`), which of them are
//! resident (at most `lora.max_loras`; loaded on demand, least recently used idle ones
//! evicted), and which requests hold them (a lease per queued or running request, so an
//! adapter in use is never unloaded under it). The weights themselves are
//! [`crate::model::lora::LoraAdapter`]s; the scheduler admits a request once its adapter
//! is resident and hands the runner the adapter with each batch row.

pub mod registry;
pub mod several;

#[cfg(test)]
mod tests;

pub use registry::{
    AdapterInfo, AdapterKey, AdapterLease, AdapterLoads, AdapterRegistry, Residency, UnloadError,
};
