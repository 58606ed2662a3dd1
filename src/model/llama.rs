//! Llama (SmolLM2, Llama 3.x) and Mistral-style models (mlx-lm's `llama.py`): pre-norm blocks of
//! GQA attention with RoPE and a SwiGLU MLP. `layer_types` may mark layers as sliding-window
//! attention over `sliding_window` positions.
use super::config::ModelConfig;
use super::decoder::{Block, Decoder};
use super::attention::AttentionSpec;
use super::rope::Rope;
use super::weights::Weights;
use super::Sliding;
use crate::error::{Error, Result};

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let rope = vec![true; cfg.num_hidden_layers];
    build(w, cfg, &rope)
}

/// The Llama model whose layer `i` applies RoPE when `rope[i]` (SmolLM3 turns some off).
pub fn build(w: &Weights, cfg: ModelConfig, rope: &[bool]) -> Result<Decoder> {
    let hd = cfg.head_dim;
    let Sliding { layers: sliding, window } = sliding(&cfg)?;
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let rope = if rope[i] { Rope::new(&cfg, hd, None)? } else { Rope::none() };
            let spec = AttentionSpec { qkv_bias: cfg.attention_bias, o_bias: cfg.attention_bias, ..AttentionSpec::plain(hd, rope) };
            Block::pre_norm(w, &cfg, i, spec, false, sliding[i])
        })
        .collect::<Result<_>>()?;
    let tied = cfg.tie_word_embeddings.unwrap_or(true);
    Decoder::assemble(w, cfg, layers, tied, window)
}

/// Which layers use sliding-window attention, from `layer_types` (all full when absent), over
/// `sliding_window` positions.
pub fn sliding(cfg: &ModelConfig) -> Result<Sliding> {
    let window = cfg.usize_opt("sliding_window").unwrap_or(0);
    let Some(types) = cfg.raw.get("layer_types").and_then(|v| v.as_array()) else {
        return Ok(Sliding { layers: vec![false; cfg.num_hidden_layers], window });
    };
    if types.len() != cfg.num_hidden_layers {
        return Err(Error::config(&cfg.source, format!("layer_types has {} entries for {} layers", types.len(), cfg.num_hidden_layers)));
    }
    let sliding: Vec<bool> = types.iter().map(|t| t.as_str() == Some("sliding_attention")).collect();
    if sliding.iter().any(|&s| s) && window == 0 {
        return Err(Error::config(&cfg.source, "sliding_attention layers need a positive sliding_window"));
    }
    Ok(Sliding { layers: sliding, window })
}
