//! What a finished generation reports: why it stopped and its timings.
use serde::{Deserialize, Serialize};

use super::fill::FillStats;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-sequence token was produced (it is not reported as a token).
    Stop,
    /// `maxTokens` was reached.
    Length,
}

/// Timings with mlx-lm's semantics: the prompt clock stops when the first token is ready; decode
/// throughput counts every generated token over the time since the first.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GenerateStats {
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub generated_tokens: u32,
    pub prefill_tps: f64,
    pub decode_tps: f64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    /// Positions in the KV cache at the end: prompt plus forwarded tokens.
    pub cache_tokens: u32,
    pub peak_memory_bytes: u64,
    /// Speculative decoding: tokens the draft model proposed, and how many of them the target
    /// accepted (0 without a draft).
    pub draft_tokens: u32,
    pub accepted_draft_tokens: u32,
    /// What fill appended (engine option `fill`), when the request was placed with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fill: Option<FillStats>,
}

impl GenerateStats {
    /// The timings of a generation that started at `started` and read its first token at `first`
    /// (`None`: not yet), with its prompt, generated and cached-position counts.
    pub fn measured(started: std::time::Instant, first: Option<std::time::Instant>, prompt_tokens: u32, generated_tokens: u32, cache_tokens: u32) -> Self {
        let now = std::time::Instant::now();
        let first = first.unwrap_or(now);
        let prefill = first.duration_since(started).as_secs_f64();
        let decode = now.duration_since(first).as_secs_f64();
        let rate = |n: u32, s: f64| if s > 0.0 { f64::from(n) / s } else { 0.0 };
        GenerateStats {
            prompt_tokens,
            generated_tokens,
            prefill_tps: rate(prompt_tokens, prefill),
            decode_tps: rate(generated_tokens, decode),
            prefill_ms: prefill * 1e3,
            decode_ms: decode * 1e3,
            cache_tokens,
            peak_memory_bytes: mlx_rs::memory::peak_memory().unwrap_or(0) as u64,
            ..Default::default()
        }
    }
}
