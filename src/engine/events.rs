//! What a finished generation reports: why it stopped and its timings.
use serde::{Deserialize, Serialize};

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
}
