//! Building blocks shared by every architecture: linear and embedding layers (dense or MLX affine
//! quantized), RMSNorm, RoPE variants, attention with a KV cache, and the SwiGLU MLP.
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{fast, ops, Array};

use super::config::{ModelConfig, QuantParams, RopeScaling};
use super::weights::Weights;
use crate::cache::KvCache;
use crate::error::{Error, Result};

/// Loads module `path` (`<path>.weight`, plus `.scales`/`.biases` when quantized) from weights.
/// A module counts as quantized when its scales are present, as in mlx-lm.
fn quant_params(w: &Weights, cfg: &ModelConfig, path: &str) -> Result<Option<QuantParams>> {
    if !w.has(&format!("{path}.scales")) {
        return Ok(None);
    }
    let q = cfg.quantization.as_ref().ok_or_else(|| {
        Error::tensor(format!("{path}.scales"), "quantized tensor but config.json has no quantization block")
    })?;
    q.params_for(path)
        .map(Some)
        .ok_or_else(|| Error::tensor(format!("{path}.scales"), "quantized tensor but config marks it unquantized"))
}

pub struct QuantWeight {
    weight: Array,
    scales: Array,
    biases: Array,
    params: QuantParams,
}

impl QuantWeight {
    fn load(w: &Weights, path: &str, params: QuantParams, rows: usize, cols: usize) -> Result<Self> {
        let packed = cols * params.bits as usize / 32;
        let groups = cols / params.group_size as usize;
        Ok(QuantWeight {
            weight: w.array_shaped(&format!("{path}.weight"), &[rows, packed])?,
            scales: w.array_shaped(&format!("{path}.scales"), &[rows, groups])?,
            biases: w.array_shaped(&format!("{path}.biases"), &[rows, groups])?,
            params,
        })
    }

    fn matmul_t(&self, x: &Array) -> Result<Array> {
        Ok(ops::quantized_matmul(
            x,
            &self.weight,
            &self.scales,
            &self.biases,
            true,
            self.params.group_size,
            self.params.bits,
        )?)
    }
}

pub enum Linear {
    Dense { weight: Array, bias: Option<Array> },
    Quantized { q: QuantWeight, bias: Option<Array> },
}

impl Linear {
    pub fn load(w: &Weights, cfg: &ModelConfig, path: &str, out_dim: usize, in_dim: usize, bias: bool) -> Result<Self> {
        let bias = if bias { Some(w.array_shaped(&format!("{path}.bias"), &[out_dim])?) } else { None };
        Ok(match quant_params(w, cfg, path)? {
            Some(p) => Linear::Quantized { q: QuantWeight::load(w, path, p, out_dim, in_dim)?, bias },
            None => Linear::Dense { weight: w.array_shaped(&format!("{path}.weight"), &[out_dim, in_dim])?, bias },
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Linear::Dense { weight, bias: Some(b) } => Ok(ops::addmm(b, x, weight.t(), None, None)?),
            Linear::Dense { weight, bias: None } => Ok(ops::matmul(x, weight.t())?),
            Linear::Quantized { q, bias } => {
                let y = q.matmul_t(x)?;
                Ok(match bias {
                    Some(b) => ops::add(&y, b)?,
                    None => y,
                })
            }
        }
    }
}

pub enum Embedding {
    Dense(Array),
    Quantized(QuantWeight),
}

impl Embedding {
    pub fn load(w: &Weights, cfg: &ModelConfig, path: &str, vocab: usize, dim: usize) -> Result<Self> {
        Ok(match quant_params(w, cfg, path)? {
            Some(p) => Embedding::Quantized(QuantWeight::load(w, path, p, vocab, dim)?),
            None => Embedding::Dense(w.array_shaped(&format!("{path}.weight"), &[vocab, dim])?),
        })
    }

    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match self {
            Embedding::Dense(weight) => Ok(weight.take_axis(ids, 0)?),
            Embedding::Quantized(q) => Ok(ops::dequantize(
                q.weight.take_axis(ids, 0)?,
                q.scales.take_axis(ids, 0)?,
                &q.biases.take_axis(ids, 0)?,
                q.params.group_size,
                q.params.bits,
            )?),
        }
    }

    /// The tied output projection: hidden states times the embedding matrix transposed.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        match self {
            Embedding::Dense(weight) => Ok(ops::matmul(x, weight.t())?),
            Embedding::Quantized(q) => q.matmul_t(x),
        }
    }
}

pub struct RmsNorm {
    weight: Array,
    eps: f32,
}

impl RmsNorm {
    pub fn load(w: &Weights, path: &str, dim: usize, eps: f32) -> Result<Self> {
        Ok(RmsNorm { weight: w.array_shaped(&format!("{path}.weight"), &[dim])?, eps })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}

/// Rotary position embedding: default, linear-scaled, or Llama 3 frequency-scaled.
pub struct Rope {
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    freqs: Option<Array>,
}

impl Rope {
    pub fn new(cfg: &ModelConfig, dims: usize) -> Result<Self> {
        let dims = dims as i32;
        let plain = |scale| Rope { dims, traditional: cfg.rope_traditional, base: Some(cfg.rope_theta), scale, freqs: None };
        Ok(match &cfg.rope_scaling {
            None => plain(1.0),
            Some(RopeScaling::Linear { factor }) => plain(1.0 / factor),
            Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
                Rope {
                    dims,
                    traditional: cfg.rope_traditional,
                    base: None,
                    scale: 1.0,
                    freqs: Some(llama3_freqs(
                        dims,
                        cfg.rope_theta,
                        *factor,
                        *low_freq_factor,
                        *high_freq_factor,
                        *original_max_position_embeddings,
                    )?),
                }
            }
        })
    }

