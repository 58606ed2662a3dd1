//! Gemma 3 text models (mlx-lm's `gemma3_text.py`): sandwich-normed blocks — (1 + w) RMSNorm
//! before and after both attention and the GeGLU (gelu-tanh) MLP — q/k norms, queries scaled by
//! query_pre_attn_scalar^-½, embeddings scaled by √hidden. Every `sliding_window_pattern`-th
//! layer attends globally with rope_theta; the others attend over a sliding window with
//! rope_local_base_freq.
use super::config::ModelConfig;
use super::decoder::{Block, Decoder};
use super::attention::{AttentionSpec, NormKind};
use super::layers::RmsNorm;
use super::rope::Rope;
use super::weights::Weights;
use super::Sliding;
use crate::error::Result;

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let (d, eps, hd) = (cfg.hidden_size, cfg.rms_norm_eps, cfg.head_dim);
    let Sliding { layers: kinds, window } = sliding(&cfg)?;
    let local_base = cfg.f32_or("rope_local_base_freq", 10_000.0);
    let scale = cfg.f32_or("query_pre_attn_scalar", 256.0).powf(-0.5);
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let sliding = kinds[i];
            let spec = AttentionSpec {
                qk_norm: Some(NormKind::Offset),
                scale,
                ..AttentionSpec::plain(hd, Rope::new(&cfg, hd, sliding.then_some(local_base))?)
            };
            Block::sandwich(w, &cfg, i, spec, sliding)
        })
        .collect::<Result<_>>()?;
    // Gemma ties the output projection exactly when the checkpoint has no lm_head.
    let lm_head = Decoder::lm_head(w, &cfg, !w.has("lm_head.weight"))?;
    // mlx-lm rounds √hidden to bf16 before casting it to the activations' dtype.
    let embed_scale = Some(round_to_bf16((d as f32).sqrt()));
    let final_norm = RmsNorm::load_offset(w, "model.norm", d, eps)?.into();
    Ok(Decoder { embed_scale, ..Decoder::new(w, cfg, layers, final_norm, lm_head, window)? })
}

/// `x` rounded to the nearest bf16 (ties to even), as an f32: bf16 is f32's top 16 bits.
fn round_to_bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    f32::from_bits(bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000)
}

/// Every `sliding_window_pattern`-th layer (default 6) is global; the others slide over
/// `sliding_window` positions (default 512), as mlx-lm builds them whatever `layer_types` says.
pub fn sliding(cfg: &ModelConfig) -> Result<Sliding> {
    let pattern = cfg.usize_opt("sliding_window_pattern").unwrap_or(6).max(1);
    let layers = (0..cfg.num_hidden_layers).map(|i| (i + 1) % pattern != 0).collect();
    Ok(Sliding { layers, window: cfg.usize_opt("sliding_window").unwrap_or(512) })
}
