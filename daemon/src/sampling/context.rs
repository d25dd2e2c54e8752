//! [`StepContext`]: where a sequence stands when its next token is chosen.

/// What every logits processor sees at one decode step (borrowed from the sequence).
#[derive(Debug, Clone, Copy)]
pub struct StepContext<'a> {
    /// Engine id of the sequence.
    pub sequence_id: u64,
    /// The prompt's token ids (template applied).
    pub prompt: &'a [u32],
    /// Tokens accepted so far, oldest first (the token being chosen is not in it).
    pub generated: &'a [u32],
}

impl StepContext<'_> {
    /// Position of the token being chosen: prompt length plus tokens generated.
    pub fn position(&self) -> usize {
        self.prompt.len() + self.generated.len()
    }

    /// The last `n` tokens of prompt then generated (fewer when the sequence is
    /// shorter), oldest first, as two slices (prompt part, generated part).
    pub fn last_tokens(&self, n: usize) -> (&[u32], &[u32]) {
        let g = self.generated.len().min(n);
        let p = (n - g).min(self.prompt.len());
        (
            &self.prompt[self.prompt.len() - p..],
            &self.generated[self.generated.len() - g..],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_tokens_spans_prompt_and_generated() {
        let ctx = StepContext {
            sequence_id: 1,
            prompt: &[1, 2, 3, 4],
            generated: &[5, 6],
        };
        assert_eq!(ctx.position(), 6);
        assert_eq!(ctx.last_tokens(0), (&[][..], &[][..]));
        assert_eq!(ctx.last_tokens(1), (&[][..], &[6][..]));
        assert_eq!(ctx.last_tokens(3), (&[4][..], &[5, 6][..]));
        assert_eq!(ctx.last_tokens(100), (&[1, 2, 3, 4][..], &[5, 6][..]));
    }
}
