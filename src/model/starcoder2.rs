//! StarCoder 2 (mlx-lm's `starcoder2.py`): pre-norm blocks with LayerNorm (weight and bias),
//! GQA attention with biases on every projection and RoPE (base 100000 by default), and a plain
//! GELU MLP `c_proj(gelu(c_fc(x)))`. Every layer attends globally (mlx-lm ignores
//! `sliding_window`).
use super::blocks::{FeedForward, LayerNorm};
use super::config::ModelConfig;
use super::decoder::{Block, Decoder};
use super::attention::{Attention, AttentionSpec};
use super::rope::Rope;
use super::weights::Weights;
use crate::error::Result;

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let d = cfg.hidden_size;
    let hd = d / cfg.num_attention_heads;
    let eps = cfg.f32_or("norm_epsilon", 1e-5);
    let theta = cfg.f32_or("rope_theta", 100_000.0);
    let norm = |path: String| LayerNorm::load(w, &path, d, eps).map(Into::into);
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let spec = AttentionSpec { qkv_bias: true, o_bias: true, ..AttentionSpec::plain(hd, Rope::plain(hd, theta, false)) };
            Ok(Block {
                input_norm: Some(norm(format!("{p}.input_layernorm"))?),
                attn: Attention::load(w, &cfg, &format!("{p}.self_attn"), spec)?,
                post_attn_norm: None,
                pre_mlp_norm: Some(norm(format!("{p}.post_attention_layernorm"))?),
                mlp: FeedForward::load_plain(w, &cfg, &format!("{p}.mlp"))?,
                post_mlp_norm: None,
                residual_scale: None,
                sliding: false,
            })
        })
        .collect::<Result<_>>()?;
    let final_norm = norm("model.norm".into())?;
    let lm_head = Decoder::lm_head(w, &cfg, cfg.tie_word_embeddings.unwrap_or(true))?;
    Decoder::new(w, cfg, layers, final_norm, lm_head, 0)
}
