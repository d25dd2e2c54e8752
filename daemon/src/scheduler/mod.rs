//! The scheduler: owns the queues and decides what runs in each engine step.
//!
//! - [`sequence`]: the state of one accepted sequence (tokens, sampler, output stream).
//! - [`policy`]: [`Scheduler`], the pure queueing policy, unit-tested without actix.
//! - [`actor`]: [`SchedulerActor`], the engine loop: schedule → run on the model runner
//!   → sample → detokenize → stream events, one step after another.

pub mod actor;
pub mod policy;
pub mod sequence;

pub use actor::{Cancel, SchedulerActor, Submit};
pub use policy::{Scheduler, SchedulerLimits};
pub use sequence::{Sequence, TokenizedRequest};

#[cfg(test)]
mod tests;
