//! Result types shared by both engines: [`crate::measure`] fills them the same way for
//! inferd and llama-server, so one table and one set of goals serve both sides.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Everything measured for one engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Figures {
    /// Single-stream prefill of the long prompt (`max_tokens` 1), best of the repetitions.
    pub prefill: Prefill,
    /// Single-stream decode of `max_tokens` tokens.
    pub decode: Decode,
    /// One entry per concurrency level, in the order run.
    pub concurrency: Vec<Level>,
    /// Peak resident set of the engine's process, in bytes (VmHWM).
    pub peak_rss_bytes: u64,
    /// Engine-specific details (versions, configuration, raw counters).
    #[serde(default)]
    pub extra: Value,
}

/// Single-stream prefill figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Prefill {
    /// Prompt length in tokens as the engine counted it (the first repetition's).
    pub prompt_tokens: u64,
    /// Time to first token of every repetition, in milliseconds.
    pub ttft_ms: Vec<f64>,
    /// Best `prompt_tokens / TTFT` over the repetitions, in tokens per second.
    pub tok_per_s: f64,
}

/// Single-stream decode figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Decode {
    /// Prompt length in tokens.
    pub prompt_tokens: u64,
    /// Generated tokens actually received (the request may stop early at EOS).
    pub tokens: u64,
    /// Time from the first to the last token, in seconds.
    pub span_s: f64,
    /// `(tokens - tokens of the first arrival) / span_s`.
    pub tok_per_s: f64,
    /// Time to first token, in milliseconds.
    pub ttft_ms: f64,
}

/// Figures of one concurrency level: `n` streams started at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Level {
    /// Number of streams.
    pub n: usize,
    /// Generated tokens over all streams.
    pub tokens: u64,
    /// Wall time from the first send to the last stream's end, in seconds.
    pub wall_s: f64,
    /// `tokens / wall_s`.
    pub aggregate_tok_per_s: f64,
    /// Mean over streams of the time to first token, in milliseconds.
    pub mean_ttft_ms: f64,
    /// Largest time to first token, in milliseconds.
    pub max_ttft_ms: f64,
    /// Mean over streams of each stream's mean inter-token latency, in milliseconds.
    pub mean_itl_ms: f64,
    /// Median of all per-token gaps, in milliseconds.
    pub p50_itl_ms: f64,
    /// 99th percentile of all per-token gaps, in milliseconds.
    pub p99_itl_ms: f64,
    /// Streams that ended before `max_tokens` (EOS or an error).
    pub short_streams: usize,
}

/// Per-stream timing, in seconds relative to the stream's own start (its send).
#[derive(Debug, Clone, Default)]
pub struct StreamTiming {
    /// Seconds from start to each arrival of tokens, with the number of tokens in it.
    pub arrivals: Vec<(f64, usize)>,
    /// Seconds from start to the stream's end.
    pub end_s: f64,
}

impl StreamTiming {
    /// Total tokens received.
    pub fn tokens(&self) -> u64 {
        self.arrivals.iter().map(|&(_, n)| n as u64).sum()
    }

    /// Time to first token in seconds, if any token arrived.
    pub fn ttft_s(&self) -> Option<f64> {
        self.arrivals.first().map(|&(t, _)| t)
    }

    /// Per-token gaps in seconds: the gap before an arrival carrying `k` tokens counts as
    /// `k` gaps of `gap / k` each, so batching of several ids in one delta is fair.
    pub fn itl_gaps_s(&self) -> Vec<f64> {
        let mut gaps = Vec::new();
        for pair in self.arrivals.windows(2) {
            let (t0, _) = pair[0];
            let (t1, k) = pair[1];
            if k == 0 {
                continue;
            }
            let each = (t1 - t0) / k as f64;
            gaps.extend(std::iter::repeat_n(each, k));
        }
        gaps
    }

    /// Decode span: tokens after the first arrival and the seconds from first to last.
    pub fn decode_span(&self) -> (u64, f64) {
        match (self.arrivals.first(), self.arrivals.last()) {
            (Some(&(t0, k0)), Some(&(t1, _))) => (self.tokens() - k0 as u64, t1 - t0),
            _ => (0, 0.0),
        }
    }
}

/// Builds a [`Level`] from the streams of one run. `starts_s` are the streams' start
/// times relative to the run's first send, so the wall time is from the first send to
/// the last end.
pub fn level_from(n: usize, max_tokens: u64, streams: &[(f64, StreamTiming)]) -> Level {
    let tokens: u64 = streams.iter().map(|(_, s)| s.tokens()).sum();
    let wall_s = streams
        .iter()
        .map(|(start, s)| start + s.end_s)
        .fold(0.0, f64::max);
    let ttfts: Vec<f64> = streams.iter().filter_map(|(_, s)| s.ttft_s()).collect();
    let mut all_gaps = Vec::new();
    let mut stream_itls = Vec::new();
    for (_, s) in streams {
        let gaps = s.itl_gaps_s();
        if !gaps.is_empty() {
            stream_itls.push(mean(&gaps));
        }
        all_gaps.extend(gaps);
    }
    all_gaps.sort_by(f64::total_cmp);
    Level {
        n,
        tokens,
        wall_s,
        aggregate_tok_per_s: if wall_s > 0.0 {
            tokens as f64 / wall_s
        } else {
            0.0
        },
        mean_ttft_ms: mean(&ttfts) * 1e3,
        max_ttft_ms: ttfts.iter().copied().fold(0.0, f64::max) * 1e3,
        mean_itl_ms: mean(&stream_itls) * 1e3,
        p50_itl_ms: percentile(&all_gaps, 0.50) * 1e3,
        p99_itl_ms: percentile(&all_gaps, 0.99) * 1e3,
        short_streams: streams
            .iter()
            .filter(|(_, s)| s.tokens() < max_tokens)
            .count(),
    }
}

/// Arithmetic mean; 0 for an empty slice.
pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// Nearest-rank percentile of sorted values (`q` in [0, 1]); 0 for an empty slice.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_split_over_batched_ids() {
        let s = StreamTiming {
            arrivals: vec![(0.1, 1), (0.2, 1), (0.4, 2)],
            end_s: 0.4,
        };
        let gaps = s.itl_gaps_s();
        assert_eq!(gaps.len(), 3);
        assert!((gaps[0] - 0.1).abs() < 1e-9);
        assert!((gaps[1] - 0.1).abs() < 1e-9);
        assert_eq!(s.decode_span().0, 3);
        assert!((s.decode_span().1 - 0.3).abs() < 1e-9);
    }

    #[test]
    fn level_wall_and_aggregate() {
        let a = StreamTiming {
            arrivals: vec![(0.5, 1), (1.0, 1)],
            end_s: 1.0,
        };
        let b = StreamTiming {
            arrivals: vec![(0.5, 1), (1.5, 1)],
            end_s: 1.5,
        };
        let level = level_from(2, 2, &[(0.0, a), (0.5, b)]);
        assert_eq!(level.tokens, 4);
        assert!((level.wall_s - 2.0).abs() < 1e-9);
        assert!((level.aggregate_tok_per_s - 2.0).abs() < 1e-9);
        assert!((level.mean_ttft_ms - 500.0).abs() < 1e-6);
        assert!((level.mean_itl_ms - 750.0).abs() < 1e-6);
        assert_eq!(level.short_streams, 0);
    }

    #[test]
    fn percentile_nearest_rank() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 2.0);
        assert_eq!(percentile(&v, 0.99), 4.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
