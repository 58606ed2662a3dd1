//! `resolveExecution` for JavaScript: mlx-bun's object shapes ↔ `engine::placement`.
use napi_derive::napi;

use super::js_error;
use crate::engine::placement::{
    resolve_execution, ExecutionCapabilities, ExecutionFeatures, ExecutionRequirements, Mechanism, Method,
};
use crate::error::Error;

#[napi(object)]
pub struct ExecutionRequirementsJs {
    pub has_vision: bool,
    pub has_adapters: bool,
    pub has_repetition_penalty: bool,
    pub user_seed: bool,
    pub kv_quant: bool,
    pub turbo_quant: bool,
    pub has_logits_extras: bool,
    pub has_grammar: bool,
    pub wants_logprobs: bool,
    pub has_draft: bool,
    pub has_prepared_prefix_identity: Option<bool>,
}

#[napi(object)]
pub struct ExecutionCapabilitiesJs {
    /// `'autoregressive' | 'denoising'`
    pub method: String,
    pub continuous: bool,
    pub quantized_batch: bool,
    pub grammar_batch: bool,
    pub checkpoints: bool,
    pub compiled_decode: Option<bool>,
    pub speculative_kv_quant: Option<bool>,
    pub media_batch: Option<bool>,
    pub adapter_batch: Option<bool>,
    pub turbo_quant_batch: Option<bool>,
    pub paged_batch: Option<bool>,
    pub grouped_methods: Option<Vec<String>>,
    pub shared_speculative_adapters: Option<bool>,
    pub speculative_logprobs: Option<bool>,
    pub shared_grammar_proposals: Option<bool>,
    pub speculative_turbo_quant: Option<bool>,
    pub media_prefix_cache: Option<bool>,
    pub shared_fill: Option<bool>,
    pub shared_speculative_echo: Option<bool>,
    pub shared_checkpoints: Option<bool>,
}

#[napi(object)]
pub struct ExecutionFeaturesJs {
    pub paged_kv: bool,
    pub fill: bool,
    pub compiled_decode: Option<bool>,
    pub grammar_jump: Option<bool>,
}

#[napi(object)]
pub struct ResolvedExecutionJs {
    pub method: String,
    pub mechanism: String,
    pub paged_kv: bool,
    pub prompt_cache: bool,
    pub checkpoint: bool,
    pub fill: bool,
    pub compiled_decode: bool,
    pub grammar_jump: bool,
    pub reasons: Vec<String>,
}

fn method(name: &str) -> Result<Method, Error> {
    match name {
        "autoregressive" => Ok(Method::Autoregressive),
        "speculative" => Ok(Method::Speculative),
        "denoising" => Ok(Method::Denoising),
        other => Err(Error::option("method", format!("unknown method '{other}'"))),
    }
}

fn method_name(m: Method) -> String {
    match m {
        Method::Autoregressive => "autoregressive",
        Method::Speculative => "speculative",
        Method::Denoising => "denoising",
    }
    .into()
}

impl From<&ExecutionCapabilities> for ExecutionCapabilitiesJs {
    fn from(c: &ExecutionCapabilities) -> Self {
        ExecutionCapabilitiesJs {
            method: method_name(c.method),
            continuous: c.continuous,
            quantized_batch: c.quantized_batch,
            grammar_batch: c.grammar_batch,
            checkpoints: c.checkpoints,
            compiled_decode: Some(c.compiled_decode),
            speculative_kv_quant: Some(c.speculative_kv_quant),
            media_batch: Some(c.media_batch),
            adapter_batch: Some(c.adapter_batch),
            turbo_quant_batch: Some(c.turbo_quant_batch),
            paged_batch: Some(c.paged_batch),
            grouped_methods: c.grouped_methods.as_ref().map(|g| g.iter().copied().map(method_name).collect()),
            shared_speculative_adapters: Some(c.shared_speculative_adapters),
            speculative_logprobs: Some(c.speculative_logprobs),
            shared_grammar_proposals: Some(c.shared_grammar_proposals),
            speculative_turbo_quant: Some(c.speculative_turbo_quant),
            media_prefix_cache: Some(c.media_prefix_cache),
            shared_fill: Some(c.shared_fill),
            shared_speculative_echo: Some(c.shared_speculative_echo),
            shared_checkpoints: Some(c.shared_checkpoints),
        }
    }
}

