//! Request types shared by every stage: ids, validated sampling parameters, the
//! validated generate request and the events streamed back to the client.
//!
//! Wire types (all `Option`s) live in `api`; by the time a request reaches the
//! tokenizer it has been validated into these concrete types.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::error::InferError;

pub mod channels;
pub mod logprobs;
pub mod media;
pub mod prepared;
pub mod stats;
pub mod tools;
pub mod vocab;

pub use channels::{ChannelSpec, ReasoningStart, ToolFormat};
pub use logprobs::{TokenLogprobs, TopLogprob};
pub use media::{ImageDetail, ImageInput, ImageSource, PixelLayout, PromptImage};
pub use prepared::{DiskHit, PreparedRequest};
pub use stats::{EngineShare, EngineStats, KvEventStats, LoraStats, PrefixCacheStats, SpecStats};
pub use tools::{FunctionTool, ToolCall, ToolCallDelta, ToolChoice, ToolOptions};
pub use vocab::Vocab;

/// Identifier of an accepted sequence inside the engine, unique for the daemon's lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

static NEXT_SEQ_ID: AtomicU64 = AtomicU64::new(1);

impl SeqId {
    /// A fresh id, never handed out before in this process.
    pub fn next() -> Self {
        SeqId(NEXT_SEQ_ID.fetch_add(1, Ordering::Relaxed))
    }
}

/// Cancellation flag shared by the connection that owns a request and every stage that
/// holds it. Set by a client `cancel` or a closed connection; the scheduler checks it
/// before every step and frees the sequence.
#[derive(Debug, Clone, Default)]
pub struct CancelFlag(Arc<AtomicBool>);

impl CancelFlag {
    /// A flag that is not set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests cancellation.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether cancellation was requested.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seq{}", self.0)
    }
}

/// One chat message after validation. `content` is the concatenation of the text
/// parts when the client sent a list of parts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...: passed to the template as given.
    pub role: String,
    /// Message text. Special-token strings inside it are encoded as plain text. Empty
    /// for an assistant message that only calls tools (`content: null`).
    pub content: String,
    /// An assistant message's `tool_calls` (empty for none).
    pub tool_calls: Vec<ToolCall>,
    /// A `tool` message's `tool_call_id`: the call it answers.
    pub tool_call_id: Option<String>,
    /// `name` (of a `tool` message's function, or a participant), when given.
    pub name: Option<String>,
    /// The message's image parts, in order (empty for text).
    pub images: Vec<ImageInput>,
}

impl ChatMessage {
    /// A message with just a role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            ..Self::default()
        }
    }
}

/// What to generate from: chat messages rendered by the model's template, or a raw prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// Rendered with the chat template and `add_generation_prompt = true`.
    Messages(Vec<ChatMessage>),
    /// Raw completion: the text is tokenized as is (special-token text stays plain text).
    Text(String),
    /// Token ids given by the client, used as the prompt unchanged (no BOS added), each
    /// below the vocabulary size.
    Tokens(Vec<u32>),
}

