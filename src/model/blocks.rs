//! Building blocks beyond the Llama family's, for the architectures that need them: the choice
//! of norm (RMSNorm, or LayerNorm with a bias as in StarCoder 2), the plain GELU feed-forward
//! network, the mixture-of-experts one (`experts.rs`), exact GELU (Gemma), tanh soft-capping, and attention over soft-capped scores
//! (Gemma 2).
use mlx_rs::error::Exception;
use mlx_rs::fast::ScaledDotProductAttentionMask;
use mlx_rs::{fast, ops, Array};

use super::config::ModelConfig;
use super::experts::SparseMoe;
use super::layers::{scalar, Linear, Mlp, RmsNorm};
use super::weights::Weights;
use crate::cache::causal_mask;
use crate::error::Result;
use crate::mlx::compiled;

/// mlx.nn.LayerNorm with its weight and bias.
pub struct LayerNorm {
    weight: Array,
    bias: Array,
    eps: f32,
}

impl LayerNorm {
    pub fn load(w: &Weights, path: &str, dim: usize, eps: f32) -> Result<Self> {
        Ok(LayerNorm { weight: w.array_shaped(&format!("{path}.weight"), &[dim])?, bias: w.array_shaped(&format!("{path}.bias"), &[dim])?, eps })
    }
}

/// A block's or the final hidden states' normalisation.
pub enum Norm {
    Rms(RmsNorm),
    Layer(LayerNorm),
}

impl Norm {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Norm::Rms(n) => n.forward(x),
            Norm::Layer(n) => Ok(fast::layer_norm(x, &n.weight, &n.bias, n.eps)?),
        }
    }
}

impl From<RmsNorm> for Norm {
    fn from(n: RmsNorm) -> Self {
        Norm::Rms(n)
    }
}

impl From<LayerNorm> for Norm {
    fn from(n: LayerNorm) -> Self {
        Norm::Layer(n)
    }
}

/// A block's feed-forward network.
pub enum FeedForward {
    /// down(act(gate(x)) · up(x)).
    Gated(Mlp),
    /// StarCoder 2's `c_proj(gelu(c_fc(x)))`, with biases.
    Plain { fc: Linear, proj: Linear },
    /// Each token's top-k of many gated MLPs (Qwen3-MoE; Qwen3-Next and Qwen3.5-MoE add a shared expert).
    Experts(Box<SparseMoe>),
}

impl FeedForward {
    /// `<path>.c_fc` and `<path>.c_proj`, both with biases.
    pub fn load_plain(w: &Weights, cfg: &ModelConfig, path: &str) -> Result<Self> {
        let (d, h) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(FeedForward::Plain {
            fc: Linear::load(w, cfg, &format!("{path}.c_fc"), h, d, true)?,
            proj: Linear::load(w, cfg, &format!("{path}.c_proj"), d, h, true)?,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            FeedForward::Gated(mlp) => mlp.forward(x),
            FeedForward::Plain { fc, proj } => proj.forward(&gelu(&fc.forward(x)?)?),
            FeedForward::Experts(moe) => moe.forward(x),
        }
    }
}

impl From<Mlp> for FeedForward {
    fn from(m: Mlp) -> Self {
        FeedForward::Gated(m)
    }
}

/// mlx.nn.gelu, x · (1 + erf(x / √2)) / 2, compiled as MLX compiles it, with scalars in the
/// input's dtype like Python's weak floats.
pub fn gelu(x: &Array) -> Result<Array> {
    let f = |a: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
        let x = &a[0];
        let c = |v: f32| Array::from_f32(v).as_dtype(x.dtype());
        let erf = ops::erf(ops::divide(x, &c(std::f32::consts::SQRT_2)?)?)?;
        Ok(vec![ops::divide(&ops::multiply(x, &ops::add(&c(1.0)?, &erf)?)?, &c(2.0)?)?])
    };
    Ok(compiled::call1(("gelu", [0; 4]), true, &[x.clone()], f)?)
}

/// cap · tanh(x / cap): values squashed smoothly into (-cap, cap) (Gemma 2's scores and logits).
pub fn softcap(x: &Array, cap: f32) -> Result<Array> {
    let c = scalar(cap, x)?;
    Ok(ops::multiply(&ops::tanh(&ops::divide(x, &c)?)?, &c)?)
}

/// Attention whose scores are soft-capped before the mask and softmax (Gemma 2). MLX's fused
/// SDPA cannot cap, so the scores are computed explicitly, each KV head's group of query heads
/// together as mlx-lm does: q [B, heads, L, D]; k, v [B, kv_heads, S, D].
pub fn softcapped_attention(q: &Array, k: &Array, v: &Array, scale: f32, cap: f32, mask: Option<ScaledDotProductAttentionMask>) -> Result<Array> {
    let (b, heads, l, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let (kv_heads, s) = (k.shape()[1], k.shape()[2]);
    let group = heads / kv_heads;
    let mut q = ops::multiply(q, &scalar(scale, q)?)?;
    let (mut k, mut v) = (k.clone(), v.clone());
    if group > 1 {
        q = q.reshape(&[b, kv_heads, group, l, d])?;
        k = k.expand_dims(2)?;
        v = v.expand_dims(2)?;
    }
    let scores = softcap(&ops::matmul(&q, &k.swap_axes(-1, -2)?)?, cap)?;
    let allowed = match mask {
        None => None,
        // Causal aligned to the end of the keys: query i sits at position s - l + i.
        Some(ScaledDotProductAttentionMask::Causal) => Some(causal_mask(l, s - l, None)?),
        // A per-row mask [B, 1, L, S] meets the grouped scores [B, kv_heads, group, L, S].
        Some(ScaledDotProductAttentionMask::Array(m)) if group > 1 && m.ndim() > 3 => Some(m.expand_dims(2)?),
        Some(ScaledDotProductAttentionMask::Array(m)) => Some(m.clone()),
    };
    let scores = match allowed {
        None => scores,
        Some(m) => {
            let lowest = Array::from_f32(scores.dtype().finfo_min().expect("scores are floats") as f32).as_dtype(scores.dtype())?;
            ops::select(&m, &scores, &lowest)?
        }
    };
    let out = ops::matmul(&ops::softmax_axis(&scores, -1, true)?, &v)?;
    Ok(if group > 1 { out.reshape(&[b, heads, l, d])? } else { out })
}
