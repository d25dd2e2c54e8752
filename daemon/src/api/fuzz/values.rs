//! The catalogue of bad values: for each field, values of the wrong JSON type and
//! values out of its bound (or wrong inside it: a message without `role`, a tool named
//! twice, a `logit_bias` key with a leading zero, ...), given the rest of the body.

use serde_json::{json, Value};

use super::{Body, Edge, WsMsg, VOCAB};

/// The top-level keys `edge` takes for a message like `m`.
pub fn keys(edge: Edge, m: &WsMsg) -> Vec<&'static str> {
    let shared = [
        "max_tokens",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "seed",
        "stop",
        "plugins",
        "cache",
        "cache_salt",
        "logprobs",
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
    ];
    let chat = [
        "messages",
        "top_logprobs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "chat_template_kwargs",
    ];
    let http = ["model", "stream", "stream_options", "user"];
    let mut k: Vec<&str> = match (edge, m) {
        (Edge::Ws, WsMsg::Generate(_)) => [&["type", "id", "prompt"][..], &shared, &chat].concat(),
        (Edge::Ws, WsMsg::Tokenize(..)) => vec!["type", "id", "text", "special"],
        (Edge::Ws, WsMsg::Detokenize(..)) => vec!["type", "id", "token_ids"],
        (Edge::Ws, _) => vec!["type", "id"],
        (Edge::Chat, _) => [&shared[..], &chat, &http, &["max_completion_tokens"]].concat(),
        (Edge::Completion, _) => [&shared[..], &http, &["prompt", "suffix", "best_of"]].concat(),
    };
    k.sort_unstable();
    k
}

/// Values of the wrong JSON type for `field` on `edge`.
pub fn wrong_type(field: &str, edge: Edge) -> Vec<Value> {
    let (num, int, boolean, string) = (
        vec![json!("0.5"), json!(true), json!([1]), json!({"v": 1})],
        vec![
            json!("5"),
            json!(false),
            json!([]),
            json!({}),
            json!(1.5),
            json!(2e-3),
        ],
        vec![json!(1), json!("true"), json!([true]), json!({})],
        vec![json!(5), json!(true), json!(["s"]), json!({"s": 1})],
    );
    match field {
        "temperature" | "top_p" | "min_p" | "presence_penalty" | "frequency_penalty"
        | "repetition_penalty" => num,
        "max_tokens"
        | "max_completion_tokens"
        | "top_k"
        | "seed"
        | "n"
        | "top_logprobs"
        | "repeat_last_n"
        | "min_tokens"
        | "best_of" => int,
        "cache" | "echo" | "speculative" | "stream" | "parallel_tool_calls" | "special" => boolean,
        "logprobs" if edge == Edge::Completion => {
            vec![
                json!("yes"),
                json!([]),
                json!({}),
                json!(true),
                json!(1.5),
                json!(6),
                json!(-1),
            ]
        }
        "logprobs" => vec![json!("yes"), json!(3), json!([]), json!({})],
        "messages" | "prompt" => vec![json!(5), json!(true), json!({"role": "user"})],
        "tool_choice" => vec![json!(5), json!([]), json!(true), json!("sometimes")],
        "token_ids" => vec![json!(5), json!("1 2"), json!({"0": 1})],
        "logit_bias" | "chat_template_kwargs" => vec![json!(5), json!("x"), json!([1])],
        "stop" | "plugins" | "response_format" | "tools" | "stream_options" => {
            vec![json!(5), json!(false), json!({"x": [1]})]
        }
        _ => string,
    }
}

