//! The scheduler: owns the queues and decides what runs in each engine step.
//!
//! - [`sequence`]: the state of one accepted sequence (tokens, sampler, output stream);
//!   the choices of an `n > 1` request fork from it once its prompt is computed.
//! - [`echo`]: [`PromptEcho`], the prompt echoed back with its log-probabilities.
//! - [`block_manager`]: [`BlockManager`], KV block allocation, block tables and
//!   reference counts.
//! - [`policy`]: [`Scheduler`], the continuous-batching policy (admission, token
//!   budget, chunked prefill, preemption), unit-tested without actix.
//! - [`speculative`]: speculative decoding's n-gram drafts, adaptive draft length and
//!   counters.
//! - [`post_step`]: [`post_step::PostStep`], one step's output into tokens and events
//!   (echo, forks, draft verification, sampling, streaming), pure.
//! - [`actor`]: [`SchedulerActor`], the thin engine loop: schedule → run on the model
//!   runner → post-step, one step after another.

pub mod actor;
pub mod block_manager;
pub mod echo;
pub mod load;
pub mod policy;
pub mod post_step;
pub mod sequence;
pub mod speculative;

pub use actor::{Cancel, GetStats, SchedulerActor, Submit};
pub use block_manager::{BlockId, BlockManager, OutOfBlocks};
pub use echo::PromptEcho;
pub use load::EngineLoad;
pub use policy::{PrefixCaching, Scheduler, SchedulerLimits};
pub use sequence::{Prepared, Sequence};
pub use speculative::Speculation;

#[cfg(test)]
mod choices_tests;
#[cfg(test)]
mod kv_events_tests;
#[cfg(test)]
mod post_step_tests;
#[cfg(test)]
mod prefix_tests;
#[cfg(test)]
mod spec_tests;
#[cfg(test)]
mod tests;
