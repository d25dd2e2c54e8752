//! A generated token's log-probability and the step's most likely alternatives, as
//! streamed to the client (computed by `sampling::logprobs`).

/// One token and its log-probability (natural log).
#[derive(Debug, Clone, PartialEq)]
pub struct TopLogprob {
    /// Token id.
    pub token: u32,
    /// `ln p(token)` under the raw distribution; `−∞` for a token the model ruled out.
    pub logprob: f32,
    /// The token's bytes as generated (control tokens as their text); filled in by the
    /// engine, which holds the tokenizer.
    pub bytes: Vec<u8>,
}

/// The sampled token's log-probability and the `n` most likely tokens of the step.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The sampled token.
    pub chosen: TopLogprob,
    /// The `n` most likely tokens, most likely first (ties: lower id first).
    pub top: Vec<TopLogprob>,
}
