//! Host bindings generated from the WIT package in `wit/` (the only `bindgen!` in the
//! daemon). Three worlds share the `types` and `host` interfaces: the sampler and
//! context-processor worlds' bindings reuse the logits-processor world's generated
//! modules through `with`, so the host implements each import trait once.

/// The `logits-processor-plugin` world, plus the shared `types` and `host` interfaces.
pub mod processor {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "logits-processor-plugin",
    });
}

/// The `sampler-plugin` world; `types` and `host` come from [`processor`].
pub mod sampler {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "sampler-plugin",
        with: {
            "inferd:plugin/types": super::processor::inferd::plugin::types,
            "inferd:plugin/host": super::processor::inferd::plugin::host,
        },
    });
}

/// The `context-processor-plugin` world; `types` and `host` come from [`processor`].
pub mod context {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "context-processor-plugin",
        with: {
            "inferd:plugin/types": super::processor::inferd::plugin::types,
            "inferd:plugin/host": super::processor::inferd::plugin::host,
        },
    });
}

pub use context::{ContextProcessorPlugin, ContextProcessorPluginPre};
pub use processor::inferd::plugin::host::Host;
pub use processor::inferd::plugin::types::{
    Host as TypesHost, LogLevel, LogitsEdit, PluginInfo, SpecialTokenIds, StepContext, VocabBlob,
};
pub use processor::{LogitsProcessorPlugin, LogitsProcessorPluginPre};
pub use sampler::{SamplerPlugin, SamplerPluginPre};
