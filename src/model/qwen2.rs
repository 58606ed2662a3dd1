//! Qwen2 / Qwen2.5 (mlx-lm's `qwen2.py`): Llama blocks with biases on the q, k and v projections
//! and head_dim = hidden / heads.
use super::config::ModelConfig;
use super::decoder::{Block, Decoder};
use super::attention::AttentionSpec;
use super::rope::Rope;
use super::weights::Weights;
use crate::error::Result;

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let hd = cfg.hidden_size / cfg.num_attention_heads;
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let spec = AttentionSpec { qkv_bias: true, ..AttentionSpec::plain(hd, Rope::new(&cfg, hd, None)?) };
            Block::pre_norm(w, &cfg, i, spec, false, false)
        })
        .collect::<Result<_>>()?;
    let tied = cfg.tie_word_embeddings.unwrap_or(true);
    Decoder::assemble(w, cfg, layers, tied, 0)
}
