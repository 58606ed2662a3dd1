//! What a server serves (mlx-bun's `ServerContext`): one model loaded on the engine thread, its
//! tokenizer and chat template, and the sampling defaults its `generation_config.json` gives.
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value as Json;

use tokio::sync::oneshot;

use crate::cache::KvQuant;
use crate::engine::{Draft, EngineThread, ModelId};
use crate::error::{Error, Result};
use crate::fit::ModelFit;
use crate::model::open_source;
use crate::model::weights::F32Matmuls;
use crate::tokenizer::{load_tokenizer, ChatTemplate, Tokenizer};

/// Sampling values a model's `generation_config.json` recommends.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ModelDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
}

#[derive(Debug, Clone, Default)]
pub struct ContextOptions {
    /// The model's name for clients; defaults to the folder's or file's name.
    pub id: Option<String>,
    pub f32_matmuls: F32Matmuls,
    /// A Jinja chat template to use instead of the model's own (its source).
    pub chat_template: Option<String>,
    /// mlx-bun's `memoryBudgetBytes`: a model whose weights leave no context in it is refused
    /// (`INSUFFICIENT_MEMORY`) before it loads.
    pub memory_budget_bytes: Option<u64>,
}

pub struct ServerContext {
    /// The name clients pass as `model` (and `/v1/models` lists).
    pub id: String,
    pub model: ModelId,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    /// The model's end-of-sequence ids: config.json's, then the tokenizer's.
    pub eos_ids: Vec<u32>,
    pub vocab_size: usize,
    /// The model's caches are restored from checkpoints (`restores_checkpoints`).
    pub checkpoints: bool,
    pub defaults: ModelDefaults,
    /// When the model was loaded (seconds since the epoch, `created` in `/v1/models`).
    pub created: u64,
    /// The model's geometry and weight bytes, for `GET /fit`.
    pub fit: ModelFit,
    /// A draft model for speculative decoding (`--draft-model`).
    pub draft: Option<Draft>,
    /// The KV quantization of the model's kv_config.json, if it has one.
    pub kv_config: Vec<(usize, KvQuant)>,
}

pub use crate::tokenizer::eos_ids;

impl ServerContext {
    /// Reads the tokenizer and the weights' headers, and queues the model's load on the engine
    /// thread: the context is usable at once (requests wait behind the load, and fail with its
    /// error if it fails); the receiver says how the load ended.
    pub fn open(path: &Path, options: ContextOptions) -> Result<(Self, oneshot::Receiver<Result<()>>)> {
        let ContextOptions { id, f32_matmuls, chat_template, memory_budget_bytes } = options;
        let (tokenizer, mut template) = load_tokenizer(path)?;
        if let Some(source) = chat_template {
            template = Some(ChatTemplate::new(source, tokenizer.bos_token(), tokenizer.eos_token())?);
        }
        let (weights, config) = open_source(path)?;
        let fit = ModelFit::of(&config, path)?;
        if let Some(budget) = memory_budget_bytes {
            // Refused before a byte of the weights is loaded.
            if fit.max_safe_context(budget as f64)? < 1.0 {
                return Err(Error::InsufficientMemory(format!(
                    "{}: {:.0} MB of weights leave no context in memoryBudgetBytes ({:.0} MB)",
                    path.display(),
                    fit.weights_bytes / 1e6,
                    budget as f64 / 1e6
                )));
            }
        }
        let weights = weights.with_f32_matmuls(f32_matmuls);
        let eos_ids = eos_ids(&config, &tokenizer);
        let defaults = if path.is_dir() { read_defaults(&path.join("generation_config.json"))? } else { ModelDefaults::default() };
        let vocab_size = config.vocab_size;
        let checkpoints = crate::model::restores_checkpoints(&config);
        let kv_config = config.kv_quant.iter().flatten().map(|s| (s.layer_idx, KvQuant { bits: s.bits, group_size: s.group_size })).collect();
        let (model, loaded) = EngineThread::get().load(Box::new(move || Ok(weights)), config);
        let id = id.unwrap_or_else(|| {
            let name = if path.is_dir() { path.file_name() } else { path.file_stem() };
            name.map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
        });
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Ok((ServerContext { id, model, tokenizer, template, eos_ids, vocab_size, checkpoints, defaults, created, fit, draft: None, kv_config }, loaded))
    }

    /// Queues the load of a draft model (speculative decoding, `tokens` proposals per step) for
    /// the requests it can serve; it must share the model's vocabulary.
    pub fn attach_draft(&mut self, path: &Path, tokens: usize) -> Result<oneshot::Receiver<Result<()>>> {
        let (weights, config) = open_source(path)?;
        if config.vocab_size != self.vocab_size {
            return Err(Error::option("draftModel", format!("{}: its vocabulary ({}) is not the model's ({})", path.display(), config.vocab_size, self.vocab_size)));
        }
        let vocab_size = config.vocab_size;
        let (model, loaded) = EngineThread::get().load(Box::new(move || Ok(weights)), config);
        self.draft = Some(Draft { model, tokens, vocab_size });
        Ok(loaded)
    }
}

impl Drop for ServerContext {
    fn drop(&mut self) {
        EngineThread::get().unload(self.model);
        if let Some(d) = &self.draft {
            EngineThread::get().unload(d.model);
        }
    }
}

fn read_defaults(path: &Path) -> Result<ModelDefaults> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ModelDefaults::default()),
        Err(e) => return Err(Error::io(path, e)),
    };
    let v: Json = serde_json::from_str(&text).map_err(|e| Error::config(path, e.to_string()))?;
    let num = |key: &str| v.get(key).and_then(Json::as_f64).filter(|f| f.is_finite());
    // transformers samples only with `do_sample: true`; otherwise it decodes greedily.
    let greedy = v.get("do_sample").and_then(Json::as_bool) == Some(false);
    Ok(ModelDefaults {
        temperature: if greedy { Some(0.0) } else { num("temperature").map(|f| f.max(0.0) as f32) },
        top_p: num("top_p").map(|f| f.clamp(0.0, 1.0) as f32),
        top_k: num("top_k").filter(|f| *f >= 0.0 && *f <= u32::MAX as f64).map(|f| f as u32),
    })
}
