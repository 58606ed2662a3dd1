//! What a generation reports: tokens as they are committed, then one terminal event.
use serde::Serialize;

use crate::error::Error;
use crate::sample::logprobs::TokenLogprobs;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-sequence token was produced (it is not reported as a token).
    Stop,
    /// `maxTokens` was reached.
    Length,
    /// The consumer cancelled.
    Cancelled,
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
}

#[derive(Debug)]
pub enum Event {
    Token { id: u32, logprobs: Option<TokenLogprobs> },
    Done { reason: FinishReason, stats: GenerateStats },
    Failed(Error),
}
