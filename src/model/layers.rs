//! Building blocks shared by every architecture: linear and embedding layers (dense or MLX affine
//! quantized), RMSNorm, attention with a KV cache (RoPE in rope.rs), and gated MLPs. Scalars that
//! meet activations are cast to the activation dtype first, as Python's weak scalars are in
//! mlx-lm, so bf16 models stay bf16 and match it bit for bit.
use std::ops::Range;

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::compile::compile;
use mlx_rs::fast::ScaledDotProductAttentionMask;
use mlx_rs::{fast, ops, Array, Dtype};

use super::blocks::{gelu, softcapped_attention};
use super::config::{ModelConfig, QuantParams};
use super::rope::Rope;
use super::weights::{F32Matmuls, Weights};
use crate::cache::{CacheView, LayerCache, Mask, StackedAttention, StackedStep, StepShape};
use crate::error::{Error, Result};
use crate::mlx::backend;

/// A scalar in `like`'s dtype (a Python float in mlx-lm).
pub fn scalar(v: f32, like: &Array) -> Result<Array> {
    Ok(Array::from_f32(v).as_dtype(like.dtype())?)
}

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
    /// The stored dtype of half-precision scales held in f32 (`f32Matmuls: 'all'`), which the
    /// outputs are cast back to. MLX's CPU backend multiplies half-precision activations by
    /// half-precision scales in a kernel 7x (bf16) to 35x (f16) slower than its f32 one, which it
    /// runs as soon as either side is f32 (576×1536 at one row: 0.9 ms against 7 ms / 32 ms); it
    /// also accumulates in f32 there, so outputs differ from mlx-lm's (closer to the f32 ones).
    half: Option<Dtype>,
}

impl QuantWeight {
    fn load(w: &Weights, path: &str, params: QuantParams, rows: usize, cols: usize) -> Result<Self> {
        // `params` are checked (config.rs); the row length comes from the config and must fit them.
        if cols % params.group_size as usize != 0 || (cols * params.bits as usize) % 32 != 0 {
            return Err(Error::tensor(format!("{path}.weight"), format!("rows of {cols} cannot be quantized in groups of {} at {} bits", params.group_size, params.bits)));
        }
        let packed = cols * params.bits as usize / 32;
        let groups = cols / params.group_size as usize;
        let mut scales = w.array_shaped(&format!("{path}.scales"), &[rows, groups])?;
        let mut biases = w.array_shaped(&format!("{path}.biases"), &[rows, groups])?;
        let half = (w.f32_matmuls() == F32Matmuls::All && scales.dtype() != Dtype::Float32).then(|| scales.dtype());
        if half.is_some() {
            scales = scales.as_dtype(Dtype::Float32)?;
            biases = biases.as_dtype(Dtype::Float32)?;
            mlx_rs::transforms::eval([&scales, &biases])?;
        }
        Ok(QuantWeight { weight: w.array_shaped(&format!("{path}.weight"), &[rows, packed])?, scales, biases, params, half })
    }

    /// `a` in the dtype the stored scales give outputs (as it is, unless they are held in f32).
    fn stored(&self, a: Array, like: &Array) -> Result<Array> {
        Ok(match self.half {
            Some(_) => a.as_dtype(like.dtype())?,
            None => a,
        })
    }

    fn matmul_t(&self, x: &Array) -> Result<Array> {
        let y = by_halves(self.weight.shape()[0], x, |r| {
            let (w, s, b) = (rows(&self.weight, &r), rows(&self.scales, &r), rows(&self.biases, &r));
            Ok(ops::quantized_matmul(x, &w, &s, &b, true, self.params.group_size, self.params.bits)?)
        })?;
        self.stored(y, x)
    }
}

