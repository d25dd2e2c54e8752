//! `TokenizerActor`: renders templates and tokenizes prompts on a `SyncArbiter` pool,
//! then hands the tokenized request forward to the scheduler.

use std::sync::Arc;
use std::time::Instant;

use actix::{Actor, Addr, Handler, Message, SyncContext};

use crate::detokenizer::reasoning::ReasoningStart;
use crate::detokenizer::tool_calls::ToolFormat;
use crate::detokenizer::ChannelSpec;
use crate::error::InferError;
use crate::request::{
    CancelFlag, ConstraintSpec, EventSender, FunctionTool, GenerateRequest, PromptInput,
    SamplingParams, SeqId, StreamEvent, ToolChoice, ToolOptions,
};
use crate::sampling::constraint::LazyCompiler;
use crate::sampling::reasoning_gate::ReasoningGate;
use crate::sampling::tool_grammar::tool_call_grammar;
use crate::sampling::wasm_plugin::actor::{PluginSetupActor, SetupPlugins};
use crate::sampling::SamplerChain;
use crate::scheduler::{Placer, Prepared};

use super::TextTokenizer;

/// Tokenize a validated generate request and submit it to the scheduler. Failures
/// (template errors, bad input) go to the request's event channel as `error`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Prepare {
    /// The engine id chosen by the connection.
    pub seq: SeqId,
    /// The validated request.
    pub request: GenerateRequest,
    /// The request's event channel.
    pub events: EventSender,
    /// The request's cancel flag.
    pub cancel: CancelFlag,
    /// When the connection accepted it.
    pub received_at: Instant,
    /// The lease on the request's LoRA adapter (`None`: the base model).
    pub adapter: Option<crate::adapters::AdapterLease>,
}

/// Tokenize text (the `tokenize` message).
#[derive(Debug, Message)]
#[rtype(result = "Result<Vec<u32>, InferError>")]
pub struct Encode {
    /// The text.
    pub text: String,
    /// Whether special-token text maps to control ids.
    pub special: bool,
}

/// Detokenize ids (the `detokenize` message); control tokens are skipped.
#[derive(Debug, Message)]
#[rtype(result = "String")]
pub struct Decode {
    /// Token ids, each already checked to be `< vocab_size`.
    pub token_ids: Vec<u32>,
}

/// The tokenizer stage. Start with `SyncArbiter::start(n, ..)`.
pub struct TokenizerActor {
    tokenizer: Arc<TextTokenizer>,
    scheduler: Arc<Placer>,
    plugin_setup: Addr<PluginSetupActor>,
    grammars: Arc<LazyCompiler>,
}

impl TokenizerActor {
    /// A tokenizer worker that forwards to `scheduler`, or to `plugin_setup` when the
    /// request names plugins.
    pub fn new(
        tokenizer: Arc<TextTokenizer>,
        scheduler: Arc<Placer>,
        plugin_setup: Addr<PluginSetupActor>,
        grammars: Arc<LazyCompiler>,
    ) -> Self {
        Self {
            tokenizer,
            scheduler,
            plugin_setup,
            grammars,
        }
    }

    /// The request's sampling chain, its `response_format` or forced tool call
    /// compiled (off the engine loop: this runs on the tokenizer pool), held back while
    /// the model reasons when the template lets it.
    fn chain(
        &self,
        params: &SamplingParams,
        tools: Option<&ToolOptions>,
        prompt: &Prompt,
    ) -> Result<SamplerChain, InferError> {
        let eog = self.tokenizer.eog_token_ids();
        let mut chain = SamplerChain::new(params, eog);
        let forced = match (tools, prompt.tool_format) {
            (Some(t), Some(format)) => t.forced().map(|tools| (t, format, tools)),
            _ => None,
        };
        if params.constraint.is_none() && forced.is_none() {
            return Ok(chain);
        }
        let compiler = self.grammars.get(|| grammar_vocabulary(&self.tokenizer))?;
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
                let marker = prompt
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
        if let Some(start) = prompt.channels.reasoning {
            if start != ReasoningStart::Ended {
                let tok = &self.tokenizer;
                let pieces =
                    ReasoningGate::think_pieces(tok.vocab_size() as u32, |id| tok.token_bytes(id));
                chain.set_reasoning_gate(ReasoningGate::new(start, pieces, eog.to_vec()));
            }
        }
        Ok(chain)
    }

