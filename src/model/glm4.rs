//! GLM-4 (mlx-lm's `glm4.py`): sandwich-normed blocks — RMSNorm before and after both attention
//! and the MLP — with q/k/v biases, RoPE over the first `partial_rotary_factor` of each head
//! (traditional, interleaved pairs, unless the config says otherwise), a fused `gate_up_proj`
//! SwiGLU MLP and an untied output projection.
use serde_json::Value;

use super::config::ModelConfig;
use super::decoder::{Block, Decoder};
use super::attention::{Attention, AttentionSpec};
use super::layers::{Activation, Mlp, RmsNorm};
use super::rope::Rope;
use super::weights::Weights;
use crate::error::{Error, Result};

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let (d, eps, hd) = (cfg.hidden_size, cfg.rms_norm_eps, cfg.head_dim);
    let partial = cfg.raw.get("partial_rotary_factor").and_then(Value::as_f64);
    let partial = partial.ok_or_else(|| Error::config(&cfg.source, "GLM-4 needs partial_rotary_factor"))?;
    let rope_dims = (hd as f64 * partial) as usize;
    let traditional = cfg.raw.get("rope_traditional").and_then(Value::as_bool).unwrap_or(true);
    let norm = |path: String| RmsNorm::load(w, &path, d, eps).map(Into::into);
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let rope = Rope::plain(rope_dims, cfg.rope_theta, traditional);
            let spec = AttentionSpec { qkv_bias: cfg.attention_bias, ..AttentionSpec::plain(hd, rope) };
            Ok(Block {
                input_norm: Some(norm(format!("{p}.input_layernorm"))?),
                attn: Attention::load(w, &cfg, &format!("{p}.self_attn"), spec)?,
                post_attn_norm: Some(norm(format!("{p}.post_self_attn_layernorm"))?),
                pre_mlp_norm: Some(norm(format!("{p}.post_attention_layernorm"))?),
                mlp: Mlp::load(w, &cfg, &format!("{p}.mlp"), Activation::Silu, true)?.into(),
                post_mlp_norm: Some(norm(format!("{p}.post_mlp_layernorm"))?),
                residual_scale: None,
                sliding: false,
            })
        })
        .collect::<Result<_>>()?;
    Decoder::assemble(w, cfg, layers, false, 0)
}