/// Where and how a request runs (mlx-bun 0.5 rules; see `engine::placement`).
#[napi(catch_unwind)]
pub fn resolve_execution_native(
    request: ExecutionRequirementsJs,
    capabilities: ExecutionCapabilitiesJs,
    features: Option<ExecutionFeaturesJs>,
) -> napi::Result<ResolvedExecutionJs> {
    let r = ExecutionRequirements {
        has_vision: request.has_vision,
        has_adapters: request.has_adapters,
        has_repetition_penalty: request.has_repetition_penalty,
        user_seed: request.user_seed,
        kv_quant: request.kv_quant,
        turbo_quant: request.turbo_quant,
        has_logits_extras: request.has_logits_extras,
        has_grammar: request.has_grammar,
        wants_logprobs: request.wants_logprobs,
        has_draft: request.has_draft,
        has_prepared_prefix_identity: request.has_prepared_prefix_identity.unwrap_or(false),
    };
    let c = &capabilities;
    let caps = ExecutionCapabilities {
        method: method(&c.method).map_err(js_error)?,
        continuous: c.continuous,
        quantized_batch: c.quantized_batch,
        grammar_batch: c.grammar_batch,
        checkpoints: c.checkpoints,
        compiled_decode: c.compiled_decode.unwrap_or(false),
        speculative_kv_quant: c.speculative_kv_quant.unwrap_or(false),
        media_batch: c.media_batch.unwrap_or(false),
        adapter_batch: c.adapter_batch.unwrap_or(false),
        turbo_quant_batch: c.turbo_quant_batch.unwrap_or(false),
        paged_batch: c.paged_batch.unwrap_or(false),
        grouped_methods: c
            .grouped_methods
            .as_ref()
            .map(|g| g.iter().map(|m| method(m)).collect::<Result<_, _>>())
            .transpose()
            .map_err(js_error)?,
        shared_speculative_adapters: c.shared_speculative_adapters.unwrap_or(false),
        speculative_logprobs: c.speculative_logprobs.unwrap_or(false),
        shared_grammar_proposals: c.shared_grammar_proposals.unwrap_or(false),
        speculative_turbo_quant: c.speculative_turbo_quant.unwrap_or(false),
        media_prefix_cache: c.media_prefix_cache.unwrap_or(false),
        shared_fill: c.shared_fill.unwrap_or(false),
        shared_speculative_echo: c.shared_speculative_echo.unwrap_or(false),
        shared_checkpoints: c.shared_checkpoints.unwrap_or(false),
    };
    let f = features.map_or_else(ExecutionFeatures::default, |f| ExecutionFeatures {
        paged_kv: f.paged_kv,
        fill: f.fill,
        compiled_decode: f.compiled_decode.unwrap_or(false),
        grammar_jump: f.grammar_jump.unwrap_or(false),
    });
    let e = resolve_execution(&r, &caps, &f);
    Ok(ResolvedExecutionJs {
        method: method_name(e.method),
        mechanism: match e.mechanism {
            Mechanism::Serial => "serial",
            Mechanism::Continuous => "continuous",
        }
        .into(),
        paged_kv: e.paged_kv,
        prompt_cache: e.prompt_cache,
        checkpoint: e.checkpoint,
        fill: e.fill,
        compiled_decode: e.compiled_decode,
        grammar_jump: e.grammar_jump,
        reasons: e.reasons.into_iter().map(str::to_owned).collect(),
    })
}
