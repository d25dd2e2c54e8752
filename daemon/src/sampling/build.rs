//! [`SamplerChain::build`]: a request's sampling chains, one per choice, built in
//! `prepare/` before the request is queued (grammar compilation and plugin
//! instantiation happen there, off the engine loop).
//!
//! Each chain has the native processors its parameters ask for, then the request's
//! constraint (its `response_format`, or the grammar of a forced tool call), held back
//! by a [`ReasoningGate`] while the model reasons when the template lets it, then its
//! plugin instances. Choice `i` of an `n > 1` request is seeded with
//! [`SamplingParams::choice_seed`]`(i)` and gets a constraint and plugin instances of its
//! own: a grammar's state and a plugin's state follow one sequence.

use super::constraint::LazyCompiler;
use super::reasoning_gate::ReasoningGate;
use super::tool_grammar::tool_call_grammar;
use super::wasm_plugin::PluginRegistry;
use super::SamplerChain;
use crate::error::InferError;
use crate::request::{
    ChannelSpec, ConstraintSpec, FunctionTool, PluginSpec, ReasoningStart, SamplingParams,
    ToolChoice, ToolFormat, ToolOptions, Vocab,
};

/// The request's plugins: the registry to instantiate from, the list in order, and
/// the client's request id (for the plugins' logs).
pub struct PluginRequest<'a> {
    /// The registry (the current one; SIGHUP replaces it whole).
    pub registry: &'a PluginRegistry,
    /// The request's `plugins`, in order.
    pub specs: &'a [PluginSpec],
    /// The client's id.
    pub client_id: &'a str,
}

/// What a request's chains are built from besides its sampling parameters.
pub struct ChainParts<'a> {
    /// The model's vocabulary.
    pub vocab: &'a dyn Vocab,
    /// The grammar compiler shared by the prepare pool (built on first use).
    pub grammars: &'a LazyCompiler,
    /// The request's tools, if any.
    pub tools: Option<&'a ToolOptions>,
    /// The format the template's model writes tool calls in (`None`: no tools).
    pub tool_format: Option<ToolFormat>,
    /// The output channels the template implies.
    pub channels: &'a ChannelSpec,
    /// The request's plugins (`None`: it names none).
    pub plugins: Option<PluginRequest<'a>>,
}

impl SamplerChain {
    /// The chains of every choice of a request with validated `params`: choice 0's, and
    /// those of choices `1..n` (the forks).
    ///
    /// # Errors
    /// `validation` for a schema, grammar or tool-parameter schema that does not
    /// compile (naming the field) or for a plugin config its plugin rejects;
    /// `plugin_trap` for a plugin that traps or times out in `configure`.
    pub fn build(
        params: &SamplingParams,
        parts: &ChainParts<'_>,
    ) -> Result<(Self, Vec<Self>), InferError> {
        let chain = |i: usize| {
            // `choice_seed(0)` is the request's seed.
            let params = SamplingParams {
                seed: params.choice_seed(i),
                ..params.clone()
            };
            let mut chain = Self::constrained(&params, parts)?;
            if let Some(p) = &parts.plugins {
                let plugins = p.registry.instantiate(p.specs, params.seed, p.client_id)?;
                chain.set_plugins(plugins);
            }
            Ok(chain)
        };
        Ok((
            chain(0)?,
            (1..params.n).map(chain).collect::<Result<_, _>>()?,
        ))
    }

    /// One choice's chain without plugins: native processors, constraint and gate.
    fn constrained(params: &SamplingParams, parts: &ChainParts<'_>) -> Result<Self, InferError> {
        let vocab = parts.vocab;
        let eog = vocab.eog_token_ids();
        let mut chain = Self::new(params, eog);
        let forced = match (parts.tools, parts.tool_format) {
            (Some(t), Some(format)) => t.forced().map(|tools| (t, format, tools)),
            _ => None,
        };
        if params.constraint.is_none() && forced.is_none() {
            return Ok(chain);
        }
        let compiler = parts.grammars.get(|| grammar_vocabulary(vocab))?;
        let constraint = match (&params.constraint, forced) {
            (Some(spec), _) => compiler.compile(spec, eog)?,
            (None, Some((options, format, tools))) => {
                let indexed: Vec<(usize, &FunctionTool)> = tools
                    .into_iter()
                    .map(|t| {
                        let i = options.tools.iter().position(|u| u.name == t.name);
                        (i.unwrap_or(0), t)
                    })
                    .collect();
                let marker = parts
                    .channels
                    .markers
                    .iter()
                    .find(|(_, m)| m == "[TOOL_CALLS]")
                    .map(|(id, _)| *id);
                // A named function is called once; `required` may call several when parallel.
                let many = options.parallel && options.choice == ToolChoice::Required;
                // Each schema alone first: its errors then name the tool, not the
                // grammar the calls are embedded in.
                for (i, t) in &indexed {
                    let spec = ConstraintSpec::JsonSchema(t.parameters.clone());
                    compiler.compile(&spec, eog).map_err(|e| {
                        let reason = e
                            .message
                            .strip_prefix("response_format.json_schema.schema: ")
                            .unwrap_or(&e.message);
                        InferError::validation(format!("tools[{i}].function.parameters: {reason}"))
                    })?;
                }
                let lark = tool_call_grammar(format, &indexed, many, marker)?;
                compiler.compile_tool_calls(lark, eog)?
            }
            (None, None) => return Ok(chain),
        };
        chain.set_constraint(constraint);
        if let Some(start) = parts.channels.reasoning {
            if start != ReasoningStart::Ended {
                let pieces = ReasoningGate::think_pieces(vocab.vocab_size() as u32, |id| {
                    vocab.token_bytes(id)
                });
                chain.set_reasoning_gate(ReasoningGate::new(start, pieces, eog.to_vec()));
            }
        }
        Ok(chain)
    }
}

/// llguidance's view of the vocabulary: each token's bytes as generated; control tokens
/// as `0xFF` + their text (so no grammar text matches them); the end-of-turn token
/// (EOS, else the first end-of-generation id) ends a finished grammar.
pub fn grammar_vocabulary(vocab: &dyn Vocab) -> (Vec<Vec<u8>>, u32) {
    let words = (0..vocab.vocab_size() as u32)
        .map(|id| {
            if vocab.is_control(id) {
                let mut w = vec![0xFF];
                w.extend_from_slice(vocab.token_piece(id));
                w
            } else {
                vocab.token_bytes(id).to_vec()
            }
        })
        .collect();
    let eos = vocab
        .eos_token_id()
        .or_else(|| vocab.eog_token_ids().first().copied())
        .unwrap_or(0);
    (words, eos)
}
