//! Valid client input: proptest strategies of a `generate` for each edge and of the
//! WebSocket's other messages, with the rules between fields kept ([`Body`]'s `fit`).

use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{json, Value};

use super::{Body, Choice, Edge, Format, Input, Msg, Tool, WsMsg, VOCAB};
use crate::api::validate::{MAX_MAX_TOKENS, MAX_STOP_BYTES};
use crate::request::MAX_CHOICES;

/// Optional fields that may be written as `null` (read as absent).
const NULLABLE: &[&str] = &[
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "stop",
    "plugins",
    "cache",
    "cache_salt",
    "n",
    "echo",
    "speculative",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "repeat_last_n",
    "min_tokens",
    "logit_bias",
    "response_format",
    "max_tokens",
    "logprobs",
];

/// Any text of `min..=max` characters; now and then one of the awkward ones.
fn text_of(min: usize, max: usize) -> BoxedStrategy<String> {
    prop_oneof![
        8 => proptest::string::string_regex(&format!(".{{{min},{max}}}")).expect("regex"),
        1 => select(vec!["<|eot_id|>", "\u{0}\u{1f}", "\u{feff}é😀", "\"\\/\n\t", "null"])
            .prop_map(str::to_owned),
    ]
    .boxed()
}

/// Any text, up to `max` characters (besides the awkward ones).
pub fn text(max: usize) -> BoxedStrategy<String> {
    text_of(0, max)
}

/// Non-empty text (built so, not filtered: a filter's rejects add up over a million
/// inputs in one runner).
fn nonempty(max: usize) -> BoxedStrategy<String> {
    text_of(1, max)
}

/// `k / scale` for `k` in `[lo, hi]`, the ends weighted up: short decimals, which
/// serde_json reads back exactly.
pub fn decimal(lo: i64, hi: i64, scale: f64) -> BoxedStrategy<f64> {
    prop_oneof![1 => Just(lo), 1 => Just(hi), 6 => lo..=hi]
        .prop_map(move |k| k as f64 / scale)
        .boxed()
}

fn uint(lo: u64, hi: u64) -> BoxedStrategy<u64> {
    prop_oneof![1 => Just(lo), 1 => Just(hi), 6 => lo..=hi].boxed()
}

fn opt<S: Strategy + 'static>(s: S) -> BoxedStrategy<Option<S::Value>> {
    option::weighted(0.4, s).boxed()
}

