//! Gemma (mlx-lm's `gemma.py`): pre-norm blocks with (1 + w) RMSNorm, GQA attention with RoPE
//! over an explicit head_dim, a GeGLU MLP with exact GELU, embeddings scaled by √hidden and the
//! output projection tied to the embedding. Every layer attends globally.
use super::config::ModelConfig;
use super::decoder::{Block, Decoder};
use super::attention::{Attention, AttentionSpec};
use super::layers::{Activation, Mlp, RmsNorm};
use super::rope::Rope;
use super::weights::Weights;
use crate::error::Result;

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let (d, eps, hd) = (cfg.hidden_size, cfg.rms_norm_eps, cfg.head_dim);
    let norm = |path: String| RmsNorm::load_offset(w, &path, d, eps).map(Into::into);
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let spec = AttentionSpec::plain(hd, Rope::plain(hd, cfg.rope_theta, cfg.rope_traditional));
            Ok(Block {
                input_norm: Some(norm(format!("{p}.input_layernorm"))?),
                attn: Attention::load(w, &cfg, &format!("{p}.self_attn"), spec)?,
                post_attn_norm: None,
                pre_mlp_norm: Some(norm(format!("{p}.post_attention_layernorm"))?),
                mlp: Mlp::load(w, &cfg, &format!("{p}.mlp"), Activation::Gelu, false)?.into(),
                post_mlp_norm: None,
                residual_scale: None,
                sliding: false,
            })
        })
        .collect::<Result<_>>()?;
    let final_norm = norm("model.norm".into())?;
    // √hidden is a Python float in mlx-lm, cast to the activations' dtype (no bf16 rounding
    // first, unlike Gemma 3).
    Ok(Decoder { embed_scale: Some((d as f32).sqrt()), ..Decoder::new(w, cfg, layers, final_norm, None, 0)? })
}