/// Validated sampling parameters (names as in llama.cpp / vLLM).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `0.0` means greedy (argmax). Bound: `[0, 100]`.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables. Bound: `[0, vocab]`.
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest set with cumulative probability ≥ `top_p`.
    /// Bound: `(0, 1]`; `1.0` disables (Holtzman et al. 2019).
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p × p_max`. Bound: `[0, 1]`; `0` disables.
    pub min_p: f32,
    /// Seed of this request's own RNG: same seed and prompt → same tokens.
    pub seed: u64,
    /// Maximum number of generated tokens (≥ 1, or 0 with `echo`: score the prompt
    /// only); also capped by the context window.
    pub max_tokens: usize,
    /// Stop sequences: matched on the decoded text across token boundaries and cut
    /// from the output.
    pub stop: Vec<String>,
    /// OpenAI `presence_penalty`: subtracted once from the logit of every token that
    /// occurs in the generated text. Bound: `[-2, 2]`; `0` disables.
    pub presence_penalty: f32,
    /// OpenAI `frequency_penalty`: subtracted from a token's logit once per occurrence
    /// in the generated text. Bound: `[-2, 2]`; `0` disables.
    pub frequency_penalty: f32,
    /// `repetition_penalty` (Keskar et al. 2019, CTRL; vLLM and llama.cpp
    /// `repeat_penalty`): positive logits of tokens in the window are divided by it,
    /// negative ones multiplied. Bound: `(0, 10]`; `1` disables.
    pub repetition_penalty: f32,
    /// The repetition penalty's window: the last `repeat_last_n` tokens of prompt and
    /// output (llama.cpp's `repeat_last_n`, default 64); `None` = the whole sequence.
    pub repeat_last_n: Option<usize>,
    /// End-of-generation tokens are banned until this many tokens were generated
    /// (vLLM `min_tokens`). Bound: `[0, max_tokens]`.
    pub min_tokens: usize,
    /// `logit_bias`: `(token id, bias)` added to the raw logits, ids unique and below
    /// the vocabulary size, biases in `[-100, 100]`, sorted by id.
    pub logit_bias: Vec<(u32, f32)>,
    /// Return log-probabilities of each sampled token and of the `n` most likely
    /// alternatives (`Some(0)`: the sampled token's only). `n ≤ 20`.
    pub logprobs: Option<usize>,
    /// Structured output: the generated text must match this (`response_format`).
    pub constraint: Option<ConstraintSpec>,
    /// `n`: independent choices generated from the one prompt, which is prefilled once
    /// and its KV blocks shared. Choice `i` samples with seed `seed + i` (wrapping).
    /// Bound: `[1, MAX_CHOICES]`.
    pub n: usize,
    /// `echo`: the prompt's tokens come back before the generated ones
    /// ([`StreamEvent::Echo`]), with their log-probabilities when `logprobs` is set.
    /// Completions (`prompt`) only.
    pub echo: bool,
    /// Whether speculative decoding may run for this request (`speculative`, default
    /// true; it runs only when `[speculative]` is on too). Output is the same either way.
    pub speculative: bool,
}

/// Most choices (`n`) one request may ask for.
pub const MAX_CHOICES: usize = 16;

/// What a constrained request's output must match (`response_format`), compiled by
/// llguidance when the request is prepared.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstraintSpec {
    /// `{"type": "json_object"}`: any JSON object.
    JsonObject,
    /// `{"type": "json_schema", "json_schema": {"schema": …}}`: JSON valid against the
    /// schema; a keyword llguidance cannot enforce refuses the request.
    JsonSchema(serde_json::Value),
    /// inferd extension `{"type": "regex", "regex": …}`: the whole output matches.
    Regex(String),
    /// inferd extension `{"type": "grammar", "grammar": …}`: a Lark grammar
    /// (llguidance's dialect, start rule `start`).
    Grammar(String),
}

impl Default for SamplingParams {
    /// The daemon's built-in defaults (`temperature 0.8`, `top_k 40`, `top_p 0.95`,
    /// `min_p 0.05`, 256 tokens, seed 0) with every steering option off.
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            seed: 0,
            max_tokens: 256,
            stop: Vec::new(),
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            repeat_last_n: Some(DEFAULT_REPEAT_LAST_N),
            min_tokens: 0,
            logit_bias: Vec::new(),
            logprobs: None,
            constraint: None,
            n: 1,
            echo: false,
            speculative: true,
        }
    }
}

/// llama.cpp's default `repeat_last_n` (`common/common.h`, `penalty_last_n = 64`).
pub const DEFAULT_REPEAT_LAST_N: usize = 64;

impl SamplingParams {
    /// The seed of choice `index` (`seed + index`, wrapping): choice `i` of a request
    /// samples exactly as a request of one choice with this seed would.
    pub fn choice_seed(&self, index: usize) -> u64 {
        self.seed.wrapping_add(index as u64)
    }

    /// Whether sampling reduces to argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
}

/// One entry of a request's `plugins` list: a loaded plugin's name and its config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginSpec {
    /// The plugin's name (as `info` declares it; listed by the `plugins` message).
    pub name: String,
    /// The entry's `config` as JSON text (`{}` when omitted), passed to the plugin's
    /// `configure`, which validates it.
    pub config: String,
}

/// A request's prefix-cache options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheOptions {
    /// Whether the request reads and writes the prefix cache (`"cache"`, default true).
    pub enabled: bool,
    /// `cache_salt`: enters the root of the block hash chain, so only requests with the
    /// same salt share blocks (empty: the shared, unsalted chain).
    pub salt: String,
}

impl Default for CacheOptions {
    fn default() -> Self {
        Self {
            enabled: true,
            salt: String::new(),
        }
    }
}

/// A request's LoRA adapter: OpenAI `model` naming an adapter, or the WebSocket's
/// `adapter`; `lora_scale` (default 1) multiplies its delta.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterChoice {
    /// The adapter's name (resolved against the registry when the request starts).
    pub name: String,
    /// `lora_scale`.
    pub scale: f32,
    /// The request field that named it (`adapter`, or `model` on the OpenAI edge), for
    /// error messages.
    pub field: &'static str,
}

/// A validated generate request as it enters the tokenizer.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    /// The client's id for this request (unique among its connection's active requests).
    pub client_id: String,
    /// Prompt source.
    pub input: PromptInput,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// Wasm plugins applied at every decode step, in order (processors, then at most one
    /// sampler, last). Empty for none.
    pub plugins: Vec<PluginSpec>,
    /// Prefix caching (`cache`, `cache_salt`).
    pub cache: CacheOptions,
    /// `tools`, `tool_choice`, `parallel_tool_calls` (chat only); `None` without tools.
    pub tools: Option<ToolOptions>,
    /// `chat_template_kwargs`: extra variables for the chat template (e.g.
    /// `enable_thinking`), never one the daemon sets itself.
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// The LoRA adapter, if any (`None`: the base model).
    pub adapter: Option<AdapterChoice>,
}

/// Why generation ended (`done.finish_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS / end-of-turn token or a stop sequence.
    Stop,
    /// `max_tokens` reached or the context window is full.
    Length,
    /// The turn ended (as `Stop`) after the model called tools: the calls are in the
    /// deltas' `tool_calls`.
    ToolCalls,
    /// Cancelled by the client (or its connection closed).
    Cancelled,
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated (including a final EOS token, which is not streamed as text).
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache instead of prefill.
    pub cached_tokens: usize,
    /// Draft tokens speculative decoding proposed and the model verified.
    pub draft_tokens: usize,
    /// Of those, drafts accepted (part of `completion_tokens`, each saving a step).
    pub accepted_draft_tokens: usize,
    /// Prompt tokens that are image placeholders (part of `prompt_tokens`); left out
    /// of the WebSocket frame when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub image_tokens: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Usage {
    /// Adds another choice's generated-token counts (`n > 1`: the prompt counts once).
    pub fn add_completion(&mut self, other: &Usage) {
        self.completion_tokens += other.completion_tokens;
        self.draft_tokens += other.draft_tokens;
        self.accepted_draft_tokens += other.accepted_draft_tokens;
    }
}

