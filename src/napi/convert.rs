//! JS option objects and token arrays → Rust types. JS numbers arrive as f64 so that negative,
//! fractional or huge values get our typed errors rather than napi's generic ones.
use std::collections::HashMap;

use napi::bindgen_prelude::{Either, Uint32Array};
use napi_derive::napi;

use crate::cache::{KvQuant, KvQuantOptions};
use crate::engine::inference::PrefixKey;
use crate::engine::speculative::DEFAULT_DRAFT_TOKENS;
use crate::error::{Error, Result};
use super::tokenizer::RenderOptionsJs;
use crate::sample::grammar::GrammarSpec;
use crate::sample::{GenerateOptions, SamplingOptions};
use crate::tokenizer::template::RenderOptions;

/// Options of `generate()`; names and defaults as in mlx-bun (see index.d.ts).
#[napi(object)]
#[derive(Default)]
pub struct GenerateOptionsJs {
    pub max_tokens: Option<f64>,
    pub prefill_chunk_size: Option<f64>,
    pub eos_token_ids: Option<Vec<f64>>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<f64>,
    pub min_p: Option<f64>,
    pub min_tokens_to_keep: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub repetition_context_size: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub presence_context_size: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub frequency_context_size: Option<f64>,
    pub logit_bias: Option<HashMap<String, f64>>,
    pub seed: Option<f64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<f64>,
    /// `{ jsonSchema } | { regex } | { lark }`.
    pub grammar: Option<serde_json::Value>,
    /// Proposals per step with a `draftModel` (the model itself is a separate argument).
    pub num_draft_tokens: Option<f64>,
    pub kv_bits: Option<f64>,
    pub kv_group_size: Option<f64>,
    pub quantized_kv_start: Option<f64>,
    /// Per-layer KV quantization, as `loadModelConfig().kvQuant` reads it from kv_config.json.
    pub kv_config: Option<Vec<KvQuantSpecJs>>,
    /// Engine requests only: the prefix-cache namespace and the caller's conversation id.
    pub cache_namespace: Option<String>,
    pub session_id: Option<String>,
}

/// One layer's KV quantization (`kvConfig` entries).
#[napi(object)]
pub struct KvQuantSpecJs {
    pub layer_idx: f64,
    pub bits: f64,
    pub group_size: f64,
}

fn uint(name: &'static str, v: f64) -> Result<u32> {
    if v.fract() != 0.0 || !(0.0..=u32::MAX as f64).contains(&v) {
        return Err(Error::option(name, format!("must be a non-negative integer, got {v}")));
    }
    Ok(v as u32)
}

fn positive(name: &'static str, v: f64) -> Result<u32> {
    match uint(name, v) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(Error::option(name, format!("must be a positive integer, got {v}"))),
    }
}

impl GenerateOptionsJs {
    /// `numDraftTokens`, taken out of the options (mlx-lm's default when absent).
    pub fn take_draft_tokens(&mut self) -> Result<usize> {
        Ok(self.num_draft_tokens.take().map(|v| positive("numDraftTokens", v)).transpose()?.map_or(DEFAULT_DRAFT_TOKENS, |n| n as usize))
    }

    /// `cacheNamespace` and `sessionId`, taken out of the options.
    pub fn take_prefix_key(&mut self) -> PrefixKey {
        PrefixKey { namespace: self.cache_namespace.take().unwrap_or_default(), session: self.session_id.take() }
    }

