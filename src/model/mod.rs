//! Model loading and architectures. `load_model` turns a folder or a GGUF file into a
//! `LanguageModel`; each architecture lives in its own file.
pub mod config;
pub mod convert;
pub mod gguf;
pub mod gguf_weights;
pub mod layers;
pub mod llama;
pub mod weights;

use std::path::Path;

use mlx_rs::Array;

use crate::cache::KvCache;
use crate::error::{Error, Result};
use config::ModelConfig;
use weights::Weights;

/// What the engine needs from an architecture.
pub trait LanguageModel {
    fn config(&self) -> &ModelConfig;
    fn new_cache(&self) -> Vec<KvCache>;
    /// Final-norm hidden states [B, L, D] for `ids` [B, L], appending to `caches`.
    fn hidden(&self, ids: &Array, caches: &mut [KvCache]) -> Result<Array>;
    /// Output-vocabulary logits for hidden states.
    fn logits(&self, hidden: &Array) -> Result<Array>;
}

pub const SUPPORTED_MODEL_TYPES: &[&str] = &["llama", "mistral"];

/// Builds the architecture named by `config.model_type`. Call on the engine thread only.
pub fn create_model(weights: &Weights, config: ModelConfig) -> Result<Box<dyn LanguageModel>> {
    match config.model_type.as_str() {
        "llama" | "mistral" => Ok(Box::new(llama::Llama::load(weights, config)?)),
        other => Err(Error::UnsupportedModelType(other.to_owned())),
    }
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
    if !SUPPORTED_MODEL_TYPES.contains(&config.model_type.as_str()) {
        return Err(Error::UnsupportedModelType(config.model_type));
    }
    Ok((Weights::open_dir(path)?, config))
}
