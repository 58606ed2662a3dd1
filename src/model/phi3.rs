//! Phi-3 (mlx-lm's `phi3.py`): Llama-style blocks with fused `qkv_proj` and `gate_up_proj`,
//! head_dim = hidden / heads, optional partial rotary dims and su/longrope RoPE scaling.
use super::config::ModelConfig;
use super::decoder::{Block, Decoder};
use super::attention::AttentionSpec;
use super::rope::Rope;
use super::weights::Weights;
use crate::error::Result;

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let hd = cfg.hidden_size / cfg.num_attention_heads;
    let rope_dims = (hd as f32 * cfg.f32_or("partial_rotary_factor", 1.0)) as usize;
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let spec = AttentionSpec { fused_qkv: true, ..AttentionSpec::plain(hd, Rope::new(&cfg, rope_dims, None)?) };
            Block::pre_norm(w, &cfg, i, spec, true, false)
        })
        .collect::<Result<_>>()?;
    let tied = cfg.tie_word_embeddings.unwrap_or(false);
    Decoder::assemble(w, cfg, layers, tied, 0)
}