/// `x` times a matrix of `out` rows (transposed), `part(None)` at once or `part(Some(rows))` for
/// some of them. On MLX's CPU backend, whose bf16/f16 and quantized matmul kernels run on one
/// core, the rows of a large enough matrix are split in two halves, the second computed on the
/// thread's second stream (another core), and the halves joined: each output element is computed
/// exactly as in one product (bit for bit, checked with mlx on SmolLM2's shapes for 1, 8 and 128
/// rows of x), 1.5-2x faster. Below SPLIT_MIN_ELEMENTS the second stream costs more than it
/// saves (192×576: 0.18 ms at once, 0.23 ms split). f32 products (BLAS, already threaded) and
/// Metal use one product.
fn by_halves(out: i32, x: &Array, part: impl Fn(Option<Range<i32>>) -> Result<Array>) -> Result<Array> {
    const SPLIT_MIN_ELEMENTS: i64 = 1 << 18;
    let inner = x.shape().last().copied().unwrap_or(0);
    if (out as i64) * (inner as i64) < SPLIT_MIN_ELEMENTS || !backend::is_cpu() {
        return part(None);
    }
    let h = out / 2;
    let first = part(Some(0..h))?;
    let second = backend::on_second_stream(|| part(Some(h..out)))?;
    Ok(ops::concatenate(&[&first, &second], -1)?)
}

/// Rows `r` of `a` (all of them for `None`).
fn rows(a: &Array, r: &Option<Range<i32>>) -> Array {
    match r {
        Some(r) => a.index(r.clone()),
        None => a.clone(),
    }
}

/// A dense matrix W [out, in] for `x · Wᵀ`.
pub enum Dense {
    /// As stored; MLX multiplies by its transposed view.
    Native(Array),
    /// Held transposed and contiguous, [in, out], in f32 (`f32Matmuls: 'all'`); `dtype` is the
    /// stored one, which activations keep. On MLX's CPU backend f32 matmuls go through BLAS,
    /// while bf16/f16 use MLX's own kernel, several times slower; BLAS may round this layout
    /// differently from the stored one, depending on the kernels it picks for the CPU.
    F32T { wt: Array, dtype: Dtype },
}

impl Dense {
    fn load(w: &Weights, name: &str, rows: usize, cols: usize) -> Result<Self> {
        let weight = w.array_shaped(name, &[rows, cols])?;
        let dtype = weight.dtype();
        if w.f32_matmuls() != F32Matmuls::All {
            return Ok(Dense::Native(weight));
        }
        let wt = weight.as_dtype(Dtype::Float32)?.t().contiguous()?;
        wt.eval()?;
        Ok(Dense::F32T { wt, dtype })
    }

    /// `x · Wᵀ (+ bias)`, in x's dtype.
    fn matmul_t(&self, x: &Array, bias: Option<&Array>) -> Result<Array> {
        match self {
            Dense::Native(w) => {
                let part = |r: Option<Range<i32>>| -> Result<Array> {
                    let w = rows(w, &r);
                    Ok(match bias {
                        Some(b) => ops::addmm(rows(b, &r), x, w.t(), None, None)?,
                        None => ops::matmul(x, w.t())?,
                    })
                };
                // f32 goes through BLAS, threaded already (`f32Matmuls: 'none'` keeps it here).
                if w.dtype() == Dtype::Float32 {
                    part(None)
                } else {
                    by_halves(w.shape()[0], x, part)
                }
            }
            Dense::F32T { wt, .. } => {
                let x32 = x.as_dtype(Dtype::Float32)?;
                let y = match bias {
                    Some(b) => ops::addmm(b.as_dtype(Dtype::Float32)?, &x32, wt, None, None)?,
                    None => ops::matmul(&x32, wt)?,
                };
                Ok(y.as_dtype(x.dtype())?)
            }
        }
    }

    /// Rows `ids` of W (an embedding lookup), in the stored dtype.
    fn rows(&self, ids: &Array) -> Result<Array> {
        match self {
            Dense::Native(w) => Ok(w.take_axis(ids, 0)?),
            Dense::F32T { wt, dtype } => {
                let mut shape = ids.shape().to_vec();
                shape.push(wt.shape()[0]);
                let cols = wt.take_axis(&ids.reshape(&[-1])?, 1)?;
                Ok(cols.t().reshape(&shape)?.as_dtype(*dtype)?)
            }
        }
    }
}

