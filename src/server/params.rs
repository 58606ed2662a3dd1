//! Request fields both APIs share, turned into engine options with mlx-bun's precedence: the
//! request, then the server's flags, then the model's `generation_config.json`, then mlx-bun's
//! defaults (temperature 0.7, top-p and top-k off).
use std::collections::BTreeMap;

use serde::Deserialize;

use super::context::ServerContext;
use super::error::ApiError;
use super::ServerOptions;
use crate::sample::options::MAX_TOP_LOGPROBS;
use crate::sample::{GenerateOptions, SamplingOptions};

/// The temperature when neither the request, the server nor the model names one.
const FALLBACK_TEMPERATURE: f32 = 0.7;

/// `stop`: one string or a list of them.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// Sampling fields as a request gives them (each absent one falls back).
#[derive(Debug, Default)]
pub struct Sampling {
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// Token id (a decimal string, as OpenAI's JSON has it) → bias.
    pub logit_bias: Option<BTreeMap<String, f32>>,
    pub top_logprobs: Option<u32>,
    pub logprobs: bool,
}

impl Sampling {
    /// The engine's options; `default_max_tokens` is the route's default.
    pub fn options(self, ctx: &ServerContext, server: &ServerOptions, default_max_tokens: u32) -> Result<GenerateOptions, ApiError> {
        let max_tokens = self.max_tokens.unwrap_or(default_max_tokens);
        if max_tokens == 0 {
            return Err(ApiError::param("max_tokens", "must be a positive integer"));
        }
        let mut logit_bias = BTreeMap::new();
        for (key, bias) in self.logit_bias.unwrap_or_default() {
            let id: u32 = key.parse().map_err(|_| ApiError::param("logit_bias", format!("'{key}' is not a token id")))?;
            logit_bias.insert(id, bias);
        }
        let top_logprobs = self.top_logprobs.unwrap_or(0);
        if top_logprobs > MAX_TOP_LOGPROBS {
            return Err(ApiError::param("top_logprobs", format!("must be at most {MAX_TOP_LOGPROBS}")));
        }
        let d = SamplingOptions::default();
        let m = ctx.defaults;
        let sampling = SamplingOptions {
            temperature: self.temperature.or(server.default_temperature).or(m.temperature).unwrap_or(FALLBACK_TEMPERATURE),
            top_p: self.top_p.or(server.default_top_p).or(m.top_p).unwrap_or(d.top_p),
            top_k: self.top_k.or(server.default_top_k).or(m.top_k).unwrap_or(d.top_k),
            min_p: self.min_p.unwrap_or(d.min_p),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            logit_bias,
            seed: self.seed.unwrap_or_else(fresh_seed),
            ..d
        };
        let opts = GenerateOptions {
            max_tokens,
            eos_token_ids: Some(ctx.eos_ids.clone()),
            sampling,
            logprobs: self.logprobs,
            top_logprobs: if self.logprobs { top_logprobs } else { 0 },
            kv: server.kv_quant.options(&ctx.kv_config),
            ..Default::default()
        };
        if top_logprobs > 0 && !self.logprobs {
            return Err(ApiError::param("top_logprobs", "needs logprobs: true"));
        }
        opts.validate(ctx.vocab_size).map_err(snake_case)?;
        Ok(opts)
    }
}

/// A request without a seed samples differently each time, as the hosted APIs do.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::Instant::now())
}

/// The engine names options as mlx-bun's JavaScript API does; HTTP clients sent snake_case.
fn snake_case(e: crate::error::Error) -> ApiError {
    let mut api = ApiError::from(e);
    for (camel, snake) in [
        ("maxTokens", "max_tokens"),
        ("topP", "top_p"),
        ("topK", "top_k"),
        ("minP", "min_p"),
        ("repetitionPenalty", "repetition_penalty"),
        ("presencePenalty", "presence_penalty"),
        ("frequencyPenalty", "frequency_penalty"),
        ("logitBias", "logit_bias"),
        ("topLogprobs", "top_logprobs"),
    ] {
        if api.message.starts_with(camel) {
            api.message = api.message.replacen(camel, snake, 1);
            api.param = Some(snake.into());
        }
    }
    api
}