/// Arbitrary small JSON (integers and short decimals only, so it reads back equal).
pub fn json_value() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        decimal(-1_000_000, 1_000_000, 1000.0).prop_map(Value::from),
        text(8).prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            btree_map("[a-z]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

fn tool_name() -> BoxedStrategy<String> {
    prop_oneof![4 => "[a-zA-Z0-9_-]{1,12}", 1 => "[a-z]{64}"].boxed()
}

fn message() -> impl Strategy<Value = Msg> {
    let calls = vec((opt(text(8)), tool_name(), opt(text(12))), 0..3);
    let content = prop_oneof![
        3 => text(40).prop_map(Ok),
        1 => vec(text(12), 0..4).prop_map(Err),
    ];
    (
        select(vec!["system", "user", "assistant", "tool", "ipython", "😀"]),
        option::weighted(0.9, content),
        prop_oneof![3 => Just(vec![]), 1 => calls],
        opt(text(8)),
        opt(text(8)),
    )
        .prop_map(|(role, content, calls, tool_call_id, name)| Msg {
            role: role.to_owned(),
            content: if calls.is_empty() {
                content.or(Some(Ok(String::new())))
            } else {
                content
            },
            calls,
            tool_call_id,
            name,
        })
}

fn input(edge: Edge) -> BoxedStrategy<Input> {
    let messages = vec(message(), 1..6).prop_map(Input::Messages);
    let text = nonempty(60).prop_map(Input::Text);
    let ids = vec(uint(0, VOCAB as u64 - 1).prop_map(|t| t as u32), 1..12).prop_map(Input::Tokens);
    match edge {
        Edge::Chat => messages.boxed(),
        Edge::Completion => prop_oneof![text, ids].boxed(),
        Edge::Ws => prop_oneof![2 => messages, 1 => text, 1 => ids].boxed(),
    }
}

fn format() -> BoxedStrategy<Format> {
    let schema = btree_map("[a-z]{1,6}", json_value(), 0..4).prop_map(
        |p| json!({"type": "object", "properties": Value::Object(p.into_iter().collect())}),
    );
    prop_oneof![
        Just(Format::Text),
        Just(Format::JsonObject),
        (opt(text(8)), opt(any::<bool>()), schema)
            .prop_map(|(n, s, v)| Format::JsonSchema(n, s, v)),
        // Literal text: a regex that does not parse is refused (`validate::steering`).
        nonempty(16).prop_map(|t| Format::Regex(regex::escape(&t))),
        nonempty(16).prop_map(Format::Grammar),
    ]
    .boxed()
}

/// `tools`, `tool_choice` and `parallel_tool_calls`.
type ToolFields = (Option<Vec<Tool>>, Option<Choice>, Option<bool>);

fn tools() -> BoxedStrategy<ToolFields> {
    let params = prop_oneof![
        Just(json!({})),
        Just(json!({"type": "object", "properties": {"q": {"type": "string"}}})),
    ];
    let tool = (tool_name(), opt(text(16)), opt(params), opt(any::<bool>()));
    let choice = prop_oneof![
        Just(Choice::None),
        Just(Choice::Auto),
        Just(Choice::Required),
        (0usize..4).prop_map(Choice::Named),
    ];
    (opt(vec(tool, 0..4)), opt(choice), opt(any::<bool>())).boxed()
}

prop_compose! {
    fn sampling()(
        max_tokens in opt(uint(1, MAX_MAX_TOKENS)),
        max_completion_tokens in opt(uint(1, MAX_MAX_TOKENS)),
        temperature in opt(decimal(0, 100_000, 1000.0)),
        top_k in opt(uint(0, VOCAB as u64)),
        top_p in opt(decimal(1, 1_000_000, 1e6)),
        min_p in opt(decimal(0, 1_000_000, 1e6)),
        seed in opt(prop_oneof![Just(u64::MAX), any::<u64>()]),
        stop in opt(prop_oneof![
            nonempty(12).prop_map(Ok),
            vec(prop_oneof![4 => nonempty(12), 1 => Just("s".repeat(MAX_STOP_BYTES))], 0..17)
                .prop_map(Err),
        ]),
        n in opt(uint(1, MAX_CHOICES as u64)),
        echo in opt(any::<bool>()),
        cache in opt(any::<bool>()),
        cache_salt in opt(prop_oneof![nonempty(20), Just("é".repeat(128))]),
    ) -> Body {
        Body { max_tokens, max_completion_tokens, temperature, top_k, top_p, min_p, seed,
               stop, n, echo, cache, cache_salt, ..Body::default() }
    }
}

prop_compose! {
    fn steering(edge: Edge)(
        base in sampling(),
        input in input(edge),
        id in prop_oneof![8 => nonempty(24), 1 => Just("i".repeat(256))],
        speculative in opt(any::<bool>()),
        penalties in (opt(decimal(-2000, 2000, 1000.0)), opt(decimal(-2000, 2000, 1000.0)),
                      opt(decimal(1, 10_000, 1000.0))),
        repeat_last_n in opt(prop_oneof![Just(-1i64), 0i64..100_000]),
        min_tokens in opt(0u64..400),
        logit_bias in opt(btree_map(uint(0, VOCAB as u64 - 1).prop_map(|t| t as u32),
                                    decimal(-10_000, 10_000, 100.0), 0..6)),
        logprobs in (opt(any::<bool>()), opt(uint(0, 20))),
        response_format in opt(format()),
        plugins in opt(vec((nonempty(12), opt(json_value())), 0..4)),
        tools in tools(),
        kwargs in opt(btree_map("[a-z_]{1,8}", json_value(), 0..3)),
    ) -> Body {
        Body { id, input: Some(input), speculative,
               presence_penalty: penalties.0, frequency_penalty: penalties.1,
               repetition_penalty: penalties.2, repeat_last_n, min_tokens, logit_bias,
               logprobs: logprobs.0, top_logprobs: logprobs.1, response_format, plugins,
               tools: tools.0, tool_choice: tools.1, parallel_tool_calls: tools.2,
               kwargs: kwargs.map(|k| k.into_iter().collect()), ..base }
    }
}

/// A valid `generate` body for `edge`.
pub fn body(edge: Edge) -> BoxedStrategy<Body> {
    let http = (
        any::<(bool, bool, bool, bool)>(),
        opt(any::<bool>()),
        opt(opt(any::<bool>())),
        opt(text(12)),
        vec(select(NULLABLE), 0..3),
    );
    (steering(edge), http)
        .prop_map(
            move |(mut b, ((model, suffix, best_of, wrap), stream, usage, user, nulls))| {
                if edge != Edge::Ws {
                    (b.model, b.stream, b.user) = (model, stream, user);
                    b.include_usage = usage.filter(|_| stream == Some(true));
                }
                if edge == Edge::Completion {
                    (b.suffix, b.best_of, b.wrap_prompt) = (suffix, best_of, wrap);
                }
                b.nulls = nulls;
                b.fit(edge);
                b
            },
        )
        .boxed()
}

/// A valid WebSocket message: mostly `generate`, then the others.
pub fn ws_message() -> BoxedStrategy<WsMsg> {
    let id = || nonempty(24);
    let ids = vec(uint(0, VOCAB as u64 - 1).prop_map(|t| t as u32), 0..8);
    prop_oneof![
        12 => body(Edge::Ws).prop_map(|b| WsMsg::Generate(Box::new(b))),
        1 => id().prop_map(WsMsg::Cancel),
        1 => (id(), text(30), opt(any::<bool>())).prop_map(|(i, t, s)| WsMsg::Tokenize(i, t, s)),
        1 => (id(), ids).prop_map(|(i, t)| WsMsg::Detokenize(i, t)),
        1 => opt(id()).prop_map(WsMsg::Stats),
        1 => opt(id()).prop_map(WsMsg::Plugins),
    ]
    .boxed()
}

impl Body {
    /// Drops or adjusts what `edge` or the rest of the body does not allow, so the
    /// body stays valid.
    fn fit(&mut self, edge: Edge) {
        let chat = self.is_chat();
        if edge != Edge::Chat {
            self.max_completion_tokens = None;
        }
        if edge == Edge::Completion {
            self.top_logprobs = self.top_logprobs.map(|n| n.min(5));
        }
        if chat {
            self.echo = self.echo.filter(|e| !e);
        } else {
            (
                self.tools,
                self.tool_choice,
                self.parallel_tool_calls,
                self.kwargs,
            ) = (None, None, None, None);
        }
        if self.logprobs != Some(true) {
            self.top_logprobs = None;
        }
        let max = self.effective_max_tokens().unwrap_or(256);
        self.min_tokens = self.min_tokens.map(|m| m.min(max));
        if let Some(k) = &mut self.kwargs {
            k.retain(|key, _| !crate_reserved(key));
        }
        if let Some(tools) = &mut self.tools {
            let mut seen = Vec::new();
            tools.retain(|t| {
                !seen.contains(&t.0) && {
                    seen.push(t.0.clone());
                    true
                }
            });
        }
        let n_tools = self.tools.as_ref().map_or(0, Vec::len);
        self.tool_choice = match self.tool_choice.take() {
            Some(Choice::Named(i)) if n_tools > 0 => Some(Choice::Named(i % n_tools)),
            Some(Choice::Named(_) | Choice::Required) if n_tools == 0 => Some(Choice::Auto),
            c => c,
        };
        if matches!(self.tool_choice, Some(Choice::Required | Choice::Named(_))) {
            self.response_format = self
                .response_format
                .take()
                .filter(|f| matches!(f, Format::Text));
        }
        if self.stream != Some(true) {
            self.include_usage = None;
        }
    }
}

/// Template variables the daemon sets itself.
fn crate_reserved(key: &str) -> bool {
    [
        "messages",
        "tools",
        "add_generation_prompt",
        "bos_token",
        "eos_token",
    ]
    .contains(&key)
}
