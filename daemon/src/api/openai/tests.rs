use serde_json::json;

use super::*;
use crate::request::PromptInput;

fn parse(body: Value, ep: Endpoint) -> Result<(GenerateRequest, ResponseOptions), BodyError> {
    let bytes = serde_json::to_vec(&body).expect("json");
    parse_body(
        &bytes,
        ep,
        "m",
        "x".into(),
        &SamplingDefaults::default(),
        100,
    )
}

/// The message of a refused body.
fn refusal(body: Value, ep: Endpoint) -> String {
    match parse(body, ep) {
        Ok(_) => panic!("accepted"),
        Err(BodyError::Invalid(e)) => e.message,
    }
}

fn chat(extra: Value) -> Value {
    let mut b = json!({"messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

#[test]
fn chat_fields_reach_the_request() {
    let (r, o) = parse(
        chat(
            json!({"model": "m", "max_completion_tokens": 5, "max_tokens": 9,
                    "temperature": 0, "stream": true, "stream_options": {"include_usage": true},
                    "n": 1, "top_k": 3, "presence_penalty": 0, "user": "u"}),
        ),
        Endpoint::Chat,
    )
    .expect("valid");
    assert_eq!(r.sampling.max_tokens, 5, "max_completion_tokens wins");
    assert_eq!((r.sampling.temperature, r.sampling.top_k), (0.0, 3));
    assert_eq!(r.client_id, "x");
    assert!(o.stream && o.include_usage && !o.logprobs);
}

/// Penalties, bias and log-probabilities reach the request; the completions
/// endpoint's integer `logprobs` becomes `top_logprobs`.
#[test]
fn steering_fields_reach_the_request() {
    let (r, o) = parse(
        chat(json!({"presence_penalty": 0.5, "frequency_penalty": -1,
                    "logit_bias": {"1": 5}, "logprobs": true, "top_logprobs": 3,
                    "repetition_penalty": 1.1, "repeat_last_n": 8, "min_tokens": 2})),
        Endpoint::Chat,
    )
    .expect("valid");
    let s = &r.sampling;
    assert_eq!((s.presence_penalty, s.frequency_penalty), (0.5, -1.0));
    assert_eq!(s.logit_bias, vec![(1, 5.0)]);
    assert_eq!(s.logprobs, Some(3));
    assert_eq!((s.repetition_penalty, s.repeat_last_n), (1.1, Some(8)));
    assert_eq!(s.min_tokens, 2);
    assert!(o.logprobs);
    let (r, o) = parse(json!({"prompt": "x", "logprobs": 2}), Endpoint::Completion).expect("ok");
    assert_eq!(r.sampling.logprobs, Some(2));
    assert!(o.logprobs);
    let (r, o) = parse(
        json!({"prompt": "x", "logprobs": null}),
        Endpoint::Completion,
    )
    .expect("ok");
    assert!(r.sampling.logprobs.is_none() && !o.logprobs);
    let (r, _) = parse(json!({"prompt": "x", "logprobs": 0}), Endpoint::Completion).expect("ok");
    assert_eq!(r.sampling.logprobs, Some(0), "the sampled token's only");
}

#[test]
fn completion_prompt_forms() {
    let prompt = |p: Value| parse(json!({"prompt": p}), Endpoint::Completion).map(|(r, _)| r.input);
    assert_eq!(
        prompt(json!(["once"])),
        Ok(PromptInput::Text("once".into()))
    );
    assert_eq!(prompt(json!([1, 2])), Ok(PromptInput::Tokens(vec![1, 2])));
    assert_eq!(prompt(json!([[3, 4]])), Ok(PromptInput::Tokens(vec![3, 4])));
    assert_eq!(
        refusal(json!({"prompt": ["a", "b"]}), Endpoint::Completion),
        "prompt must be a string, an array of token ids, or an array of one of those \
         (batches of prompts are not supported; got an array of 2 items)"
    );
    let (r, o) = parse(
        json!({"prompt": "x", "echo": true, "n": 3, "max_tokens": 0}),
        Endpoint::Completion,
    )
    .expect("scoring request");
    assert_eq!(
        (r.sampling.echo, r.sampling.n, r.sampling.max_tokens),
        (true, 3, 0)
    );
    assert!(!o.stream);
}

#[test]
fn unsupported_values_unknown_fields_and_other_models_are_refused() {
    let cases = [
        (
            json!({"prompt": "x", "best_of": 2}),
            "best_of must be 1 (got 2)",
        ),
        (chat(json!({"best_of": 1})), "unknown field \"best_of\""),
        (
            chat(json!({"prompt": "x"})),
            "unknown field \"prompt\"; this endpoint accepts ",
        ),
        (
            chat(json!({"stream": "yes"})),
            "stream must be a boolean (got \"yes\")",
        ),
        (
            chat(json!({"model": ""})),
            "model must name the base model or a loaded LoRA adapter (got \"\")",
        ),
        (chat(json!({"model": 4})), "model must be a string (got 4)"),
        (
            chat(json!({"stream_options": {"include_usage": true}})),
            "stream_options is only allowed with stream: true (got no stream)",
        ),
        (
            chat(json!({"stream": true, "stream_options": {"x": 1}})),
            "stream_options: unknown field \"x\"; it accepts include_usage",
        ),
        (
            chat(json!({"max_completion_tokens": 0})),
            "max_completion_tokens must be >= 1 (got 0)",
        ),
        (
            chat(json!({"n": 2, "echo": true})),
            "echo must be false with messages",
        ),
        (
            chat(json!({"logprobs": 2})),
            "logprobs must be a boolean (got 2)",
        ),
        (
            chat(json!({"logprobs": "yes"})),
            "logprobs must be a boolean (got \"yes\")",
        ),
        (
            json!({"prompt": "x", "logprobs": 6}),
            "logprobs must be an integer in [0, 5] on /v1/completions (got 6)",
        ),
        (
            json!({"prompt": "x", "logprobs": true}),
            "logprobs must be an integer in [0, 5] on /v1/completions (got true)",
        ),
        (
            json!({"prompt": "x", "suffix": "y"}),
            "suffix must be \"\" or null (got \"y\")",
        ),
        (
            json!({"prompt": "x", "top_logprobs": 2}),
            "unknown field \"top_logprobs\"",
        ),
        (json!([1]), "the request body must be a JSON object"),
        (json!({"messages": null}), "messages is required"),
        (json!({"prompt": null}), "prompt is required"),
        (
            json!({"prompt": "x", "logprobs": "2"}),
            "logprobs must be an integer in [0, 5] on /v1/completions (got \"2\")",
        ),
        (
            json!({"prompt": "x", "best_of": 1.0}),
            "best_of must be an integer (got 1.0)",
        ),
        (
            chat(json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": "yes"}}})),
            "response_format.json_schema.strict must be a boolean (got \"yes\")",
        ),
        (
            chat(json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": 5, "schema": {}}}})),
            "response_format.json_schema.name must be a string (got 5)",
        ),
    ];
    for (body, message) in cases {
        let ep = if body.get("messages").is_some() {
            Endpoint::Chat
        } else {
            Endpoint::Completion
        };
        let got = refusal(body.clone(), ep);
        assert!(got.starts_with(message), "{body}: {got}");
    }
    // Null is absent; a whole-number float is an integer's type error, as on the WS edge.
    assert!(parse(chat(json!({"n": null, "logit_bias": {}})), Endpoint::Chat).is_ok());
    assert_eq!(
        refusal(chat(json!({"n": 1.5})), Endpoint::Chat),
        "n must be an integer (got 1.5)"
    );
    assert!(parse(
        json!({"prompt": "x", "suffix": "", "best_of": 1}),
        Endpoint::Completion
    )
    .is_ok());
}

/// Refusals that once lacked the value given: `stream_options` says which `stream` it
/// came with, an empty completions prompt says it was empty.
#[test]
fn refusals_say_the_value_given() {
    let cases = [
        (
            chat(json!({"stream_options": {"include_usage": true}})),
            Endpoint::Chat,
            "stream_options is only allowed with stream: true (got no stream)",
        ),
        (
            chat(json!({"stream": null, "stream_options": {}})),
            Endpoint::Chat,
            "stream_options is only allowed with stream: true (got no stream)",
        ),
        (
            chat(json!({"stream": false, "stream_options": {"include_usage": true}})),
            Endpoint::Chat,
            "stream_options is only allowed with stream: true (got stream: false)",
        ),
        (
            json!({"prompt": "x", "stream": false, "stream_options": {}}),
            Endpoint::Completion,
            "stream_options is only allowed with stream: true (got stream: false)",
        ),
        (
            json!({"prompt": ""}),
            Endpoint::Completion,
            "prompt must be a non-empty string (got \"\")",
        ),
        (
            json!({"prompt": [""]}),
            Endpoint::Completion,
            "prompt must be a non-empty string (got \"\")",
        ),
    ];
    for (body, ep, message) in cases {
        assert_eq!(refusal(body.clone(), ep), message, "{body}");
    }
}

/// Found by the edge fuzzer (`api::fuzz`): `{"messages": [...], "max_completion_tokens":
/// 1, "max_tokens": -1}` was accepted, the `max_tokens` beside the alias that wins
/// going unchecked.
#[test]
fn max_tokens_beside_max_completion_tokens_is_still_checked() {
    for bad in [json!(-1), json!(0), json!(1_000_001), json!(1.5)] {
        let body = chat(json!({"max_completion_tokens": 1, "max_tokens": bad}));
        let got = refusal(body, Endpoint::Chat);
        assert!(got.starts_with("max_tokens must be"), "{got}");
    }
    let (r, _) = parse(
        chat(json!({"max_completion_tokens": 1, "max_tokens": 9})),
        Endpoint::Chat,
    )
    .expect("valid");
    assert_eq!(r.sampling.max_tokens, 1);
}

/// Found by the edge fuzzer: `POST /v1/completions` with `{"prompt": "a", "logprobs":
/// false}` answered with a `logprobs` object in each choice; `false` asks for none, as
/// an absent field does.
#[test]
fn completions_logprobs_false_asks_for_none() {
    for (logprobs, asked) in [
        (json!(false), false),
        (json!(null), false),
        (json!(0), true),
    ] {
        let (r, o) = parse(
            json!({"prompt": "a", "logprobs": logprobs}),
            Endpoint::Completion,
        )
        .expect("valid");
        assert_eq!(o.logprobs, asked, "{logprobs}");
        assert_eq!(r.sampling.logprobs.is_some(), asked, "{logprobs}");
    }
}

/// `model` naming anything but the base names a LoRA adapter (resolved when the
/// request starts); `lora_scale` rides along; `adapter` is the WebSocket's field only.
#[test]
fn model_names_the_base_or_an_adapter() {
    let (r, _) = parse(chat(json!({"model": "m"})), Endpoint::Chat).expect("base");
    assert_eq!(r.adapter, None);
    let (r, _) = parse(
        chat(json!({"model": "sql-lora", "lora_scale": 0.5})),
        Endpoint::Chat,
    )
    .expect("adapter");
    assert_eq!(
        r.adapter,
        Some(crate::request::AdapterChoice {
            name: "sql-lora".into(),
            scale: 0.5,
            field: "model",
        })
    );
    let (r, _) = parse(json!({"prompt": "x", "model": "a"}), Endpoint::Completion).expect("ok");
    assert_eq!(
        r.adapter.map(|a| (a.name, a.scale)),
        Some(("a".into(), 1.0))
    );
    assert!(refusal(chat(json!({"adapter": "a"})), Endpoint::Chat)
        .starts_with("unknown field \"adapter\""));
    assert_eq!(
        refusal(chat(json!({"lora_scale": 2})), Endpoint::Chat),
        "lora_scale needs an adapter (WebSocket \"adapter\", or an adapter's name as the \
         OpenAI \"model\")"
    );
    assert_eq!(
        refusal(
            chat(json!({"model": "a", "lora_scale": 16.5})),
            Endpoint::Chat
        ),
        "lora_scale must be a number in [-16, 16] (got 16.5)"
    );
}