/// Timings of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Timings {
    /// Time to first token: from acceptance to the first sampled token, in milliseconds.
    pub ttft_ms: f64,
    /// Decode speed after the first token, in tokens per second (0 when fewer than 2 tokens).
    pub decode_tokens_per_s: f64,
}

/// What the engine sends back on a request's own event channel, in order:
/// `Started`, zero or more `Delta`, then exactly one `Done` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// The prompt was tokenized and admitted.
    Started {
        /// Prompt length in tokens.
        prompt_tokens: usize,
        /// Prompt tokens served from the prefix cache.
        cached_tokens: usize,
    },
    /// New text: whole UTF-8 characters only, never part of a stop sequence.
    Delta {
        /// Text released by this step (may be empty when only held back).
        text: String,
        /// Token ids sampled since the previous delta.
        token_ids: Vec<u32>,
        /// Their log-probabilities (one per id, in order) when the request asked for
        /// `logprobs`; empty otherwise.
        logprobs: Vec<TokenLogprobs>,
        /// Text of the model's reasoning (`<think>…</think>`) released by this step;
        /// never part of `text`.
        reasoning: String,
        /// Tool-call pieces parsed from the output in this step (their text is never
        /// part of `text`).
        tool_calls: Vec<ToolCallDelta>,
    },
    /// Generation ended normally or by cancellation.
    Done {
        /// Why it ended.
        finish_reason: FinishReason,
        /// Token counts.
        usage: Usage,
        /// TTFT and decode speed.
        timings: Timings,
    },
    /// The request failed; nothing more follows.
    Error(InferError),
    /// The prompt, echoed (`echo`): sent once, after `Started` and before any `Delta`.
    Echo {
        /// The prompt's text (its tokens' bytes, control tokens as nothing, invalid
        /// UTF-8 replaced).
        text: String,
        /// The prompt's token ids.
        token_ids: Vec<u32>,
        /// With `logprobs`: one entry per prompt token, the log-probability of token
        /// `i` given tokens `0..i` and the most likely alternatives there. The first
        /// token has no context: its `chosen.logprob` is NaN and its `top` empty.
        /// Empty without `logprobs`.
        logprobs: Vec<TokenLogprobs>,
    },
    /// An event of choice `index` of a request with `n > 1` choices: its `Delta`s and
    /// its `Done`. The request ends when every choice sent its `Done` (or with an
    /// `Error`).
    Choice {
        /// The choice, `0..n`.
        index: usize,
        /// Its `Delta` or `Done`.
        event: Box<StreamEvent>,
    },
}

/// Sender half of a request's event channel. Unbounded: the engine never blocks on a
/// slow client; the session drops events of a closed connection.
pub type EventSender = mpsc::UnboundedSender<StreamEvent>;
/// Receiver half of a request's event channel.
pub type EventReceiver = mpsc::UnboundedReceiver<StreamEvent>;
