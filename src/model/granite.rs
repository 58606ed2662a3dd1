//! Granite (mlx-lm's `granite.py`): Llama blocks scaled by its multipliers — embeddings times
//! `embedding_multiplier`, each residual update times `residual_multiplier`, attention scores
//! scaled by `attention_multiplier` (instead of head_dim^-½), logits divided by
//! `logits_scaling` — with optional projection biases and head_dim = hidden / heads.
use super::config::ModelConfig;
use super::decoder::{Block, Decoder, OutputScaling};
use super::attention::AttentionSpec;
use super::rope::Rope;
use super::weights::Weights;
use crate::error::Result;

pub fn load(w: &Weights, mut cfg: ModelConfig) -> Result<Decoder> {
    let hd = cfg.hidden_size / cfg.num_attention_heads;
    let attention = cfg.required_f64("attention_multiplier")? as f32;
    let residual = cfg.required_f64("residual_multiplier")? as f32;
    let embedding = cfg.required_f64("embedding_multiplier")? as f32;
    let logits = cfg.required_f64("logits_scaling")? as f32;
    // mlx-lm's Granite never rotates traditionally, whatever the config says.
    cfg.rope_traditional = false;
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let spec = AttentionSpec {
                qkv_bias: cfg.attention_bias,
                o_bias: cfg.attention_bias,
                scale: attention,
                ..AttentionSpec::plain(hd, Rope::new(&cfg, hd, None)?)
            };
            Ok(Block { residual_scale: Some(residual), ..Block::pre_norm(w, &cfg, i, spec, false, false)? })
        })
        .collect::<Result<_>>()?;
    let tied = cfg.tie_word_embeddings.unwrap_or(true);
    Ok(Decoder {
        embed_scale: Some(embedding),
        output_scaling: OutputScaling::DivideLogits(logits),
        ..Decoder::assemble(w, cfg, layers, tied, 0)?
    })
}
