//! Model loading and architectures. `load_model` turns a folder or a GGUF file into a
//! `LanguageModel`; each architecture lives in its own file.
pub mod attention;
pub mod blocks;
pub mod config;
pub mod convert;
pub mod decoder;
pub mod experts;
pub mod gemma;
pub mod gemma2;
pub mod gemma3_text;
pub mod gemma4_text;
pub mod gated_delta;
pub mod glm4;
pub mod gguf_config;
mod gguf_gemma4;
mod gguf_hybrid;
pub mod gguf_names;
pub mod gguf_weights;
pub mod granite;
pub mod layers;
pub mod llama;
pub mod minicpm;
pub mod olmo2;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_moe;
pub mod qwen3_next;
pub mod rope;
pub mod smollm3;
pub mod starcoder2;
pub mod text;
pub mod weights;

use std::path::Path;

use mlx_rs::Array;

use mlx_rs::ops::indexing::IndexOp;

use crate::cache::file::LayerShape;
use crate::cache::{CacheView, LayerCache, StepShape};
use crate::error::{Error, Result};
use config::ModelConfig;
use weights::Weights;

/// What the engine needs from an architecture: mlx-lm's `model(inputs, cache)`.
pub trait LanguageModel {
    fn config(&self) -> &ModelConfig;
    fn new_cache(&self) -> Vec<LayerCache>;
    /// What each layer of `new_cache` holds, to check a saved cache against (the config's KV
    /// heads and head size in every layer, unless the architecture's layers differ).
    fn cache_shapes(&self) -> Vec<LayerShape> {
        let c = self.config();
        vec![LayerShape::Kv { kv_heads: c.num_key_value_heads, head_dim: c.head_dim }; self.new_cache().len()]
    }
    /// Whether rows can share a stacked cache (only full-attention layers).
    fn stackable(&self) -> bool;
    /// What identifies the weights: files saved from this model (a KV cache) name it.
    fn fingerprint(&self) -> &str;
    /// One step: appends each row's new tokens to `cache` and returns the logits `ctx` asks for
    /// ([B, 1, V] for the last column, [B, L, V] for all; `None` for none, after evaluating the
    /// caches). A row's results are those it gets alone, bit for bit.
    fn forward(&self, tokens: &Tokens, cache: CacheView, ctx: &StepContext) -> Result<Option<Array>>;
}

/// The new tokens of one step: row `i` feeds `counts[i]` tokens, right-aligned in `ids` [B, L]
/// (the padding in front is never attended to).
pub struct Tokens {
    pub ids: Array,
    pub counts: Vec<i32>,
}

impl Tokens {
    /// Every row feeds all of `ids` [B, L].
    pub fn uniform(ids: Array) -> Self {
        let (b, l) = (ids.shape()[0], ids.shape()[1]);
        Tokens { ids, counts: vec![l; b as usize] }
    }

    /// One sequence's tokens.
    pub fn one(tokens: &[u32]) -> Self {
        Self::uniform(Array::from_slice(tokens, &[1, tokens.len() as i32]))
    }

    /// Row `i` feeds `rows[i]` (at least one token each).
    pub fn ragged(rows: &[&[u32]]) -> Self {
        let l = rows.iter().map(|r| r.len()).max().unwrap_or(0);
        let ids: Vec<u32> = rows.iter().flat_map(|r| std::iter::repeat(0).take(l - r.len()).chain(r.iter().copied())).collect();
        Tokens {
            ids: Array::from_slice(&ids, &[rows.len() as i32, l as i32]),
            counts: rows.iter().map(|r| r.len() as i32).collect(),
        }
    }
}

/// Which logits a step returns.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Logits {
    /// None: a prefill, which only fills the caches.
    None,
    /// Each row's last column.
    Last,
    /// Every column.
    All,
    /// Each row's last column as the final norm leaves it, before the output projection: the
    /// hidden state embeddings pool (mlx-lm's `model.model(inputs)[:, -1]`).
    LastHidden,
}

pub struct StepContext<'a> {
    pub logits: Logits,
    /// Called between layers, each evaluated first, so a long step ends early when it fails.
    pub check: Option<&'a dyn Fn() -> Result<()>>,
}

