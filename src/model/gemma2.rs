//! Gemma 2 (mlx-lm's `gemma2.py`): sandwich-normed blocks — (1 + w) RMSNorm before and after
//! both attention and the GeGLU (gelu-tanh) MLP — with attention scores soft-capped at
//! ±attn_logit_softcapping and the logits at ±final_logit_softcapping, queries scaled by
//! query_pre_attn_scalar^-½, embeddings by √hidden, the output tied to the embedding. mlx-lm
//! attends globally in every layer (it has no sliding-window layers for Gemma 2).
use super::config::ModelConfig;
use super::decoder::{Block, Decoder, OutputScaling};
use super::attention::AttentionSpec;
use super::layers::RmsNorm;
use super::rope::Rope;
use super::weights::Weights;
use crate::error::Result;

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let (d, eps, hd) = (cfg.hidden_size, cfg.rms_norm_eps, cfg.head_dim);
    let scale = cfg.f32_or("query_pre_attn_scalar", 144.0).powf(-0.5);
    let attn_cap = cfg.f32_or("attn_logit_softcapping", 50.0);
    let final_cap = cfg.f32_or("final_logit_softcapping", 30.0);
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let rope = Rope::plain(hd, cfg.rope_theta, cfg.rope_traditional);
            let spec = AttentionSpec { scale, softcap: Some(attn_cap), ..AttentionSpec::plain(hd, rope) };
            Block::sandwich(w, &cfg, i, spec, false)
        })
        .collect::<Result<_>>()?;
    let final_norm = RmsNorm::load_offset(w, "model.norm", d, eps)?.into();
    Ok(Decoder {
        // A Python float in mlx-lm, cast to the activations' dtype.
        embed_scale: Some((d as f32).sqrt()),
        output_scaling: OutputScaling::Softcap(final_cap),
        ..Decoder::new(w, cfg, layers, final_norm, None, 0)?
    })
}
