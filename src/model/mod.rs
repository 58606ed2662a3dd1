//! Model loading and architectures. `load_model` turns a folder or a GGUF file into a
//! `LanguageModel`; each architecture lives in its own file.
pub mod config;
pub mod convert;
pub mod decoder;
pub mod gemma3_text;
pub mod gguf;
pub mod gguf_quants;
pub mod gguf_weights;
pub mod layers;
pub mod llama;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
pub mod weights;

use std::path::Path;

use mlx_rs::Array;

use crate::cache::{BatchKvCache, LayerCache};
use crate::error::{Error, Result};
use config::ModelConfig;
use weights::Weights;

/// What the engine needs from an architecture.
pub trait LanguageModel {
    fn config(&self) -> &ModelConfig;
    fn new_cache(&self) -> Vec<LayerCache>;
    /// Final-norm hidden states [B, L, D] for `ids` [B, L], appending to `caches`.
    fn hidden(&self, ids: &Array, caches: &mut [LayerCache]) -> Result<Array>;
    /// The same for a batch of independent sequences, row `i` of `ids` [B, L] appending to
    /// `rows[i]`; rows may hold different lengths.
    fn hidden_rows(&self, ids: &Array, rows: &mut [&mut [LayerCache]]) -> Result<Array>;
    /// Prefill: appends `ids` [1, L] to `caches` as `hidden` does, but evaluates layer by layer
    /// and calls `check` between layers, so a step that takes minutes on a CPU ends early when
    /// `check` fails (a cancelled request, an exit). Evaluating part of the graph earlier runs
    /// the same kernels on the same inputs: the caches hold the same values.
    fn prefill(&self, ids: &Array, caches: &mut [LayerCache], check: &dyn Fn() -> Result<()>) -> Result<()>;
    /// The same for a batch of independent rows, as `hidden_rows`.
    fn prefill_rows(&self, ids: &Array, rows: &mut [&mut [LayerCache]], check: &dyn Fn() -> Result<()>) -> Result<()>;
    /// Whether batches can decode through `hidden_stacked` (only full-attention layers).
    fn stackable(&self) -> bool;
    /// Final-norm hidden states [B, 1, D] for one token per row of `cache` (`ids` [B, 1], in
    /// the cache's row order), appending to it.
    fn hidden_stacked(&self, ids: &Array, cache: &mut BatchKvCache) -> Result<Array>;
    /// Output-vocabulary logits for hidden states.
    fn logits(&self, hidden: &Array) -> Result<Array>;
}

type Loader = fn(&Weights, ModelConfig) -> Result<decoder::Decoder>;

/// The architecture implementing `config`: its `model_type`, else its HF `architectures` class.
fn loader(config: &ModelConfig) -> Result<Loader> {
    let by_type: Option<Loader> = match config.model_type.as_str() {
        "llama" | "mistral" => Some(llama::load),
        "qwen2" => Some(qwen2::load),
        "qwen3" => Some(qwen3::load),
        "gemma3_text" => Some(gemma3_text::load),
        "phi3" => Some(phi3::load),
        _ => None,
    };
    let by_class = || {
        config.architectures.iter().find_map(|a| -> Option<Loader> {
            match a.as_str() {
                "LlamaForCausalLM" | "MistralForCausalLM" => Some(llama::load),
                "Qwen2ForCausalLM" => Some(qwen2::load),
                "Qwen3ForCausalLM" => Some(qwen3::load),
                "Gemma3ForCausalLM" => Some(gemma3_text::load),
                "Phi3ForCausalLM" => Some(phi3::load),
                _ => None,
            }
        })
    };
    by_type.or_else(by_class).ok_or_else(|| Error::UnsupportedModelType(config.model_type.clone()))
}

/// Builds the architecture `config` names. Call on the engine thread only.
pub fn create_model(weights: Weights, config: ModelConfig) -> Result<Box<dyn LanguageModel>> {
    let load = loader(&config)?;
    Ok(Box::new(load(&weights, config)?))
}

/// The config of a model folder (`config.json`) or a `.gguf` file (its header only: no tensor is
/// read or converted).
pub fn open_config(path: &Path) -> Result<ModelConfig> {
    if path.is_file() {
        return gguf_weights::config(&gguf::Gguf::open(path)?);
    }
    ModelConfig::load(path)
}

/// Weights and config of a model folder (`config.json` + safetensors) or a `.gguf` file.
/// Parses and validates only; no MLX work, so it may run on any thread.
pub fn open_source(path: &Path) -> Result<(Weights, ModelConfig)> {
    if !path.exists() {
        return Err(Error::ModelNotFound(path.to_path_buf()));
    }
    if path.is_file() {
        let gguf = gguf::Gguf::open(path)?;
        return gguf_weights::load(&gguf);
    }
    let config = ModelConfig::load(path)?;
    loader(&config)?;
    Ok((Weights::open_dir(path)?, config))
}