    pub fn into_options(self) -> Result<GenerateOptions> {
        let d = GenerateOptions::default();
        let s = SamplingOptions::default();
        let f = |v: Option<f64>, default: f32| v.map_or(default, |v| v as f32);
        let logit_bias = self
            .logit_bias
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| {
                let id: f64 = k.parse().map_err(|_| Error::option("logitBias", format!("key '{k}' is not a token id")))?;
                Ok((uint("logitBias", id)?, v as f32))
            })
            .collect::<Result<_>>()?;
        let seed = match self.seed {
            None => s.seed,
            Some(v) if v.fract() == 0.0 && (0.0..=9.007_199_254_740_991e15).contains(&v) => v as u64,
            Some(v) => return Err(Error::option("seed", format!("must be a non-negative safe integer, got {v}"))),
        };
        Ok(GenerateOptions {
            max_tokens: self.max_tokens.map(|v| positive("maxTokens", v)).transpose()?.unwrap_or(d.max_tokens),
            prefill_chunk_size: self.prefill_chunk_size.map(|v| positive("prefillChunkSize", v)).transpose()?.unwrap_or(d.prefill_chunk_size),
            eos_token_ids: self.eos_token_ids.map(|ids| ids.into_iter().map(|v| uint("eosTokenIds", v)).collect()).transpose()?,
            sampling: SamplingOptions {
                temperature: f(self.temperature, s.temperature),
                top_p: f(self.top_p, s.top_p),
                top_k: self.top_k.map(|v| uint("topK", v)).transpose()?.unwrap_or(s.top_k),
                min_p: f(self.min_p, s.min_p),
                min_tokens_to_keep: self.min_tokens_to_keep.map(|v| positive("minTokensToKeep", v)).transpose()?.unwrap_or(s.min_tokens_to_keep),
                repetition_penalty: f(self.repetition_penalty, s.repetition_penalty),
                repetition_context_size: self.repetition_context_size.map(|v| uint("repetitionContextSize", v)).transpose()?.unwrap_or(s.repetition_context_size),
                presence_penalty: f(self.presence_penalty, s.presence_penalty),
                presence_context_size: self.presence_context_size.map(|v| uint("presenceContextSize", v)).transpose()?.unwrap_or(s.presence_context_size),
                frequency_penalty: f(self.frequency_penalty, s.frequency_penalty),
                frequency_context_size: self.frequency_context_size.map(|v| uint("frequencyContextSize", v)).transpose()?.unwrap_or(s.frequency_context_size),
                logit_bias,
                seed,
            },
            logprobs: self.logprobs.unwrap_or(d.logprobs),
            top_logprobs: self.top_logprobs.map(|v| uint("topLogprobs", v)).transpose()?.unwrap_or(d.top_logprobs),
            grammar: self.grammar.filter(|g| !g.is_null()).map(|g| GrammarSpec::from_json(&g)).transpose()?,
            kv: KvQuantOptions {
                bits: self.kv_bits.map(|v| positive("kvBits", v).map(|b| b as i32)).transpose()?,
                group_size: self.kv_group_size.map(|v| positive("kvGroupSize", v).map(|g| g as i32)).transpose()?.unwrap_or(64),
                start: self.quantized_kv_start.map(|v| uint("quantizedKvStart", v).map(|n| n as usize)).transpose()?,
                config: self
                    .kv_config
                    .unwrap_or_default()
                    .into_iter()
                    .map(|e| {
                        let q = KvQuant { bits: positive("kvConfig", e.bits)? as i32, group_size: positive("kvConfig", e.group_size)? as i32 };
                        Ok((uint("kvConfig", e.layer_idx)? as usize, q))
                    })
                    .collect::<Result<_>>()?,
            },
        })
    }
}

/// Prompt tokens as a Uint32Array or an array of numbers.
pub fn prompt_tokens(p: Either<Uint32Array, Vec<f64>>) -> Result<Vec<u32>> {
    match p {
        Either::A(a) => Ok(a.to_vec()),
        Either::B(v) => v
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                if t.fract() == 0.0 && (0.0..=u32::MAX as f64).contains(&t) {
                    Ok(t as u32)
                } else {
                    Err(Error::InvalidPrompt(format!("prompt token {i} is {t}, not a token id")))
                }
            })
            .collect(),
    }
}

/// Chat template options; `enableThinking` becomes the template's `enable_thinking`.
pub fn render_options(options: Option<RenderOptionsJs>) -> RenderOptions {
    let mut opts = RenderOptions::default();
    if let Some(o) = options {
        opts.add_generation_prompt = o.add_generation_prompt.unwrap_or(true);
        opts.tools = o.tools.filter(|t| !t.is_null());
        opts.extra = o.extra.unwrap_or_default();
        if let Some(t) = o.enable_thinking {
            opts.extra.insert("enable_thinking".into(), serde_json::Value::Bool(t));
        }
    }
    opts
}
