//! Llama (SmolLM2, Llama 3.x) and Mistral-style models (mlx-lm's `llama.py`): pre-norm blocks of
//! GQA attention with RoPE and a SwiGLU MLP. `layer_types` may mark layers as sliding-window
//! attention over `sliding_window` positions.
use super::config::ModelConfig;
use super::decoder::{Block, Decoder};
use super::layers::{Activation, Attention, AttentionSpec, Embedding, Mlp, RmsNorm, Rope};
use super::weights::Weights;
use crate::error::{Error, Result};

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let (d, eps, hd) = (cfg.hidden_size, cfg.rms_norm_eps, cfg.head_dim);
    let sliding = layer_kinds(&cfg)?;
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let spec = AttentionSpec {
                head_dim: hd,
                qkv_bias: cfg.attention_bias,
                o_bias: cfg.attention_bias,
                fused_qkv: false,
                qk_norm: None,
                scale: (hd as f32).powf(-0.5),
                rope: Rope::new(&cfg, hd, None)?,
            };
            Ok(Block {
                input_norm: RmsNorm::load(w, &format!("{p}.input_layernorm"), d, eps)?,
                attn: Attention::load(w, &cfg, &format!("{p}.self_attn"), spec)?,
                post_attn_norm: None,
                pre_mlp_norm: RmsNorm::load(w, &format!("{p}.post_attention_layernorm"), d, eps)?,
                mlp: Mlp::load(w, &cfg, &format!("{p}.mlp"), Activation::Silu, false)?,
                post_mlp_norm: None,
                sliding: sliding[i],
            })
        })
        .collect::<Result<_>>()?;
    Ok(Decoder {
        embed_tokens: Embedding::load(w, &cfg, "model.embed_tokens", cfg.vocab_size, d)?,
        embed_scale: None,
        layers,
        norm: RmsNorm::load(w, "model.norm", d, eps)?,
        lm_head: Decoder::lm_head(w, &cfg, cfg.tie_word_embeddings.unwrap_or(true))?,
        sliding_window: cfg.usize_opt("sliding_window").unwrap_or(0),
        config: cfg,
    })
}

/// Which layers use sliding-window attention, from `layer_types` (all full when absent).
pub fn layer_kinds(cfg: &ModelConfig) -> Result<Vec<bool>> {
    let Some(types) = cfg.raw.get("layer_types").and_then(|v| v.as_array()) else {
        return Ok(vec![false; cfg.num_hidden_layers]);
    };
    if types.len() != cfg.num_hidden_layers {
        return Err(Error::config(&cfg.source, format!("layer_types has {} entries for {} layers", types.len(), cfg.num_hidden_layers)));
    }
    let sliding: Vec<bool> = types.iter().map(|t| t.as_str() == Some("sliding_attention")).collect();
    if sliding.iter().any(|&s| s) && cfg.usize_opt("sliding_window").unwrap_or(0) == 0 {
        return Err(Error::config(&cfg.source, "sliding_attention layers need a positive sliding_window"));
    }
    Ok(sliding)
}