impl StepContext<'_> {
    pub const LAST: StepContext<'static> = StepContext { logits: Logits::Last, check: None };

    /// After layer `j` of a step whose last is `last`: a step that takes minutes on a CPU ends
    /// early here when `check` fails (a cancelled request, an exit). Evaluating part of the graph
    /// earlier runs the same kernels on the same inputs; the last layer's output is left to what
    /// follows.
    pub fn after_layer(&self, h: &Array, j: usize, last: usize) -> Result<()> {
        match self.check.filter(|_| j < last) {
            Some(check) => {
                h.eval()?;
                check()
            }
            None => Ok(()),
        }
    }

    /// Ends a step after its last layer's output `h`: the columns `logits` asks for, or `None`
    /// once the caches are evaluated (a prefill, which only fills them).
    pub fn finish(&self, h: Array, cache: &mut CacheView, shape: &StepShape) -> Result<Option<Array>> {
        cache.end(shape);
        match self.logits {
            Logits::None => {
                mlx_rs::transforms::eval(cache.state())?;
                Ok(None)
            }
            Logits::Last | Logits::LastHidden => Ok(Some(h.index((.., -1.., ..)))),
            Logits::All => Ok(Some(h)),
        }
    }
}

/// Which layers of a model attend over a sliding window (a rotating cache), and over how many
/// positions: what its architecture builds, which `fit` bills and `loadModelConfig` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sliding {
    /// One entry per layer: `true` = sliding-window attention, `false` = full attention.
    pub layers: Vec<bool>,
    pub window: usize,
}

/// An architecture: how its model is built and which of its layers slide.
struct Arch {
    load: Load,
    sliding: fn(&ModelConfig) -> Result<Sliding>,
}

/// What an architecture's loader builds: the common decoder, or a model of its own.
enum Load {
    Decoder(fn(&Weights, ModelConfig) -> Result<decoder::Decoder>),
    Gemma4(fn(&Weights, ModelConfig) -> Result<gemma4_text::Gemma4>),
    Hybrid(fn(&Weights, ModelConfig) -> Result<qwen3_next::Qwen3Next>),
}

/// Every layer attends to every position (architectures without sliding-window layers).
fn all_full(config: &ModelConfig) -> Result<Sliding> {
    Ok(Sliding { layers: vec![false; config.num_hidden_layers], window: 0 })
}

const LLAMA: Arch = Arch { load: Load::Decoder(llama::load), sliding: llama::sliding };
const QWEN2: Arch = Arch { load: Load::Decoder(qwen2::load), sliding: all_full };
const QWEN3: Arch = Arch { load: Load::Decoder(qwen3::load), sliding: all_full };
const QWEN3_MOE: Arch = Arch { load: Load::Decoder(qwen3_moe::load), sliding: all_full };
const GEMMA3: Arch = Arch { load: Load::Decoder(gemma3_text::load), sliding: gemma3_text::sliding };
const PHI3: Arch = Arch { load: Load::Decoder(phi3::load), sliding: all_full };
const GEMMA: Arch = Arch { load: Load::Decoder(gemma::load), sliding: all_full };
const GEMMA2: Arch = Arch { load: Load::Decoder(gemma2::load), sliding: all_full };
const SMOLLM3: Arch = Arch { load: Load::Decoder(smollm3::load), sliding: llama::sliding };
const OLMO2: Arch = Arch { load: Load::Decoder(olmo2::load), sliding: all_full };
const GLM4: Arch = Arch { load: Load::Decoder(glm4::load), sliding: all_full };
const GRANITE: Arch = Arch { load: Load::Decoder(granite::load), sliding: all_full };
const STARCODER2: Arch = Arch { load: Load::Decoder(starcoder2::load), sliding: all_full };
const MINICPM: Arch = Arch { load: Load::Decoder(minicpm::load), sliding: all_full };
const QWEN3_NEXT: Arch = Arch { load: Load::Hybrid(qwen3_next::load), sliding: all_full };
const GEMMA4: Arch = Arch { load: Load::Gemma4(gemma4_text::load), sliding: gemma4_text::sliding };

