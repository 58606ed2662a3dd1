//! Qwen3 (mlx-lm's `qwen3.py`): Llama blocks with RMSNorm over each head of q and k, explicit
//! `head_dim`, no projection biases.
use super::config::ModelConfig;
use super::decoder::{Block, Decoder};
use super::attention::{AttentionSpec, NormKind};
use super::rope::Rope;
use super::weights::Weights;
use crate::error::Result;

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let layers = (0..cfg.num_hidden_layers).map(|i| Block::pre_norm(w, &cfg, i, attention(&cfg)?, false, false)).collect::<Result<_>>()?;
    let tied = cfg.tie_word_embeddings.unwrap_or(true);
    Decoder::assemble(w, cfg, layers, tied, 0)
}

/// Qwen3's attention (Qwen3-MoE's too): per-head RMSNorm of q and k, explicit head_dim.
pub fn attention(cfg: &ModelConfig) -> Result<AttentionSpec> {
    let hd = cfg.head_dim;
    Ok(AttentionSpec { qk_norm: Some(NormKind::Plain), ..AttentionSpec::plain(hd, Rope::new(cfg, hd, None)?) })
}
