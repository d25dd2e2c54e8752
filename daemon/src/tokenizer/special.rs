//! Token types, special-token detection and the special-token partition.
//!
//! Mirrors llama.cpp's `llama-vocab.cpp` (release b11312): `tokenizer.ggml.token_type` values map to
//! attributes, a few tokens are recognised by their text (end-of-turn, fill-in-the-middle markers)
//! and forced to control type, the end-of-generation (EOG) set is derived from them, and
//! `tokenizer_st_partition` splits special-token text out of the input before byte-level BPE runs
//! on the remaining fragments.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

/// Type of one vocabulary entry, from `tokenizer.ggml.token_type` (llama.cpp's `llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// `0` or any value this crate does not know: never produced by BPE, decodes to nothing.
    Undefined,
    /// `1`: an ordinary byte-level BPE token.
    Normal,
    /// `2`: the unknown token; split out like a control token.
    Unknown,
    /// `3`: a control token (`<|im_start|>`); its text maps to it only with `parse_special`,
    /// and it decodes to nothing.
    Control,
    /// `4`: a user-defined (added, non-special) token: always split out, decodes to its raw text.
    UserDefined,
    /// `5`: an unused slot.
    Unused,
    /// `6`: a SentencePiece byte token (`<0x0A>`); not used by byte-level BPE vocabularies.
    Byte,
}

impl TokenType {
    /// Maps the GGUF integer (`tokenizer.ggml.token_type[i]`) to a type; unknown values become
    /// [`TokenType::Undefined`], as in llama.cpp.
    pub fn from_gguf(value: i64) -> Self {
        match value {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    /// Whether llama.cpp keeps this token in its special-token cache (control, user-defined or
    /// unknown), i.e. whether its text is split out of the input before BPE.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            TokenType::Control | TokenType::UserDefined | TokenType::Unknown
        )
    }

    /// Whether the token is only split out when special-token parsing is on (control, unknown).
    pub fn needs_parse_special(self) -> bool {
        matches!(self, TokenType::Control | TokenType::Unknown)
    }
}

/// Texts that llama.cpp treats as end-of-generation markers (the `special_eog_ids` text list in
/// `llama_vocab::impl::load`, b11312). A token with one of these texts is forced to control type.
pub const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// EOG texts whose presence makes `</s>` an ordinary token again (llama.cpp: "gemma4 and plamo
/// have a normal </s> token"): `</s>` leaves the EOG set and becomes [`TokenType::Normal`].
const NORMAL_EOS_MARKERS: &[&str] = &["<|tool_response>", "<|plamo:eos|>"];

/// Which llama.cpp special-token role a text-detected token plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DetectedRole {
    /// End of turn (`special_eot_id`).
    Eot,
    /// End of message (`special_eom_id`).
    Eom,
    /// Fill-in-the-middle prefix.
    FimPre,
    /// Fill-in-the-middle suffix.
    FimSuf,
    /// Fill-in-the-middle middle.
    FimMid,
    /// Fill-in-the-middle padding (an EOG token).
    FimPad,
    /// Fill-in-the-middle repository marker (an EOG token).
    FimRep,
    /// Fill-in-the-middle file separator (an EOG token).
    FimSep,
}

impl DetectedRole {
    /// All roles, in llama.cpp's detection order.
    pub const ALL: [DetectedRole; 8] = [
        DetectedRole::Eot,
        DetectedRole::Eom,
        DetectedRole::FimPre,
        DetectedRole::FimSuf,
        DetectedRole::FimMid,
        DetectedRole::FimPad,
        DetectedRole::FimRep,
        DetectedRole::FimSep,
    ];