    pub fn forward(&self, x: &Array, offset: i32) -> Result<Array> {
        Ok(fast::rope(x, self.dims, self.traditional, self.base, self.scale, offset, self.freqs.as_ref())?)
    }
}

/// Llama 3 RoPE frequencies, computed with MLX ops in the same order as mlx-lm's Llama3RoPE so the
/// values match bit for bit.
fn llama3_freqs(dims: i32, base: f32, factor: f32, low: f32, high: f32, old_ctx: f32) -> Result<Array> {
    let low_wavelen = old_ctx / low;
    let high_wavelen = old_ctx / high;
    let exps = ops::divide(&ops::arange::<_, f32>(0, dims, 2)?, Array::from_f32(dims as f32))?;
    let freqs = ops::power(Array::from_f32(base), &exps)?;
    let wavelens = ops::multiply(Array::from_f32(2.0 * std::f32::consts::PI), &freqs)?;
    let freqs = ops::select(
        &wavelens.gt(Array::from_f32(low_wavelen))?,
        &ops::multiply(&freqs, Array::from_f32(factor))?,
        &freqs,
    )?;
    let medium = ops::logical_and(&wavelens.gt(Array::from_f32(high_wavelen))?, &wavelens.lt(Array::from_f32(low_wavelen))?)?;
    let smooth = ops::divide(
        &ops::subtract(&ops::divide(Array::from_f32(old_ctx), &wavelens)?, Array::from_f32(low))?,
        Array::from_f32(high - low),
    )?;
    let denom = ops::add(
        &ops::divide(&ops::subtract(Array::from_f32(1.0), &smooth)?, Array::from_f32(factor))?,
        &smooth,
    )?;
    let smooth_freqs = ops::divide(&freqs, &denom)?;
    let out = ops::select(&medium, &smooth_freqs, &freqs)?;
    out.eval()?;
    Ok(out)
}

/// Multi-head attention with grouped KV heads, RoPE and a KV cache, through MLX's fused SDPA.
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    n_heads: i32,
    n_kv_heads: i32,
    scale: f32,
    rope: Rope,
}

impl Attention {
    pub fn load(w: &Weights, cfg: &ModelConfig, path: &str) -> Result<Self> {
        let (d, hd) = (cfg.hidden_size, cfg.head_dim);
        let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        let bias = cfg.attention_bias;
        Ok(Attention {
            q_proj: Linear::load(w, cfg, &format!("{path}.q_proj"), nh * hd, d, bias)?,
            k_proj: Linear::load(w, cfg, &format!("{path}.k_proj"), nkv * hd, d, bias)?,
            v_proj: Linear::load(w, cfg, &format!("{path}.v_proj"), nkv * hd, d, bias)?,
            o_proj: Linear::load(w, cfg, &format!("{path}.o_proj"), d, nh * hd, bias)?,
            n_heads: nh as i32,
            n_kv_heads: nkv as i32,
            scale: (hd as f32).powf(-0.5),
            rope: Rope::new(cfg, hd)?,
        })
    }

    pub fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let split = |t: Array, heads: i32| -> Result<Array> { Ok(t.reshape(&[b, l, heads, -1])?.transpose_axes(&[0, 2, 1, 3])?) };
        let q = split(self.q_proj.forward(x)?, self.n_heads)?;
        let k = split(self.k_proj.forward(x)?, self.n_kv_heads)?;
        let v = split(self.v_proj.forward(x)?, self.n_kv_heads)?;
        let offset = cache.offset() as i32;
        let q = self.rope.forward(&q, offset)?;
        let k = self.rope.forward(&k, offset)?;
        let (k, v) = cache.update_and_fetch(k, v)?;
        let mask = (l > 1).then_some(fast::ScaledDotProductAttentionMask::Causal);
        let o = fast::scaled_dot_product_attention(&q, &k, &v, self.scale, mask, None)?;
        self.o_proj.forward(&o.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
    }
}

/// SiLU-gated MLP: down(silu(gate(x)) * up(x)).
pub struct SwiGlu {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl SwiGlu {
    pub fn load(w: &Weights, cfg: &ModelConfig, path: &str) -> Result<Self> {
        let (d, h, bias) = (cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias);
        Ok(SwiGlu {
            gate_proj: Linear::load(w, cfg, &format!("{path}.gate_proj"), h, d, bias)?,
            up_proj: Linear::load(w, cfg, &format!("{path}.up_proj"), h, d, bias)?,
            down_proj: Linear::load(w, cfg, &format!("{path}.down_proj"), d, h, bias)?,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let gate = self.gate_proj.forward(x)?;
        let up = self.up_proj.forward(x)?;
        self.down_proj.forward(&ops::multiply(&mlx_rs::nn::silu(&gate)?, &up)?)
    }
}

/// The hidden state of the last position only, so the output projection runs on one row.
pub fn last_position(h: &Array) -> Result<Array> {
    Ok(h.index((.., -1.., ..)))
}
