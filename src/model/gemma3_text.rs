//! Gemma 3 text models (mlx-lm's `gemma3_text.py`): sandwich-normed blocks — (1 + w) RMSNorm
//! before and after both attention and the GeGLU (gelu-tanh) MLP — q/k norms, queries scaled by
//! query_pre_attn_scalar^-½, embeddings scaled by √hidden. Every `sliding_window_pattern`-th
//! layer attends globally with rope_theta; the others attend over a sliding window with
//! rope_local_base_freq.
use super::config::ModelConfig;
use super::decoder::{Block, Decoder};
use super::layers::{Activation, Attention, AttentionSpec, Embedding, Mlp, NormKind, RmsNorm, Rope};
use super::weights::Weights;
use super::Sliding;
use crate::error::Result;

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let (d, eps, hd) = (cfg.hidden_size, cfg.rms_norm_eps, cfg.head_dim);
    let Sliding { layers: kinds, window } = sliding(&cfg)?;
    let local_base = cfg.f32_or("rope_local_base_freq", 10_000.0);
    let scale = cfg.f32_or("query_pre_attn_scalar", 256.0).powf(-0.5);
    let norm = |path: String| RmsNorm::load_offset(w, &path, d, eps);
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let sliding = kinds[i];
            let spec = AttentionSpec {
                head_dim: hd,
                qkv_bias: false,
                o_bias: false,
                fused_qkv: false,
                qk_norm: Some(NormKind::Offset),
                scale,
                rope: Rope::new(&cfg, hd, sliding.then_some(local_base))?,
            };
            Ok(Block {
                input_norm: norm(format!("{p}.input_layernorm"))?,
                attn: Attention::load(w, &cfg, &format!("{p}.self_attn"), spec)?,
                post_attn_norm: Some(norm(format!("{p}.post_attention_layernorm"))?),
                pre_mlp_norm: norm(format!("{p}.pre_feedforward_layernorm"))?,
                mlp: Mlp::load(w, &cfg, &format!("{p}.mlp"), Activation::GeluApprox, false)?,
                post_mlp_norm: Some(norm(format!("{p}.post_feedforward_layernorm"))?),
                sliding,
            })
        })
        .collect::<Result<_>>()?;
    Ok(Decoder {
        embed_tokens: Embedding::load(w, &cfg, "model.embed_tokens", cfg.vocab_size, d)?,
        embed_scale: Some((d as f32).sqrt()),
        layers,
        norm: norm("model.norm".into())?,
        // Gemma ties the output projection exactly when the checkpoint has no lm_head.
        lm_head: Decoder::lm_head(w, &cfg, !w.has("lm_head.weight"))?,
        sliding_window: window,
        fingerprint: String::new(),
        config: cfg,
    })
}

/// Every `sliding_window_pattern`-th layer (default 6) is global; the others slide over
/// `sliding_window` positions (default 512), as mlx-lm builds them whatever `layer_types` says.
pub fn sliding(cfg: &ModelConfig) -> Result<Sliding> {
    let pattern = cfg.usize_opt("sliding_window_pattern").unwrap_or(6).max(1);
    let layers = (0..cfg.num_hidden_layers).map(|i| (i + 1) % pattern != 0).collect();
    Ok(Sliding { layers, window: cfg.usize_opt("sliding_window").unwrap_or(512) })
}