    /// GGUF metadata keys that set this role explicitly (the first is current, the rest
    /// deprecated aliases). When one is present, text detection is skipped.
    pub fn metadata_keys(self) -> &'static [&'static str] {
        match self {
            DetectedRole::Eot => &["tokenizer.ggml.eot_token_id"],
            DetectedRole::Eom => &["tokenizer.ggml.eom_token_id"],
            DetectedRole::FimPre => &[
                "tokenizer.ggml.fim_pre_token_id",
                "tokenizer.ggml.prefix_token_id",
            ],
            DetectedRole::FimSuf => &[
                "tokenizer.ggml.fim_suf_token_id",
                "tokenizer.ggml.suffix_token_id",
            ],
            DetectedRole::FimMid => &[
                "tokenizer.ggml.fim_mid_token_id",
                "tokenizer.ggml.middle_token_id",
            ],
            DetectedRole::FimPad => &["tokenizer.ggml.fim_pad_token_id"],
            DetectedRole::FimRep => &["tokenizer.ggml.fim_rep_token_id"],
            DetectedRole::FimSep => &["tokenizer.ggml.fim_sep_token_id"],
        }
    }

    /// Token texts llama.cpp recognises for this role when no metadata key sets it.
    pub fn texts(self) -> &'static [&'static str] {
        match self {
            DetectedRole::Eot => &[
                "<|eot_id|>",
                "<|im_end|>",
                "<|end|>",
                "<end_of_turn>",
                "<|endoftext|>",
                "<|end_of_text|>",
                "<EOT>",
                "_<EOT>",
                "[EOT]",
                "<｜end▁of▁sentence｜>",
                "<end_of_utterance>",
            ],
            DetectedRole::Eom => &["<|eom_id|>"],
            DetectedRole::FimPre => &[
                "<|fim_prefix|>",
                "<fim-prefix>",
                "<fim_prefix>",
                "<｜fim▁begin｜>",
                "<PRE>",
                "▁<PRE>",
                "<|code_prefix|>",
                "<|prefix|>",
            ],
            DetectedRole::FimSuf => &[
                "<|fim_suffix|>",
                "<fim-suffix>",
                "<fim_suffix>",
                "<｜fim▁hole｜>",
                "<SUF>",
                "▁<SUF>",
                "<|code_suffix|>",
                "<|suffix|>",
            ],
            DetectedRole::FimMid => &[
                "<|fim_middle|>",
                "<fim-middle>",
                "<fim_middle>",
                "<｜fim▁end｜>",
                "<MID>",
                "▁<MID>",
                "<|code_middle|>",
                "<|middle|>",
            ],
            DetectedRole::FimPad => &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
            DetectedRole::FimRep => &[
                "<|fim_repo|>",
                "<|repo_name|>",
                "<fim-repo>",
                "<REPO>",
                "<reponame>",
            ],
            DetectedRole::FimSep => &["<|file_sep|>"],
        }
    }

    /// Whether llama.cpp adds this role's token to the EOG set.
    pub fn is_eog(self) -> bool {
        matches!(
            self,
            DetectedRole::Eot
                | DetectedRole::Eom
                | DetectedRole::FimPad
                | DetectedRole::FimRep
                | DetectedRole::FimSep
        )
    }
}

/// Token texts llama.cpp always turns into user-defined tokens (gpt-oss / harmony format).
const FORCED_USER_DEFINED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// Applies llama.cpp's text-based fix-ups to `types` and returns the EOG set.
///
/// * `role_ids`: the ids set through metadata for each [`DetectedRole`] (`None` where absent);
///   absent roles are detected by token text (lowest id wins where llama.cpp's hash-map order is
///   unspecified) and the detected token is forced to control type.
/// * `eos`: `tokenizer.ggml.eos_token_id`, always EOG.
///
/// The returned ids are sorted and unique.
pub fn apply_fixups_and_eog(
    tokens: &[String],
    types: &mut [TokenType],
    role_ids: &[(DetectedRole, Option<u32>)],
    eos: Option<u32>,
) -> Vec<u32> {
    // Lowest id for each text (llama.cpp asserts that texts are unique).
    let mut index: HashMap<&str, u32> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        if let Ok(id) = u32::try_from(i) {
            index.entry(t.as_str()).or_insert(id);
        }
    }
    let find = |text: &str| -> Option<u32> { index.get(text).copied() };
    let force_control = |types: &mut [TokenType], id: u32| {
        if let Some(t) = types.get_mut(id as usize) {
            *t = TokenType::Control;
        }
    };

    let mut eog = BTreeSet::new();
    for &(role, given) in role_ids {
        let id = match given {
            Some(id) => Some(id),
            None => {
                let detected = role.texts().iter().filter_map(|t| find(t)).min();
                if let Some(id) = detected {
                    force_control(types, id);
                }
                detected
            }
        };
        if let (Some(id), true) = (id, role.is_eog()) {
            eog.insert(id);
        }
    }
    for text in EOG_TEXTS {
        if let Some(id) = find(text) {
            eog.insert(id);
            force_control(types, id);
        }
    }
    for text in FORCED_USER_DEFINED {
        if let Some(id) = find(text) {
            if let Some(t) = types.get_mut(id as usize) {
                *t = TokenType::UserDefined;
            }
        }
    }
    if let Some(eos) = eos {
        eog.insert(eos);
    }
    // o200k_harmony / solar-open: with <|return|> and <|call|> (or <|calls|> and <|flush|>),
    // <|end|> is not an end of generation.
    let in_eog = |text: &str| find(text).is_some_and(|id| eog.contains(&id));
    let has_call = in_eog("<|call|>") || in_eog("<|calls|>");
    let harmony = has_call && (in_eog("<|return|>") || in_eog("<|flush|>"));
    let normal_s = NORMAL_EOS_MARKERS.iter().any(|m| in_eog(m));
    let end = find("<|end|>").filter(|id| eog.contains(id));
    let s = find("</s>").filter(|id| eog.contains(id));
    if let (true, Some(end)) = (harmony, end) {
        eog.remove(&end);
        if let Some(t) = types.get_mut(end as usize) {
            *t = TokenType::UserDefined;
        }
    }
    // gemma4 / plamo: `</s>` is a normal token there.
    if let (true, Some(s)) = (normal_s, s) {
        eog.remove(&s);
        if let Some(t) = types.get_mut(s as usize) {
            *t = TokenType::Normal;
        }
    }
    eog.into_iter().collect()
}