pub enum Linear {
    Dense { weight: Dense, bias: Option<Array> },
    Quantized { q: QuantWeight, bias: Option<Array> },
}

impl Linear {
    pub fn load(w: &Weights, cfg: &ModelConfig, path: &str, out_dim: usize, in_dim: usize, bias: bool) -> Result<Self> {
        let bias = if bias { Some(w.array_shaped(&format!("{path}.bias"), &[out_dim])?) } else { None };
        Ok(match quant_params(w, cfg, path)? {
            Some(p) => Linear::Quantized { q: QuantWeight::load(w, path, p, out_dim, in_dim)?, bias },
            None => Linear::Dense { weight: Dense::load(w, &format!("{path}.weight"), out_dim, in_dim)?, bias },
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Linear::Dense { weight, bias } => weight.matmul_t(x, bias.as_ref()),
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
    Dense(Dense),
    Quantized(QuantWeight),
}

impl Embedding {
    pub fn load(w: &Weights, cfg: &ModelConfig, path: &str, vocab: usize, dim: usize) -> Result<Self> {
        Ok(match quant_params(w, cfg, path)? {
            Some(p) => Embedding::Quantized(QuantWeight::load(w, path, p, vocab, dim)?),
            None => Embedding::Dense(Dense::load(w, &format!("{path}.weight"), vocab, dim)?),
        })
    }

    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match self {
            Embedding::Dense(weight) => weight.rows(ids),
            Embedding::Quantized(q) => {
                let rows = ops::dequantize(
                    q.weight.take_axis(ids, 0)?,
                    q.scales.take_axis(ids, 0)?,
                    &q.biases.take_axis(ids, 0)?,
                    q.params.group_size,
                    q.params.bits,
                )?;
                Ok(match q.half {
                    Some(dtype) => rows.as_dtype(dtype)?,
                    None => rows,
                })
            }
        }
    }

    /// The tied output projection: hidden states times the embedding matrix transposed.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        match self {
            Embedding::Dense(weight) => weight.matmul_t(x, None),
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

    /// Gemma's RMSNorm scales by (1 + weight); computed once, in the weight's dtype.
    pub fn load_offset(w: &Weights, path: &str, dim: usize, eps: f32) -> Result<Self> {
        let weight = w.array_shaped(&format!("{path}.weight"), &[dim])?;
        let weight = ops::add(&scalar(1.0, &weight)?, &weight)?;
        weight.eval()?;
        Ok(RmsNorm { weight, eps })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}

/// How the query/key/value projections are stored.
enum Qkv {
    Separate { q: Linear, k: Linear, v: Linear },
    /// Phi-3's single `qkv_proj`, split after the matmul.
    Fused(Linear),
}

/// The variations of attention across architectures.
pub struct AttentionSpec {
    pub head_dim: usize,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub fused_qkv: bool,
    /// RMSNorm over each head of q and k (Qwen3, Gemma 3; Gemma's is (1 + w)).
    pub qk_norm: Option<NormKind>,
    pub scale: f32,
    pub rope: Rope,
    /// Gemma 2 caps the attention scores at ± this (cap · tanh(s / cap)).
    pub softcap: Option<f32>,
}

impl AttentionSpec {
    /// Separate q/k/v projections without biases or norms, scores scaled by head_dim^-½.
    pub fn plain(head_dim: usize, rope: Rope) -> Self {
        AttentionSpec { head_dim, qkv_bias: false, o_bias: false, fused_qkv: false, qk_norm: None, scale: (head_dim as f32).powf(-0.5), rope, softcap: None }
    }
}

#[derive(Clone, Copy)]
pub enum NormKind {
    Plain,
    Offset,
    /// Plain, over all heads of the q or k projection at once, before the split (OLMo 2).
    Whole,
}

fn load_norm(kind: NormKind, w: &Weights, path: &str, dim: usize, eps: f32) -> Result<RmsNorm> {
    match kind {
        NormKind::Plain | NormKind::Whole => RmsNorm::load(w, path, dim, eps),
        NormKind::Offset => RmsNorm::load_offset(w, path, dim, eps),
    }
}

/// Multi-head attention with grouped KV heads, RoPE and a KV cache, through MLX's fused SDPA.
pub struct Attention {
    qkv: Qkv,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    /// The q/k norms apply to whole projections rather than to each head.
    qk_norm_whole: bool,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    scale: f32,
    rope: Rope,
    softcap: Option<f32>,
}

impl Attention {
    pub fn load(w: &Weights, cfg: &ModelConfig, path: &str, spec: AttentionSpec) -> Result<Self> {
        let (d, hd) = (cfg.hidden_size, spec.head_dim);
        let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        let qkv = if spec.fused_qkv {
            Qkv::Fused(Linear::load(w, cfg, &format!("{path}.qkv_proj"), (nh + 2 * nkv) * hd, d, spec.qkv_bias)?)
        } else {
            Qkv::Separate {
                q: Linear::load(w, cfg, &format!("{path}.q_proj"), nh * hd, d, spec.qkv_bias)?,
                k: Linear::load(w, cfg, &format!("{path}.k_proj"), nkv * hd, d, spec.qkv_bias)?,
                v: Linear::load(w, cfg, &format!("{path}.v_proj"), nkv * hd, d, spec.qkv_bias)?,
            }
        };
        let whole = matches!(spec.qk_norm, Some(NormKind::Whole));
        let norm = |name: &str, heads: usize| -> Result<Option<RmsNorm>> {
            let dim = if whole { heads * hd } else { hd };
            spec.qk_norm.map(|k| load_norm(k, w, &format!("{path}.{name}"), dim, cfg.rms_norm_eps)).transpose()
        };
        Ok(Attention {
            qkv,
            o_proj: Linear::load(w, cfg, &format!("{path}.o_proj"), d, nh * hd, spec.o_bias)?,
            q_norm: norm("q_norm", nh)?,
            k_norm: norm("k_norm", nkv)?,
            qk_norm_whole: whole,
            n_heads: nh as i32,
            n_kv_heads: nkv as i32,
            head_dim: hd as i32,
            scale: spec.scale,
            rope: spec.rope,
            softcap: spec.softcap,
        })
    }

    /// q, k, v for `x` [B, L, D] as [B, heads, L, head_dim], with the q/k norms applied.
    fn project(&self, x: &Array) -> Result<(Array, Array, Array)> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let (mut q, mut k, v) = match &self.qkv {
            Qkv::Separate { q, k, v } => (q.forward(x)?, k.forward(x)?, v.forward(x)?),
            Qkv::Fused(p) => {
                let qkv = p.forward(x)?;
                let qn = self.n_heads * self.head_dim;
                let kn = self.n_kv_heads * self.head_dim;
                (qkv.index((.., .., ..qn)), qkv.index((.., .., qn..qn + kn)), qkv.index((.., .., qn + kn..)))
            }
        };
        if let (Some(qn), Some(kn), true) = (&self.q_norm, &self.k_norm, self.qk_norm_whole) {
            q = qn.forward(&q)?;
            k = kn.forward(&k)?;
        }
        let split = |t: Array, heads: i32| -> Result<Array> { Ok(t.reshape(&[b, l, heads, -1])?.transpose_axes(&[0, 2, 1, 3])?) };
        let mut q = split(q, self.n_heads)?;
        let mut k = split(k, self.n_kv_heads)?;
        let v = split(v, self.n_kv_heads)?;
        if let (Some(qn), Some(kn), false) = (&self.q_norm, &self.k_norm, self.qk_norm_whole) {
            q = qn.forward(&q)?;
            k = kn.forward(&k)?;
        }
        Ok((q, k, v))
    }

    /// `project` for independent rows, q and k rotated at each row's own offset.
    fn project_rows(&self, x: &Array, offsets: &Array) -> Result<(Array, Array, Array)> {
        let (q, k, v) = self.project(x)?;
        Ok((self.rope.forward_rows(&q, offsets)?, self.rope.forward_rows(&k, offsets)?, v))
    }

    /// Cache update, then attention, for one sequence whose q and k carry their positions.
    fn attend(&self, q: &Array, k: Array, v: Array, mask: &Mask, cache: &mut LayerCache) -> Result<Array> {
        let (k, v) = cache.update_and_fetch(k, v)?;
        if self.softcap.is_some() {
            // Soft-capped scores need the keys themselves (mlx-lm has no quantized variant).
            let (Some(k), Some(v)) = (k.plain(), v.plain()) else {
                return Err(Error::UnsupportedOption { option: "kvBits".into(), reason: "quantized KV caches are not supported with soft-capped attention".into() });
            };
            return self.sdpa(q, k, v, mask.sdpa());
        }
        crate::cache::attention(q, &k, &v, self.scale, mask)
    }

    /// MLX's fused attention, or the explicit soft-capped one when scores are capped.
    fn sdpa(&self, q: &Array, k: &Array, v: &Array, mask: Option<ScaledDotProductAttentionMask>) -> Result<Array> {
        match self.softcap {
            Some(cap) => softcapped_attention(q, k, v, self.scale, cap, mask),
            None => Ok(fast::scaled_dot_product_attention(q, k, v, self.scale, mask, None)?),
        }
    }

    fn output(&self, o: &Array, b: i32, l: i32) -> Result<Array> {
        self.o_proj.forward(&o.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
    }

    /// Layer `layer` of one step: `x` [B, L, D] holds each row's new tokens, right-aligned (see
    /// `CacheView`); the keys and values go to the row caches, or to the stacked cache.
    pub fn forward(&self, x: &Array, cache: &mut CacheView, layer: usize, shape: &StepShape, sliding: bool) -> Result<Array> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let o = match (cache, shape) {
            (CacheView::Rows(rows), StepShape::Rows(step)) if b == 1 => {
                // One sequence: rotated at its offset and attending over its cache, as mlx-lm does.
                let (q, k, v) = self.project(x)?;
                let offset = step.offsets[0];
                let (q, k) = (self.rope.forward(&q, offset)?, self.rope.forward(&k, offset)?);
                self.attend(&q, k, v, step.mask(0, sliding), &mut rows[0][layer])?
            }
            (CacheView::Rows(rows), StepShape::Rows(step)) => {
                // Independent rows: projections batched, attention row by row on each row's cache.
                let (q, k, v) = self.project_rows(x, &step.rope_offsets(l))?;
                let outs = (0..b)
                    .zip(rows.iter_mut())
                    .map(|(i, cache)| {
                        let pad = l - step.counts[i as usize];
                        let row = |t: &Array| if pad == 0 { t.index(i..i + 1) } else { t.index((i..i + 1, .., pad.., ..)) };
                        let o = self.attend(&row(&q), row(&k), row(&v), step.mask(i as usize, sliding), &mut cache[layer])?;
                        pad_front(o, pad)
                    })
                    .collect::<Result<Vec<_>>>()?;
                ops::concatenate(&outs, 0)?
            }
            (CacheView::Stacked(stack), StepShape::Stacked(step)) => {
                let (q, k, v) = self.project_rows(x, &step.offsets)?;
                let (k, v) = stack.update_and_fetch(layer, k, v)?;
                self.attend_stacked(&q, &k, &v, step)?
            }
            _ => return Err(Error::Internal("a step's shape does not match its caches".into())),
        };
        self.output(&o, b, l)
    }

    /// Attention over a stacked cache after the step's write (`k`, `v`: every column in use).
    fn attend_stacked(&self, q: &Array, k: &Array, v: &Array, step: &StackedStep) -> Result<Array> {
        let spans = match &step.attention {
            StackedAttention::Batched(mask) => return self.sdpa(q, k, v, mask.sdpa()),
            StackedAttention::Rows(spans) => spans,
        };
        let (l, end) = (q.shape()[2], k.shape()[2]);
        let rows = spans
            .iter()
            .zip(0..)
            .map(|(s, i)| {
                let cols = |t: &Array| -> Result<Array> {
                    Ok(if s.pad == 0 {
                        t.index((i..i + 1, .., s.start..end, ..))
                    } else {
                        let before = t.index((i..i + 1, .., s.start..step.before, ..));
                        ops::concatenate(&[before, t.index((i..i + 1, .., step.before + s.pad..end, ..))], 2)?
                    })
                };
                let q = if s.pad == 0 { q.index(i..i + 1) } else { q.index((i..i + 1, .., s.pad.., ..)) };
                let mask = (l - s.pad > 1).then_some(ScaledDotProductAttentionMask::Causal);
                let o = self.sdpa(&q, &cols(k)?, &cols(v)?, mask)?;
                pad_front(o, s.pad)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ops::concatenate(&rows, 0)?)
    }
}

/// `o` [1, heads, n, dim] preceded by `pad` zero columns: a padded input position's output,
/// which nothing reads (zeros keep it finite for the layers after).
fn pad_front(o: Array, pad: i32) -> Result<Array> {
    if pad == 0 {
        return Ok(o);
    }
    let s = o.shape();
    let zeros = ops::zeros_dtype(&[s[0], s[1], pad, s[3]], o.dtype())?;
    Ok(ops::concatenate(&[zeros, o], 2)?)
}

#[derive(Clone, Copy)]
pub enum Activation {
    /// SwiGLU: silu(gate) · up.
    Silu,
    /// GeGLU with the tanh approximation (Gemma 2 and 3).
    GeluApprox,
    /// GeGLU with exact GELU (Gemma).
    Gelu,
}

enum GateUp {
    Separate { gate: Linear, up: Linear },
    /// Phi-3's single `gate_up_proj`.
    Fused(Linear),
}

/// Gated MLP: down(act(gate(x)) · up(x)).
pub struct Mlp {
    gate_up: GateUp,
    down_proj: Linear,
    activation: Activation,
}

impl Mlp {
    pub fn load(w: &Weights, cfg: &ModelConfig, path: &str, activation: Activation, fused: bool) -> Result<Self> {
        let (d, h, bias) = (cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias);
        let gate_up = if fused {
            GateUp::Fused(Linear::load(w, cfg, &format!("{path}.gate_up_proj"), 2 * h, d, bias)?)
        } else {
            GateUp::Separate {
                gate: Linear::load(w, cfg, &format!("{path}.gate_proj"), h, d, bias)?,
                up: Linear::load(w, cfg, &format!("{path}.up_proj"), h, d, bias)?,
            }
        };
        Ok(Mlp { gate_up, down_proj: Linear::load(w, cfg, &format!("{path}.down_proj"), d, h, bias)?, activation })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (gate, up) = match &self.gate_up {
            GateUp::Separate { gate, up } => (gate.forward(x)?, up.forward(x)?),
            GateUp::Fused(p) => {
                let gu = p.forward(x)?;
                let h = gu.shape()[gu.ndim() - 1] / 2;
                (gu.index((.., .., ..h)), gu.index((.., .., h..)))
            }
        };
        let hidden = match self.activation {
            Activation::Silu => swiglu(&gate, &up)?,
            Activation::GeluApprox => ops::multiply(&gelu_approx(&gate)?, &up)?,
            Activation::Gelu => ops::multiply(&gelu(&gate)?, &up)?,
        };
        self.down_proj.forward(&hidden)
    }
}

/// mlx-lm's compiled `swiglu`: silu(gate) · x in one fused kernel.
pub(super) fn swiglu(gate: &Array, x: &Array) -> Result<Array> {
    let f = |(g, x): (&Array, &Array)| -> std::result::Result<Array, Exception> { g.multiply(ops::sigmoid(g)?)?.multiply(x) };
    Ok(compile(f, true)((gate, x))?)
}

/// MLX's compiled `gelu_approx`, with scalars in the input's dtype like Python's weak floats.
fn gelu_approx(x: &Array) -> Result<Array> {
    let f = |x: &Array| -> std::result::Result<Array, Exception> {
        let c = |v: f32| Array::from_f32(v).as_dtype(x.dtype());
        let cube = ops::power(x, &c(3.0)?)?;
        let inner = ops::multiply(&c((2.0f64 / std::f64::consts::PI).sqrt() as f32)?, &ops::add(x, &ops::multiply(&c(0.044715)?, &cube)?)?)?;
        ops::multiply(&ops::multiply(&c(0.5)?, x)?, &ops::add(&c(1.0)?, &ops::tanh(&inner)?)?)
    };
    Ok(compile(f, true)(x)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::random;

    fn host(a: Array) -> Vec<f32> {
        let a = a.as_dtype(Dtype::Float32).unwrap();
        a.eval().unwrap();
        a.as_slice::<f32>().to_vec()
    }

    /// Split products are bit for bit the one product, bf16 and 4-bit alike (on Metal both
    /// sides are one product).
    #[test]
    fn products_by_halves_equal_one_product() {
        #[cfg(target_os = "linux")]
        assert!(backend::is_cpu(), "Linux builds use MLX's CPU backend, where products split");
        let w = random::normal::<f32>(&[1536, 576], None, None, None).unwrap();
        let x = random::normal::<f32>(&[8, 576], None, None, None).unwrap().as_dtype(Dtype::Bfloat16).unwrap();
        let bf16 = w.as_dtype(Dtype::Bfloat16).unwrap();
        let dense = |r: Option<Range<i32>>| -> Result<Array> { Ok(ops::matmul(&x, rows(&bf16, &r).t())?) };
        assert_eq!(host(by_halves(1536, &x, dense).unwrap()), host(dense(None).unwrap()));
        let (q, s, b) = ops::quantize(&bf16, 64, 4).unwrap();
        let quant = |r: Option<Range<i32>>| -> Result<Array> {
            Ok(ops::quantized_matmul(&x, rows(&q, &r), rows(&s, &r), &rows(&b, &r), true, 64, 4)?)
        };
        assert_eq!(host(by_halves(1536, &x, quant).unwrap()), host(quant(None).unwrap()));
    }

    /// Scales held in f32 (`f32Matmuls: 'all'`) keep the activations' dtype and come closer to
    /// the exact product than MLX's bf16 kernel does.
    #[test]
    fn quantized_products_with_f32_scales_keep_the_dtype_and_come_closer() {
        let f32 = Dtype::Float32;
        let w = random::normal::<f32>(&[1536, 576], None, None, None).unwrap().as_dtype(Dtype::Bfloat16).unwrap();
        let x = random::normal::<f32>(&[4, 576], None, None, None).unwrap().as_dtype(Dtype::Bfloat16).unwrap();
        let (q, s, b) = ops::quantize(&w, 64, 4).unwrap();
        let params = QuantParams { group_size: 64, bits: 4 };
        let stored = QuantWeight { weight: q.clone(), scales: s.clone(), biases: b.clone(), params, half: None };
        let (s32, b32) = (s.as_dtype(f32).unwrap(), b.as_dtype(f32).unwrap());
        let held = QuantWeight { weight: q.clone(), scales: s32.clone(), biases: b32.clone(), params, half: Some(Dtype::Bfloat16) };
        let exact = host(ops::matmul(&x.as_dtype(f32).unwrap(), ops::dequantize(&q, &s32, &b32, 64, 4).unwrap().t()).unwrap());
        let err = |y: Array| host(y).iter().zip(&exact).map(|(a, e)| (a - e).abs()).fold(0.0f32, f32::max);
        let fast = held.matmul_t(&x).unwrap();
        assert_eq!(fast.dtype(), Dtype::Bfloat16);
        let (fast, slow) = (err(fast), err(stored.matmul_t(&x).unwrap()));
        assert!(fast < slow, "f32 scales {fast}, bf16 kernel {slow}");
    }
}
