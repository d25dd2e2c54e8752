//! Structured output: a [`Constraint`] masks every token that cannot continue the
//! request's grammar (JSON schema, regex or Lark), through the `llguidance` crate.
//!
//! [`GrammarCompiler`] holds llguidance's token trie over this model's vocabulary,
//! built once (lazily, on the first constrained request) from our own token bytes —
//! not from `toktrie_hf_tokenizers`, which pins another `tokenizers` version.
//! Compiling a grammar happens when the request is prepared, on the prepare pool,
//! never on the engine loop.

use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use super::context::StepContext;
use super::processor::LogitsProcessor;
use crate::error::InferError;
use crate::request::ConstraintSpec;

/// JSON layout the schema grammars allow: `", "` between items, `": "` after keys, no
/// other whitespace — so the model cannot spend its budget on whitespace and
/// generation ends (llguidance's `x-guidance` options).
pub(crate) fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// The JSON Schema keywords llguidance enforces (`IMPLEMENTED` in its
/// `src/json/schema.rs`, 1.9.1).
const ENFORCED: &[&str] = &[
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "const",
    "enum",
    "type",
    "items",
    "additionalItems",
    "prefixItems",
    "minItems",
    "maxItems",
    "properties",
    "additionalProperties",
    "patternProperties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
];

/// Keywords that only annotate (llguidance's `META_AND_ANNOTATIONS`), and its own
/// `x-guidance` options.
const ANNOTATIONS: &[&str] = &[
    "$anchor",
    "$defs",
    "definitions",
    "$schema",
    "$id",
    "id",
    "$comment",
    "title",
    "description",
    "default",
    "readOnly",
    "writeOnly",
    "examples",
    "contentMediaType",
    "contentEncoding",
    "x-guidance",
];