/// One piece of partitioned input: either a special token or a byte range of plain text that
/// byte-level BPE will encode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fragment {
    /// A special token split out of the text.
    Token(u32),
    /// Byte range of the input to encode with BPE (never empty).
    Text(Range<usize>),
}

/// One entry of the special-token cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialEntry {
    /// The token id.
    pub id: u32,
    /// The text that is split out of the input.
    pub text: String,
    /// Control and unknown entries match only with `parse_special`; user-defined ones always.
    pub ty: TokenType,
    /// Whitespace right before a match is dropped (Hugging Face `AddedToken.lstrip`, llama.cpp
    /// `LLAMA_TOKEN_ATTR_LSTRIP`).
    pub lstrip: bool,
    /// Whitespace right after a match is dropped (`AddedToken.rstrip`,
    /// `LLAMA_TOKEN_ATTR_RSTRIP`).
    pub rstrip: bool,
}

/// The special-token cache: every control, user-defined and unknown token, longest text first
/// (ties in id order; llama.cpp's `std::sort` leaves their order unspecified).
#[derive(Debug, Clone, Default)]
pub struct SpecialTokens {
    entries: Vec<SpecialEntry>,
}

impl SpecialTokens {
    /// Builds the cache from the vocabulary texts and (fixed-up) types, as llama.cpp's
    /// `cache_special_tokens` (no strip attributes).
    pub fn new(tokens: &[String], types: &[TokenType]) -> Self {
        let entries = tokens
            .iter()
            .zip(types)
            .enumerate()
            .filter(|(_, (text, ty))| ty.is_special() && !text.is_empty())
            .filter_map(|(i, (text, ty))| {
                Some(SpecialEntry {
                    id: u32::try_from(i).ok()?,
                    text: text.clone(),
                    ty: *ty,
                    lstrip: false,
                    rstrip: false,
                })
            })
            .collect();
        Self::from_entries(entries)
    }

    /// Builds the cache from explicit entries (empty texts are dropped), sorted longest text
    /// (in bytes) first, ties by id.
    pub fn from_entries(mut entries: Vec<SpecialEntry>) -> Self {
        entries.retain(|e| !e.text.is_empty());
        entries.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
        Self { entries }
    }

