//! OLMo 2 (mlx-lm's `olmo2.py`): post-norm blocks — attention and the SwiGLU MLP read the
//! residual stream unnormalised, and RMSNorm is applied to their outputs before each residual
//! add — with RMSNorm over the whole q and k projections (all heads at once, before RoPE).
use super::config::ModelConfig;
use super::decoder::{Block, Decoder};
use super::attention::{Attention, AttentionSpec, NormKind};
use super::layers::{Activation, Mlp, RmsNorm};
use super::rope::Rope;
use super::weights::Weights;
use crate::error::Result;

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let (d, eps, hd) = (cfg.hidden_size, cfg.rms_norm_eps, cfg.head_dim);
    let norm = |path: String| RmsNorm::load(w, &path, d, eps).map(Into::into);
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let spec = AttentionSpec {
                qkv_bias: cfg.attention_bias,
                o_bias: cfg.attention_bias,
                qk_norm: Some(NormKind::Whole),
                ..AttentionSpec::plain(hd, Rope::new(&cfg, hd, None)?)
            };
            Ok(Block {
                input_norm: None,
                attn: Attention::load(w, &cfg, &format!("{p}.self_attn"), spec)?,
                post_attn_norm: Some(norm(format!("{p}.post_attention_layernorm"))?),
                pre_mlp_norm: None,
                mlp: Mlp::load(w, &cfg, &format!("{p}.mlp"), Activation::Silu, false)?.into(),
                post_mlp_norm: Some(norm(format!("{p}.post_feedforward_layernorm"))?),
                residual_scale: None,
                sliding: false,
            })
        })
        .collect::<Result<_>>()?;
    let tied = cfg.tie_word_embeddings.unwrap_or(true);
    Decoder::assemble(w, cfg, layers, tied, 0)
}
