//! inferd: an LLM inference daemon.
//!
//! Data flows one way (see `README.md`, Layout):
//! `server` → `api` (validation) → `engine` (the handle) → `prepare` (template, ids, chains;
//! the only `Submit`) → `scheduler` → `model_runner` (`model`)
//! → `sampling` → `detokenizer` → the request's own event channel → client.

pub mod adapters;
pub mod allocator;
pub mod api;
pub mod app;
pub mod config;
pub mod detokenizer;
pub mod engine;
pub mod error;
pub mod kv_events;
pub mod metrics;
pub mod model;
pub mod model_runner;
pub mod prefix_store;
pub mod prepare;
pub mod request;
pub mod sampling;
pub mod scheduler;
pub mod server;
pub mod service;
pub mod telemetry;
pub mod tokenizer;

#[cfg(test)]
pub(crate) mod test_support;
