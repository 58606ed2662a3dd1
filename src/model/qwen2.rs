//! Qwen2 / Qwen2.5 (mlx-lm's `qwen2.py`): Llama blocks with biases on the q, k and v projections.
use super::config::ModelConfig;
use super::decoder::{Block, Decoder};
use super::layers::{Activation, Attention, AttentionSpec, Embedding, Mlp, RmsNorm, Rope};
use super::weights::Weights;
use crate::error::Result;

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let (d, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
    let hd = d / cfg.num_attention_heads;
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let spec = AttentionSpec {
                head_dim: hd,
                qkv_bias: true,
                o_bias: false,
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
                sliding: false,
            })
        })
        .collect::<Result<_>>()?;
    Ok(Decoder {
        embed_tokens: Embedding::load(w, &cfg, "model.embed_tokens", cfg.vocab_size, d)?,
        embed_scale: None,
        layers,
        norm: RmsNorm::load(w, "model.norm", d, eps)?,
        lm_head: Decoder::lm_head(w, &cfg, cfg.tie_word_embeddings.unwrap_or(true))?,
        sliding_window: 0,
        config: cfg,
    })
}
