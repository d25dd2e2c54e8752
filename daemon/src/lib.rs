//! inferd: an LLM inference daemon.
//!
//! Data flows one way (see `README.md`, Layout):
//! `server` → `api` (validation) → `tokenizer` → `scheduler` → `model_runner` (`model`)
//! → `sampling` → `detokenizer` → the request's own event channel → client.

pub mod api;
pub mod detokenizer;
pub mod error;
pub mod request;
pub mod sampling;
pub mod tokenizer;

#[cfg(test)]
pub(crate) mod test_support;