/// The architecture implementing `config`: its `model_type`, else its HF `architectures` class.
fn arch(config: &ModelConfig) -> Result<&'static Arch> {
    let by_type: Option<&'static Arch> = match config.model_type.as_str() {
        "llama" | "mistral" => Some(&LLAMA),
        "qwen2" => Some(&QWEN2),
        "qwen3" => Some(&QWEN3),
        "qwen3_moe" => Some(&QWEN3_MOE),
        "qwen3_next" | "qwen3_5" | "qwen3_5_moe" => Some(&QWEN3_NEXT),
        "gemma3_text" => Some(&GEMMA3),
        "gemma4_text" | "gemma4" => Some(&GEMMA4),
        "phi3" => Some(&PHI3),
        "gemma" => Some(&GEMMA),
        "gemma2" => Some(&GEMMA2),
        "smollm3" => Some(&SMOLLM3),
        "olmo2" => Some(&OLMO2),
        "glm4" => Some(&GLM4),
        "granite" => Some(&GRANITE),
        "starcoder2" => Some(&STARCODER2),
        "minicpm" => Some(&MINICPM),
        _ => None,
    };
    let by_class = || {
        config.architectures.iter().find_map(|a| -> Option<&'static Arch> {
            match a.as_str() {
                "LlamaForCausalLM" | "MistralForCausalLM" => Some(&LLAMA),
                "Qwen2ForCausalLM" => Some(&QWEN2),
                "Qwen3ForCausalLM" => Some(&QWEN3),
                "Qwen3MoeForCausalLM" => Some(&QWEN3_MOE),
                "Qwen3NextForCausalLM" | "Qwen3_5ForConditionalGeneration" | "Qwen3_5MoeForConditionalGeneration" => Some(&QWEN3_NEXT),
                "Gemma3ForCausalLM" => Some(&GEMMA3),
                "Gemma4ForCausalLM" | "Gemma4ForConditionalGeneration" => Some(&GEMMA4),
                "Phi3ForCausalLM" => Some(&PHI3),
                "GemmaForCausalLM" => Some(&GEMMA),
                "Gemma2ForCausalLM" => Some(&GEMMA2),
                "SmolLM3ForCausalLM" => Some(&SMOLLM3),
                "Olmo2ForCausalLM" => Some(&OLMO2),
                "Glm4ForCausalLM" => Some(&GLM4),
                "GraniteForCausalLM" => Some(&GRANITE),
                "Starcoder2ForCausalLM" => Some(&STARCODER2),
                "MiniCPMForCausalLM" => Some(&MINICPM),
                _ => None,
            }
        })
    };
    by_type.or_else(by_class).ok_or_else(|| Error::UnsupportedModelType(config.model_type.clone()))
}

/// Whether the architecture `config` names has layers whose caches cannot be trimmed back
/// (linear attention's recurrent state): the prefix cache then restores them only from
/// checkpoints taken at exact positions (placement's `checkpoints`).
pub fn restores_checkpoints(config: &ModelConfig) -> bool {
    arch(config).is_ok_and(|a| matches!(a.load, Load::Hybrid(_)))
}

/// The sliding-window layers the architecture `config` names would build.
pub fn sliding_layers(config: &ModelConfig) -> Result<Sliding> {
    (arch(config)?.sliding)(config)
}

/// Builds the architecture `config` names. Call on the engine thread only.
pub fn create_model(weights: Weights, config: ModelConfig) -> Result<Box<dyn LanguageModel>> {
    let fingerprint = fingerprint(&weights, &config);
    Ok(match arch(&config)?.load {
        Load::Decoder(load) => Box::new(decoder::Decoder { fingerprint, ..load(&weights, config)? }),
        Load::Gemma4(load) => {
            let mut model = load(&weights, config)?;
            model.fingerprint = fingerprint;
            Box::new(model)
        }
        Load::Hybrid(load) => {
            let mut model = load(&weights, config)?;
            model.fingerprint = fingerprint;
            Box::new(model)
        }
    })
}

/// What identifies a model's weights, wherever they are loaded from: the architecture's sizes
/// and every tensor's name, dtype, shape and first and last 4 KiB (a fine-tune changes those of
/// the tensors it trained), hashed. Reading a sample keeps it cheap for any model size.
pub fn fingerprint(w: &Weights, cfg: &ModelConfig) -> String {
    use sha2::{Digest, Sha256};
    const SAMPLE: usize = 4096;
    let mut h = Sha256::new();
    let sizes = [cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim];
    h.update(format!("{}:{sizes:?}", cfg.model_type));
    for name in w.names() {
        let t = w.get(name).expect("listed");
        h.update(format!("{name}:{:?}:{:?}", t.dtype, t.shape));
        let b = t.bytes();
        h.update(&b[..b.len().min(SAMPLE)]);
        h.update(&b[b.len().saturating_sub(SAMPLE)..]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The config of a model folder (`config.json`) or a `.gguf` file (its header only: no tensor is
/// read or converted).
pub fn open_config(path: &Path) -> Result<ModelConfig> {
    if path.is_file() {
        return gguf_weights::config(&crate::gguf::Gguf::open(path)?);
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
        let gguf = crate::gguf::Gguf::open(path)?;
        return gguf_weights::load(&gguf);
    }
    let config = ModelConfig::load(path)?;
    arch(&config)?;
    Ok((Weights::open_dir(path)?, config))
}

#[cfg(test)]
mod step_tests;
