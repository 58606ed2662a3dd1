//! Phi-3 (mlx-lm's `phi3.py`): Llama-style blocks with fused `qkv_proj` and `gate_up_proj`,
//! head_dim = hidden / heads, optional partial rotary dims and su/longrope RoPE scaling.
use super::config::ModelConfig;
use super::decoder::{Block, Decoder};
use super::layers::{Activation, Attention, AttentionSpec, Embedding, Mlp, RmsNorm, Rope};
use super::weights::Weights;
use crate::error::Result;

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let (d, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
    let hd = d / cfg.num_attention_heads;
    let rope_dims = (hd as f32 * cfg.f32_or("partial_rotary_factor", 1.0)) as usize;
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let spec = AttentionSpec {
                head_dim: hd,
                qkv_bias: false,
                o_bias: false,
                fused_qkv: true,
                qk_norm: None,
                scale: (hd as f32).powf(-0.5),
                rope: Rope::new(&cfg, rope_dims, None)?,
            };
            Ok(Block {
                input_norm: RmsNorm::load(w, &format!("{p}.input_layernorm"), d, eps)?,
                attn: Attention::load(w, &cfg, &format!("{p}.self_attn"), spec)?,
                post_attn_norm: None,
                pre_mlp_norm: RmsNorm::load(w, &format!("{p}.post_attention_layernorm"), d, eps)?,
                mlp: Mlp::load(w, &cfg, &format!("{p}.mlp"), Activation::Silu, true)?,
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
        lm_head: Decoder::lm_head(w, &cfg, cfg.tie_word_embeddings.unwrap_or(false))?,
        sliding_window: 0,
        config: cfg,
    })
}