/// Values out of `field`'s bound (or wrong inside it), given the rest of the body.
pub fn out_of_bound(field: &str, edge: Edge, b: &Body) -> Vec<Value> {
    let chat = b.is_chat() || edge == Edge::Chat;
    let msg = json!({"role": "user", "content": "x"});
    let tool = |name: Value| json!({"type": "function", "function": {"name": name}});
    match field {
        "temperature" => vec![json!(-0.001), json!(100.001), json!(1e300), json!(-1e-300)],
        "top_k" => vec![json!(VOCAB + 1), json!(-1), json!(1e20), json!(u64::MAX)],
        "top_p" => vec![json!(0), json!(-0.5), json!(1.0001), json!(1e-50)],
        "min_p" => vec![json!(-0.001), json!(1.001), json!(-1e300)],
        "seed" => vec![json!(-1), json!(1.8446744073709552e19), json!(-9.3e18)],
        "max_tokens" | "max_completion_tokens" => {
            let zero = if b.echo == Some(true) {
                json!(-3)
            } else {
                json!(0)
            };
            vec![json!(1_000_001), json!(-1), zero, json!(1e19)]
        }
        "n" => vec![json!(0), json!(17), json!(-2)],
        "presence_penalty" | "frequency_penalty" => vec![json!(2.001), json!(-2.001), json!(1e9)],
        "repetition_penalty" => vec![json!(0), json!(-1), json!(10.001)],
        "repeat_last_n" => vec![json!(-2), json!(-100), json!(1e30)],
        "min_tokens" => vec![
            json!(b.effective_max_tokens().unwrap_or(256) + 1),
            json!(-1),
        ],
        "top_logprobs" => vec![json!(21), json!(-1)],
        "logprobs" if edge == Edge::Completion => vec![json!(6), json!(-1)],
        "best_of" => vec![json!(2), json!(0)],
        "suffix" => vec![json!("tail")],
        "model" => vec![json!(""), json!(7)],
        "cache_salt" => vec![json!(""), json!("s".repeat(257))],
        "stop" => vec![
            json!(""),
            json!(["ok", ""]),
            json!(vec!["s"; 17]),
            json!(["x".repeat(513)]),
            json!([1]),
        ],
        "stream_options" => vec![
            json!({"include_usage": true, "extra": 1}),
            json!({"include_usage": 1}),
        ],
        "echo" if chat => vec![json!(true)],
        "id" => vec![json!(""), json!("i".repeat(257))],
        "type" => vec![json!("generat"), json!(""), json!("GENERATE")],
        "messages" => vec![
            json!([]),
            json!([{"role": "user"}]),
            json!([msg, {"role": "", "content": "x"}]),
            json!([{"role": 5, "content": "x"}]),
            json!([msg, {"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}]),
            json!([{"role": "user", "content": [{"type": "text"}]}]),
            json!([{"role": "user", "content": "x", "extra": 1}]),
            json!([{"role": "assistant", "tool_calls": [{"function": {"name": "a b"}}]}]),
            json!([{"role": "assistant", "content": "", "tool_calls": {}}]),
            json!([{"role": "tool", "content": "x", "tool_call_id": 7}]),
        ],
        "prompt" if edge == Edge::Completion => vec![
            json!(""),
            json!([]),
            json!(["a", "b"]),
            json!([VOCAB]),
            json!([-1]),
        ],
        "prompt" => vec![
            json!(""),
            json!([]),
            json!([VOCAB]),
            json!([0, -1]),
            json!([1.5]),
            json!(["a"]),
        ],
        "token_ids" => vec![json!([VOCAB]), json!([-1]), json!([0, 1.5]), json!([1e20])],
        "plugins" => vec![
            json!(vec![json!({"name": "p"}); 9]),
            json!([{"name": ""}]),
            json!([{}]),
            json!([5]),
            json!([{"name": "p", "cfg": {}}]),
        ],
        "logit_bias" => vec![
            json!({"01": 1}),
            json!({"-1": 1}),
            json!({"1.0": 1}),
            json!({" 1": 1}),
            json!({"": 1}),
            json!({(VOCAB).to_string(): 1}),
            json!({"1": 100.01}),
            json!({"1": "x"}),
            json!({"1": null}),
        ],
        "response_format" => vec![
            json!({"type": "xml"}),
            json!({}),
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"schema": 5}}),
            json!({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}),
            json!({"type": "regex", "regex": ""}),
            json!({"type": "grammar", "grammar": 5}),
            json!({"type": "text", "regex": "a"}),
        ],
        "tools" => vec![
            json!([tool(json!("a b"))]),
            json!([tool(json!("x".repeat(65)))]),
            json!([tool(json!("f")), tool(json!("f"))]),
            json!([{"type": "fn", "function": {"name": "f"}}]),
            json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]),
            json!([{"type": "function"}]),
            json!(vec![json!(1); 129]),
        ],
        "tool_choice" => vec![
            json!("sometimes"),
            json!({"type": "function", "function": {"name": "no-such-tool-registered"}}),
            json!({"type": "function"}),
        ],
        "chat_template_kwargs" if chat => {
            vec![json!({"messages": []}), json!({"bos_token": "<s>"})]
        }
        "chat_template_kwargs" | "parallel_tool_calls" => vec![json!({})],
        _ => vec![],
    }
}