/// Refuses any key of `schema` (and of its subschemas) that llguidance would neither
/// enforce nor treat as an annotation: llguidance itself refuses JSON Schema keywords
/// it does not implement, but ignores words outside the vocabulary (as the JSON
/// Schema spec allows), so a misspelt `maxLenght` would be dropped silently.
pub(crate) fn check_keywords(schema: &Value, at: &str) -> Result<(), String> {
    let Value::Object(map) = schema else {
        return Ok(()); // `true` / `false` schemas, or a type error llguidance reports
    };
    for (key, v) in map {
        if !ENFORCED.contains(&key.as_str()) && !ANNOTATIONS.contains(&key.as_str()) {
            return Err(format!(
                "keyword {key:?} at {at} is not one inferd enforces (enforced: {})",
                ENFORCED.join(", ")
            ));
        }
        let here = format!("{at}/{key}");
        match key.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" => {
                if let Value::Object(subs) = v {
                    for (name, sub) in subs {
                        check_keywords(sub, &format!("{here}/{name}"))?;
                    }
                }
            }
            "items" | "additionalItems" | "additionalProperties" => check_keywords(v, &here)?,
            "prefixItems" | "anyOf" | "oneOf" | "allOf" => {
                if let Value::Array(subs) = v {
                    for (i, sub) in subs.iter().enumerate() {
                        check_keywords(sub, &format!("{here}/{i}"))?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// One vocabulary's llguidance parser factory.
pub struct GrammarCompiler {
    factory: ParserFactory,
    /// The token llguidance treats as end of sequence (the chat's end of turn).
    eos: u32,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// A compiler over `words[id]`: each token's bytes as generated, special tokens
    /// as `0xFF` followed by their text (toktrie's `SPECIAL_TOKEN_MARKER`, so grammar
    /// text never matches them). `eos` ends a finished grammar.
    ///
    /// # Errors
    /// `internal` when llguidance rejects the vocabulary.
    pub fn new(words: &[Vec<u8>], eos: u32) -> Result<Self, InferError> {
        let info = TokRxInfo::new(words.len() as u32, eos);
        let trie = TokTrie::from(&info, words);
        let env: TokEnv = std::sync::Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| InferError::internal(format!("llguidance token environment: {e}")))?;
        factory.quiet();
        Ok(Self { factory, eos })
    }

    /// Compiles `spec` into a fresh constraint; `eog` are every end-of-generation id
    /// (all allowed once the grammar accepts).
    ///
    /// # Errors
    /// `validation` naming `response_format` and llguidance's reason: a schema keyword
    /// it does not enforce, an invalid regex or grammar.
    pub fn compile(&self, spec: &ConstraintSpec, eog: &[u32]) -> Result<Constraint, InferError> {
        let (grammar, field) = match spec {
            ConstraintSpec::JsonObject => {
                let mut schema = json!({"type": "object"});
                schema["x-guidance"] = json_layout();
                (TopLevelGrammar::from_json_schema(schema), "response_format")
            }
            ConstraintSpec::JsonSchema(schema) => {
                check_keywords(schema, "#").map_err(|e| {
                    InferError::validation(format!("response_format.json_schema.schema: {e}"))
                })?;
                let mut schema = schema.clone();
                if let Some(obj) = schema.as_object_mut() {
                    obj.entry("x-guidance").or_insert_with(json_layout);
                }
                (
                    TopLevelGrammar::from_json_schema(schema),
                    "response_format.json_schema.schema",
                )
            }
            ConstraintSpec::Regex(rx) => (TopLevelGrammar::from_regex(rx), "response_format.regex"),
            ConstraintSpec::Grammar(lark) => (
                TopLevelGrammar::from_lark(lark.clone()),
                "response_format.grammar",
            ),
        };
        self.compile_grammar(grammar, field, eog)
    }

    /// Compiles the Lark grammar of a forced tool call
    /// ([`super::tool_grammar::tool_call_grammar`]); errors name `tools`.
    ///
    /// # Errors
    /// `validation` with llguidance's reason.
    pub fn compile_tool_calls(&self, lark: String, eog: &[u32]) -> Result<Constraint, InferError> {
        self.compile_grammar(TopLevelGrammar::from_lark(lark), "tools", eog)
    }

    fn compile_grammar(
        &self,
        grammar: TopLevelGrammar,
        field: &str,
        eog: &[u32],
    ) -> Result<Constraint, InferError> {
        let parser = self.factory.create_parser(grammar).map_err(|e| {
            InferError::validation(format!("{field}: {}", one_line(&e.to_string())))
        })?;
        Ok(Constraint {
            matcher: Matcher::new(Ok(parser)),
            eos: self.eos,
            eog: eog.to_vec(),
            saved: Vec::new(),
            ended_after_stop: false,
            mask_time: Duration::ZERO,
            steps: 0,
            ready: None,
            late: 0,
        })
    }
}

/// A [`GrammarCompiler`] built on first use and shared by the prepare pool (building
/// the token trie of a 262k vocabulary takes a moment; unconstrained daemons never pay).
#[derive(Debug, Default)]
pub struct LazyCompiler {
    cell: std::sync::OnceLock<Result<std::sync::Arc<GrammarCompiler>, InferError>>,
}

impl LazyCompiler {
    /// The compiler, built by `words()` (see [`GrammarCompiler::new`]) on the first
    /// call.
    ///
    /// # Errors
    /// The build's error, every time.
    pub fn get(
        &self,
        words: impl FnOnce() -> (Vec<Vec<u8>>, u32),
    ) -> Result<std::sync::Arc<GrammarCompiler>, InferError> {
        self.cell
            .get_or_init(|| {
                let (w, eos) = words();
                GrammarCompiler::new(&w, eos).map(std::sync::Arc::new)
            })
            .clone()
    }
}

/// A compiled grammar following one sequence: `apply` sets the logit of every token
/// the grammar cannot take next to `−∞`; once the grammar is complete only the
/// end-of-generation tokens remain.
pub struct Constraint {
    matcher: Matcher,
    eos: u32,
    eog: Vec<u32>,
    /// Reused: the end-of-generation logits, kept across the mask.
    saved: Vec<f32>,
    /// An end-of-generation token was accepted after the grammar stopped.
    ended_after_stop: bool,
    mask_time: Duration,
    steps: u64,
    /// The mask for the matcher's current state, computed ahead by [`Self::prepare`]
    /// (while the forward pass runs); dropped by `accept` and `rollback`.
    ready: Option<llguidance::toktrie::SimpleVob>,
    /// Masks computed on the critical path (in `apply`, nothing prepared).
    late: u64,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("eos", &self.eos)
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl Constraint {
    /// Mean time of one mask computation so far (for the per-step cost).
    pub fn mean_mask_time(&self) -> Duration {
        self.mask_time
            .checked_div(self.steps.max(1) as u32)
            .unwrap_or_default()
    }

    /// How many masks `apply` had to compute itself (none was prepared).
    pub fn late_masks(&self) -> u64 {
        self.late
    }

    /// Computes the next step's mask now, off the critical path: the scheduler calls it
    /// while the model runner computes the logits, and `apply` then only applies it.
    /// A failure is left for `apply` to report.
    pub fn prepare(&mut self) {
        if self.ready.is_none() {
            let start = Instant::now();
            self.ready = self.matcher.compute_mask_or_eos().ok();
            self.mask_time += start.elapsed();
        }
    }

    fn error(&self, what: &str, e: impl std::fmt::Display) -> InferError {
        InferError::internal(format!("constraint: {what}: {e}"))
    }
}

impl LogitsProcessor for Constraint {
    fn name(&self) -> &str {
        "response_format"
    }

    fn apply(&mut self, _ctx: &StepContext<'_>, logits: &mut [f32]) -> Result<(), InferError> {
        let start = Instant::now();
        let mask = match self.ready.take() {
            Some(m) => m,
            None => {
                self.late += 1;
                self.matcher
                    .compute_mask_or_eos()
                    .map_err(|e| self.error("mask", e))?
            }
        };
        self.saved.clear();
        self.saved.extend(
            self.eog
                .iter()
                .map(|&t| logits.get(t as usize).copied().unwrap_or(0.0)),
        );
        let words = mask.as_slice();
        for (i, chunk) in logits.chunks_mut(32).enumerate() {
            // Most words of a grammar's mask are all-banned or all-allowed: fill or
            // skip them whole, and visit only the banned bits of the rest.
            let mut banned = !words.get(i).copied().unwrap_or(0);
            if banned == u32::MAX {
                chunk.fill(f32::NEG_INFINITY);
                continue;
            }
            while banned != 0 {
                let b = banned.trailing_zeros() as usize;
                if let Some(l) = chunk.get_mut(b) {
                    *l = f32::NEG_INFINITY;
                }
                banned &= banned - 1;
            }
        }
        if mask.is_allowed(self.eos) {
            // A complete grammar allows nothing else: the turn ends even where an
            // earlier processor banned its end (`min_tokens`), else no token is left.
            let complete = self.matcher.is_stopped();
            let banned = self.saved.iter().all(|&l| l == f32::NEG_INFINITY);
            for (&t, &l) in self.eog.iter().zip(&self.saved) {
                if let Some(x) = logits.get_mut(t as usize) {
                    *x = if complete && banned { 0.0 } else { l };
                }
            }
        }
        self.mask_time += start.elapsed();
        self.steps += 1;
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<(), InferError> {
        self.ready = None;
        if self.eog.contains(&token) && self.matcher.is_stopped() {
            // The grammar is complete and has no EOS of its own to take: the end of
            // generation is recorded here (for rollback) and not fed to it.
            self.ended_after_stop = true;
            return Ok(());
        }
        // Every end-of-generation token ends the grammar as its EOS does.
        let token = if self.eog.contains(&token) {
            self.eos
        } else {
            token
        };
        self.matcher
            .consume_token(token)
            .map_err(|e| self.error(&format!("token {token}"), e))
    }

    fn rollback(&mut self, n: usize) {
        self.ready = None;
        let mut n = n;
        if n > 0 && std::mem::take(&mut self.ended_after_stop) {
            n -= 1;
        }
        if n > 0 {
            if let Err(e) = self.matcher.rollback(n) {
                tracing::warn!(error = %e, n, "constraint rollback failed");
            }
        }
    }
}

/// llguidance's message on one line: its lines (a source excerpt under a caret, a
/// cause) joined by "; ", blank ones dropped, so an error frame and the daemon's
/// one-line log records stay one line each.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level toy vocabulary: ids 0–255 one byte each, 256 `{"a": `-like
    /// multi-byte tokens, 259 the end-of-turn special token.
    fn compiler() -> (GrammarCompiler, u32) {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push(b"{\"".to_vec());
        words.push(b"\": ".to_vec());
        words.push(b"true".to_vec());
        words.push(b"\xFF<|end|>".to_vec());
        let eos = 259;
        (GrammarCompiler::new(&words, eos).expect("vocabulary"), eos)
    }

    fn ctx() -> StepContext<'static> {
        StepContext {
            sequence_id: 1,
            prompt: &[],
            generated: &[],
        }
    }

    fn allowed(c: &mut Constraint) -> Vec<u32> {
        let mut logits = vec![0.0f32; 260];
        c.apply(&ctx(), &mut logits).expect("apply");
        (0..260u32).filter(|&i| logits[i as usize] == 0.0).collect()
    }

    #[test]
    fn llguidance_errors_come_out_on_one_line() {
        let (comp, eos) = compiler();
        for spec in [
            ConstraintSpec::Grammar("start: foo\nfoo: \"a\" (\n".into()),
            ConstraintSpec::Regex("(abc".into()),
        ] {
            let Err(e) = comp.compile(&spec, &[eos]) else {
                panic!("{spec:?} compiled");
            };
            assert!(!e.message.contains('\n'), "{:?}", e.message);
            assert!(e.message.starts_with("response_format."), "{:?}", e.message);
        }
        assert_eq!(one_line("a\n  ^\n\nb "), "a; ^; b");
    }

    #[test]
    fn regex_allows_only_its_continuations_then_end_of_turn() {
        let (comp, eos) = compiler();
        let mut c = comp
            .compile(&ConstraintSpec::Regex("ab|ac".into()), &[eos])
            .expect("compile");
        assert_eq!(allowed(&mut c), vec![u32::from(b'a')]);
        c.accept(u32::from(b'a')).expect("a");
        assert_eq!(allowed(&mut c), vec![u32::from(b'b'), u32::from(b'c')]);
        c.accept(u32::from(b'c')).expect("c");
        assert_eq!(allowed(&mut c), vec![eos]);
        c.accept(eos).expect("end of turn");
        c.rollback(2);
        assert_eq!(allowed(&mut c), vec![u32::from(b'b'), u32::from(b'c')]);
    }

    /// `min_tokens` bans the end of turn; a complete grammar still ends it.
    #[test]
    fn prepared_masks_are_used_once_and_dropped_by_accept_and_rollback() {
        let (comp, eos) = compiler();
        let mut c = comp
            .compile(&ConstraintSpec::Regex("ab|ac".into()), &[eos])
            .expect("compile");
        c.prepare();
        assert_eq!(allowed(&mut c), vec![u32::from(b'a')]);
        assert_eq!(c.late_masks(), 0, "the prepared mask was applied");
        c.accept(u32::from(b'a')).expect("a");
        c.prepare();
        c.prepare();
        assert_eq!(allowed(&mut c), vec![u32::from(b'b'), u32::from(b'c')]);
        assert_eq!(c.late_masks(), 0);
        c.prepare();
        c.rollback(1);
        assert_eq!(allowed(&mut c), vec![u32::from(b'a')], "stale mask dropped");
        assert_eq!(c.late_masks(), 1);
        c.prepare();
        c.accept(u32::from(b'a')).expect("a");
        assert_eq!(allowed(&mut c), vec![u32::from(b'b'), u32::from(b'c')]);
        assert_eq!(
            c.late_masks(),
            2,
            "a mask prepared before accept is not reused"
        );
    }

    #[test]
    fn a_complete_grammar_ends_the_turn_despite_a_ban() {
        let (comp, eos) = compiler();
        let mut c = comp
            .compile(&ConstraintSpec::Regex("a".into()), &[eos])
            .expect("compile");
        c.accept(u32::from(b'a')).expect("a");
        let mut logits = vec![0.0f32; 260];
        logits[eos as usize] = f32::NEG_INFINITY;
        c.apply(&ctx(), &mut logits).expect("apply");
        let finite: Vec<usize> = (0..260).filter(|&i| logits[i].is_finite()).collect();
        assert_eq!(finite, vec![eos as usize]);
    }

    #[test]
    fn schema_keywords_it_cannot_enforce_are_refused() {
        let (comp, eos) = compiler();
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}},
                            "dependentSchemas": {"a": {"required": ["b"]}}});
        let e = comp
            .compile(&ConstraintSpec::JsonSchema(schema), &[eos])
            .expect_err("unsupported keyword");
        assert!(
            e.message
                .starts_with("response_format.json_schema.schema: ")
                && e.message.contains("dependentSchemas"),
            "{}",
            e.message
        );
        assert!(comp
            .compile(&ConstraintSpec::Regex("(".into()), &[eos])
            .is_err());
        let typo =
            json!({"type": "object", "properties": {"a": {"type": "string", "maxLenght": 3}}});
        let e = comp
            .compile(&ConstraintSpec::JsonSchema(typo), &[eos])
            .expect_err("misspelt keyword");
        assert!(
            e.message.starts_with(
                "response_format.json_schema.schema: keyword \"maxLenght\" at #/properties/a is not one inferd enforces"
            ),
            "{}",
            e.message
        );
        let ok = json!({"type": "object", "title": "t", "$defs": {"d": {"type": "integer"}},
                        "properties": {"a": {"$ref": "#/$defs/d", "description": "x"}}});
        assert!(comp
            .compile(&ConstraintSpec::JsonSchema(ok), &[eos])
            .is_ok());
    }

    #[test]
    fn json_schema_starts_with_an_object() {
        let (comp, eos) = compiler();
        let schema = json!({"type": "object", "properties": {"a": {"type": "boolean"}},
                            "required": ["a"], "additionalProperties": false});
        let mut c = comp
            .compile(&ConstraintSpec::JsonSchema(schema), &[eos])
            .expect("compile");
        let first = allowed(&mut c);
        assert!(
            first.contains(&u32::from(b'{')) && first.contains(&256),
            "{first:?}"
        );
        assert!(!first.contains(&eos) && !first.contains(&u32::from(b' ')));
    }
}