    /// Number of tokens in the cache.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Splits `text` like llama.cpp's `tokenizer_st_partition`.
    ///
    /// For each special token (longest first), every text fragment is scanned left to right and
    /// each non-overlapping occurrence becomes a [`Fragment::Token`]. Control and unknown tokens
    /// take part only when `parse_special` is true; user-defined tokens always do.
    ///
    /// `plain` lists byte ranges of `text` (sorted, non-overlapping) inside which control and
    /// unknown tokens must not match, whatever `parse_special` says: a match that overlaps one
    /// of them is skipped and the search goes on after its first byte. This is how chat message
    /// content stays plain text inside a rendered template.
    ///
    /// An entry with `lstrip` / `rstrip` also swallows the whitespace (`char::is_whitespace`)
    /// between it and the text before / after it, as Hugging Face's `AddedVocabulary` does.
    /// GGUF vocabularies get no strip flags: the attributes llama.cpp sets by model name for
    /// a few families (phi-3, jina) are not modelled.
    pub fn partition(
        &self,
        text: &str,
        parse_special: bool,
        plain: &[Range<usize>],
    ) -> Vec<Fragment> {
        let mut fragments = Vec::new();
        if text.is_empty() {
            return fragments;
        }
        fragments.push(Fragment::Text(0..text.len()));
        for entry in &self.entries {
            let token_text = entry.text.as_str();
            let restricted = entry.ty.needs_parse_special();
            if restricted && !parse_special {
                continue;
            }
            if !fragments
                .iter()
                .any(|f| matches!(f, Fragment::Text(r) if text[r.clone()].contains(token_text)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let range = match fragment {
                    Fragment::Text(range) => range,
                    token => {
                        next.push(token);
                        continue;
                    }
                };
                let mut start = range.start;
                let mut search = range.start;
                while search < range.end {
                    let Some(found) = text[search..range.end].find(token_text) else {
                        break;
                    };
                    let at = search + found;
                    let mut end = at + token_text.len();
                    if restricted && overlaps(plain, at..end) {
                        search = at + char_len_at(text, at);
                        continue;
                    }
                    let mut left_end = at;
                    if entry.lstrip {
                        left_end = start + text[start..at].trim_end().len();
                    }
                    if left_end > start {
                        next.push(Fragment::Text(start..left_end));
                    }
                    next.push(Fragment::Token(entry.id));
                    if entry.rstrip {
                        let rest = &text[end..range.end];
                        end += rest.len() - rest.trim_start().len();
                    }
                    start = end;
                    search = end;
                }
                if start < range.end {
                    next.push(Fragment::Text(start..range.end));
                }
            }
            fragments = next;
        }
        fragments
    }
}

/// Length in bytes of the char starting at byte `at` of `text` (1 past the end).
fn char_len_at(text: &str, at: usize) -> usize {
    text[at..].chars().next().map_or(1, char::len_utf8)
}

/// Whether `range` intersects any of the sorted, non-overlapping `spans`.
fn overlaps(spans: &[Range<usize>], range: Range<usize>) -> bool {
    // First span whose end is past range.start; it overlaps iff it starts before range.end.
    let idx = spans.partition_point(|s| s.end <= range.start);
    spans
        .get(idx)
        .is_some_and(|s| s.start < range.end && s.start < s.end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> (Vec<String>, Vec<TokenType>) {
        let tokens = ["a", "<s>", "<|im_end|>", "<u>", "<|im_end|>x"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let types = vec![
            TokenType::Normal,
            TokenType::Control,
            TokenType::Control,
            TokenType::UserDefined,
            TokenType::Control,
        ];
        (tokens, types)
    }

    #[test]
    fn longest_first_and_left_to_right() {
        let (tokens, types) = vocab();
        let st = SpecialTokens::new(&tokens, &types);
        assert_eq!(st.len(), 4);
        let text = "hi<|im_end|>x<|im_end|><s>";
        let f = st.partition(text, true, &[]);
        assert_eq!(
            f,
            vec![
                Fragment::Text(0..2),
                Fragment::Token(4),
                Fragment::Token(2),
                Fragment::Token(1)
            ]
        );
    }

    #[test]
    fn user_defined_always_control_only_with_parse_special() {
        let (tokens, types) = vocab();
        let st = SpecialTokens::new(&tokens, &types);
        let text = "<u><s>";
        assert_eq!(
            st.partition(text, false, &[]),
            vec![Fragment::Token(3), Fragment::Text(3..6)]
        );
        assert_eq!(
            st.partition(text, true, &[]),
            vec![Fragment::Token(3), Fragment::Token(1)]
        );
    }

    #[test]
    fn plain_spans_suppress_control_matches_only() {
        let (tokens, types) = vocab();
        let st = SpecialTokens::new(&tokens, &types);
        let text = "<s>a<s><u><s>";
        // bytes 3..10 are content: "a<s><u>"
        let content = 3..10;
        let f = st.partition(text, true, &[content]);
        assert_eq!(
            f,
            vec![
                Fragment::Token(1),
                Fragment::Text(3..7),
                Fragment::Token(3),
                Fragment::Token(1)
            ]
        );
        // a control match straddling the span boundary is suppressed too
        let content = 0..2;
        let f = st.partition("a<s>", true, &[content]);
        assert_eq!(f, vec![Fragment::Text(0..4)]);
    }

    #[test]
    fn eog_detection_like_llama_cpp() {
        let tokens: Vec<String> = [
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<reponame>",
            "x",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut types = vec![
            TokenType::Control,
            TokenType::Control,
            TokenType::Control,
            TokenType::Normal,
            TokenType::Normal,
        ];
        let roles: Vec<_> = DetectedRole::ALL.iter().map(|r| (*r, None)).collect();
        let eog = apply_fixups_and_eog(&tokens, &mut types, &roles, Some(2));
        assert_eq!(eog, vec![0, 2, 3]);
        assert_eq!(types[3], TokenType::Control);
        assert_eq!(types[4], TokenType::Normal);
    }
}
