//! `ModelRunnerActor`: a thin actix shell around [`ModelRunner`], run on a
//! `SyncArbiter` thread so forward passes never block the async executor.

use actix::{Actor, Handler, Message, MessageResult, SyncContext};

use super::runner::{ModelRunner, RunBatch, StepOutput};

/// The model runner actor. Start it with `SyncArbiter::start(1, ...)`: it owns the KV
/// caches, so exactly one thread must run it.
pub struct ModelRunnerActor {
    runner: ModelRunner,
}

impl ModelRunnerActor {
    /// Wraps a runner.
    pub fn new(runner: ModelRunner) -> Self {
        Self { runner }
    }
}

impl Actor for ModelRunnerActor {
    type Context = SyncContext<Self>;
}

impl Message for RunBatch {
    type Result = StepOutput;
}

impl Handler<RunBatch> for ModelRunnerActor {
    type Result = MessageResult<RunBatch>;

    fn handle(&mut self, batch: RunBatch, _ctx: &mut SyncContext<Self>) -> Self::Result {
        MessageResult(self.runner.run(batch))
    }
}