    /// The chains of choices `1..n` of a request with `n` choices, each seeded with its
    /// choice's seed ([`SamplingParams::choice_seed`]) and with its own compiled
    /// constraint (a grammar's state follows one sequence).
    fn fork_chains(
        &self,
        params: &SamplingParams,
        tools: Option<&ToolOptions>,
        prompt: &Prompt,
    ) -> Result<Vec<SamplerChain>, InferError> {
        (1..params.n)
            .map(|i| {
                let seeded = SamplingParams {
                    seed: params.choice_seed(i),
                    ..params.clone()
                };
                self.chain(&seeded, tools, prompt)
            })
            .collect()
    }

    /// Prompt ids for the request: the chat template for messages (with its tools and
    /// `chat_template_kwargs`), raw text otherwise (special-token text in a raw prompt
    /// stays plain text). BOS / EOS are added as the model asks
    /// (`TextTokenizer::add_bos`, `TextTokenizer::add_eos`), BOS not doubled.
    fn prompt(&self, req: &GenerateRequest) -> Result<Prompt, InferError> {
        let plain = |ids| Prompt {
            ids,
            channels: ChannelSpec::default(),
            tool_format: None,
        };
        match &req.input {
            PromptInput::Messages(m) => {
                let p = self.tokenizer.encode_chat_request(
                    m,
                    req.tools.as_ref(),
                    &req.template_kwargs,
                )?;
                Ok(Prompt {
                    ids: p.ids,
                    channels: p.channels,
                    tool_format: p.tool_format,
                })
            }
            PromptInput::Tokens(ids) => Ok(plain(ids.clone())),
            PromptInput::Text(t) => self
                .tokenizer
                .encode_prompt(t)
                .map(plain)
                .map_err(|e| InferError::validation(format!("prompt: {e}"))),
        }
    }
}

/// A tokenized prompt and what its template implies for the output.
struct Prompt {
    ids: Vec<u32>,
    channels: ChannelSpec,
    tool_format: Option<ToolFormat>,
}

impl Actor for TokenizerActor {
    type Context = SyncContext<Self>;
}

impl Handler<Prepare> for TokenizerActor {
    type Result = ();

    fn handle(&mut self, msg: Prepare, _ctx: &mut SyncContext<Self>) {
        let request = &msg.request;
        let prepared = self.prompt(request).and_then(|p| {
            let chain = self.chain(&request.sampling, request.tools.as_ref(), &p)?;
            let forks = self.fork_chains(&request.sampling, request.tools.as_ref(), &p)?;
            Ok((p, chain, forks))
        });
        match prepared {
            Ok((prompt, chain, forks)) => {
                let req = Prepared {
                    seq: msg.seq,
                    client_id: msg.request.client_id,
                    prompt: prompt.ids,
                    channels: prompt.channels,
                    chain,
                    sampling: msg.request.sampling,
                    events: msg.events,
                    cancel: msg.cancel,
                    received_at: msg.received_at,
                    cache: msg.request.cache,
                    disk_hit: None,
                    forks,
                    adapter: msg.adapter,
                };
                if msg.request.plugins.is_empty() {
                    self.scheduler.submit(req);
                } else {
                    // Plugin instances are created and configured on their own pool, so
                    // a slow configure never holds up tokenizing; a bad config is a
                    // validation error before anything is queued.
                    self.plugin_setup.do_send(SetupPlugins {
                        request: req,
                        specs: msg.request.plugins,
                    });
                }
            }
            Err(e) => {
                let _ = msg.events.send(StreamEvent::Error(e));
            }
        }
    }
}

impl Handler<Encode> for TokenizerActor {
    type Result = Result<Vec<u32>, InferError>;

    fn handle(&mut self, msg: Encode, _ctx: &mut SyncContext<Self>) -> Self::Result {
        self.tokenizer
            .encode(&msg.text, msg.special)
            .map_err(|e| InferError::validation(format!("text: {e}")))
    }
}

impl Handler<Decode> for TokenizerActor {
    type Result = String;

    fn handle(&mut self, msg: Decode, _ctx: &mut SyncContext<Self>) -> String {
        self.tokenizer.decode(&msg.token_ids)
    }
}

/// llguidance's view of the vocabulary: each token's bytes as generated; control tokens
/// as `0xFF` + their text (so no grammar text matches them); the end-of-turn token
/// (EOS, else the first end-of-generation id) ends a finished grammar.
pub fn grammar_vocabulary(tok: &TextTokenizer) -> (Vec<Vec<u8>>, u32) {
    let words = (0..tok.vocab_size() as u32)
        .map(|id| {
            if tok.is_control(id) {
                let mut w = vec![0xFF];
                w.extend_from_slice(tok.token_piece(id));
                w
            } else {
                tok.token_bytes(id).to_vec()
            }
        })
        .collect();
    let eos = tok
        .eos_token_id()
        .or_else(|| tok.eog_token_ids().first().copied())
        .unwrap_or(0);
    (words, eos)
}
