//! The model runner: owns the device, the weights and the KV block pool, and executes
//! the scheduler's batches, one forward pass per step. Its actor runs on its own `SyncArbiter` thread.

mod actor;
mod calibrate;
mod media;
mod runner;

pub use calibrate::SpecCosts;

pub use actor::ModelRunnerActor;
pub use runner::{
    BatchAdapter, BatchItem, BlockCopy, BlockLoad, DraftWork, ItemOutput, ModelRunner,
    PersistBlock, RunBatch, StepOutput,
};

use candle_core::Device;

/// Parses the `model.device` setting: `"cpu"`, `"cuda:N"` or `"auto"` (CUDA device 0
/// when this build has CUDA and a device is present, else CPU).
///
/// # Errors
/// A message naming the value when it is malformed or names a device this build cannot use.
pub fn select_device(spec: &str) -> Result<Device, String> {
    match spec {
        "cpu" => Ok(Device::Cpu),
        "auto" => {
            // `cuda_is_available` says whether this build has CUDA, not whether a GPU is
            // present: try device 0 and fall back to the CPU.
            if candle_core::utils::cuda_is_available() {
                match Device::new_cuda(0) {
                    Ok(d) => return Ok(d),
                    Err(e) => tracing::warn!(
                        error = %e,
                        "model.device = \"auto\": no usable CUDA device 0, using the CPU"
                    ),
                }
            }
            Ok(Device::Cpu)
        }
        s => {
            let Some(n) = s.strip_prefix("cuda:") else {
                return Err(format!(
                    "model.device must be \"auto\", \"cpu\" or \"cuda:N\" (got \"{s}\")"
                ));
            };
            let n: usize = n
                .parse()
                .map_err(|_| format!("model.device: bad CUDA ordinal in \"{s}\""))?;
            if !candle_core::utils::cuda_is_available() {
                return Err(format!(
                    "model.device = \"{s}\" but this build has no CUDA support (build with --features cuda)"
                ));
            }
            Device::new_cuda(n).map_err(|e| format!("model.device = \"{s}\": {e}"))
        }
    }
}

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod gemma3_parity_tests;
#[cfg(test)]
mod lora_parity_tests;
#[cfg(test)]
mod parity_tests;
#[cfg(test)]
mod quant_parity_tests;
#[cfg(test)]
mod step_timing_tests;
