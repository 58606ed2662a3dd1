//! Multi-head attention as every architecture varies it: q/k/v projections (separate, fused,
//! keys doubling as values, or queries only over another layer's keys and values), q/k/v norms,
//! RoPE, soft-capped scores, and the KV cache of one step: one sequence, independent rows, or
//! rows stacked in one batch cache.
use mlx_rs::fast::ScaledDotProductAttentionMask;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{fast, ops, Array};

use super::blocks::softcapped_attention;
use super::config::ModelConfig;
use super::layers::{side_by_side, Linear, RmsNorm};
use super::rope::Rope;
use super::weights::Weights;
use crate::cache::file::LayerShape;
use crate::cache::{CacheView, Kv, LayerCache, Mask, StackedAttention, StackedStep, StepShape};
use crate::error::{Error, Result};
use crate::mlx::kernels;

/// How the query/key/value projections are stored.
enum Qkv {
    Separate { q: Linear, k: Linear, v: Linear },
    /// Phi-3's single `qkv_proj`, split after the matmul.
    Fused(Linear),
    /// The values are the keys as projected, before any norm (Gemma 4's full-attention layers).
    KeysAsValues { q: Linear, k: Linear },
    /// Queries only: the layer attends over another layer's keys and values (Gemma 4).
    QueryOnly(Linear),
}

/// Where a layer's keys and values come from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum KvSource {
    /// Its own k and v projections (or a fused qkv one).
    Projected,
    /// Its k projection, which also gives the values.
    KeysAsValues,
    /// An earlier layer's, as that layer attended over them this step: no projections, no cache.
    Borrowed,
}

/// The keys and values one layer attended over in a step, for layers that borrow them: the one
/// sequence's, each independent row's, or the stacked batch's.
pub enum StepKv {
    One(Kv, Kv),
    Rows(Vec<(Kv, Kv)>),
    Stacked(Array, Array),
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
    /// Query and KV heads when they differ from the config's (Gemma 4's full layers).
    pub heads: Option<(usize, usize)>,
    pub kv: KvSource,
    /// RMSNorm without a weight over each value head (Gemma 4).
    pub v_norm: bool,
    /// The q projection is twice as wide: each head's queries, then a gate whose sigmoid scales
    /// that head's output before the output projection (Qwen3.5, Qwen3-Next).
    pub output_gate: bool,
}

impl AttentionSpec {
    /// Separate q/k/v projections without biases or norms, scores scaled by head_dim^-½.
    pub fn plain(head_dim: usize, rope: Rope) -> Self {
        AttentionSpec {
            head_dim,
            qkv_bias: false,
            o_bias: false,
            fused_qkv: false,
            qk_norm: None,
            scale: (head_dim as f32).powf(-0.5),
            rope,
            softcap: None,
            heads: None,
            kv: KvSource::Projected,
            v_norm: false,
            output_gate: false,
        }
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
    /// Norm epsilon of the weightless value norm, when there is one.
    v_norm: Option<f32>,
    output_gate: bool,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    scale: f32,
    rope: Rope,
    softcap: Option<f32>,
    /// Under the opt-in `f32Matmuls: 'all'`, where the CPU has our FMA kernels: a decode step's
    /// attention products in fused multiply-adds (`cache::attention`).
    factored: bool,
}

impl Attention {
    pub fn load(w: &Weights, cfg: &ModelConfig, path: &str, spec: AttentionSpec) -> Result<Self> {
        let (d, hd) = (cfg.hidden_size, spec.head_dim);
        let (nh, nkv) = spec.heads.unwrap_or((cfg.num_attention_heads, cfg.num_key_value_heads));
        let proj = |name: &str, heads: usize| Linear::load(w, cfg, &format!("{path}.{name}"), heads * hd, d, spec.qkv_bias);
        let q_heads = if spec.output_gate { 2 * nh } else { nh };
        if spec.output_gate && (spec.fused_qkv || spec.kv != KvSource::Projected) {
            return Err(Error::Internal("gated attention outputs need separate q/k/v projections".into()));
        }
        let qkv = match spec.kv {
            KvSource::Projected if spec.fused_qkv => Qkv::Fused(Linear::load(w, cfg, &format!("{path}.qkv_proj"), (nh + 2 * nkv) * hd, d, spec.qkv_bias)?),
            KvSource::Projected => Qkv::Separate { q: proj("q_proj", q_heads)?, k: proj("k_proj", nkv)?, v: proj("v_proj", nkv)? },
            KvSource::KeysAsValues => Qkv::KeysAsValues { q: proj("q_proj", nh)?, k: proj("k_proj", nkv)? },
            KvSource::Borrowed => Qkv::QueryOnly(proj("q_proj", nh)?),
        };
        let whole = matches!(spec.qk_norm, Some(NormKind::Whole));
        let norm = |name: &str, heads: usize| -> Result<Option<RmsNorm>> {
            let dim = if whole { heads * hd } else { hd };
            spec.qk_norm.map(|k| load_norm(k, w, &format!("{path}.{name}"), dim, cfg.rms_norm_eps)).transpose()
        };
        let borrowed = spec.kv == KvSource::Borrowed;
        Ok(Attention {
            qkv,
            o_proj: Linear::load(w, cfg, &format!("{path}.o_proj"), d, nh * hd, spec.o_bias)?,
            q_norm: norm("q_norm", nh)?,
            k_norm: if borrowed { None } else { norm("k_norm", nkv)? },
            qk_norm_whole: whole,
            v_norm: spec.v_norm.then_some(cfg.rms_norm_eps),
            output_gate: spec.output_gate,
            n_heads: nh as i32,
            n_kv_heads: nkv as i32,
            head_dim: hd as i32,
            scale: spec.scale,
            rope: spec.rope,
            softcap: spec.softcap,
            factored: w.f32_matmuls().in_f32() && kernels::fma_kernels(),
        })
    }

    /// What its cache holds.
    pub fn cache_shape(&self) -> LayerShape {
        LayerShape::Kv { kv_heads: self.n_kv_heads as usize, head_dim: self.head_dim as usize }
    }

    /// q, k, v for `x` [B, L, D] as [B, heads, L, head_dim], with the q/k norms applied, and
    /// the output gate [B, L, heads · head_dim] when the layer has one.
    fn project(&self, x: &Array) -> Result<(Array, Array, Array, Option<Array>)> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let (mut q, mut k, v) = match &self.qkv {
            Qkv::Separate { q, k, v } => {
                let [q, k, v]: [Array; 3] = side_by_side(&[q], &[k, v], x)?.try_into().map_err(|_| Error::Internal("three products".into()))?;
                (q, k, v)
            }
            Qkv::Fused(p) => {
                let qkv = p.forward(x)?;
                let qn = self.n_heads * self.head_dim;
                let kn = self.n_kv_heads * self.head_dim;
                (qkv.index((.., .., ..qn)), qkv.index((.., .., qn..qn + kn)), qkv.index((.., .., qn + kn..)))
            }
            Qkv::KeysAsValues { q, k } => {
                let k = k.forward(x)?;
                (q.forward(x)?, k.clone(), k)
            }
            Qkv::QueryOnly(_) => return Err(Error::Internal("a layer without keys was asked to project them".into())),
        };
        let gate = if self.output_gate {
            let (nh, hd) = (self.n_heads, self.head_dim);
            let both = q.reshape(&[b, l, nh, 2 * hd])?;
            q = both.index((.., .., .., ..hd)).reshape(&[b, l, nh * hd])?;
            Some(both.index((.., .., .., hd..)).reshape(&[b, l, nh * hd])?)
        } else {
            None
        };
        if let (Some(qn), Some(kn), true) = (&self.q_norm, &self.k_norm, self.qk_norm_whole) {
            q = qn.forward(&q)?;
            k = kn.forward(&k)?;
        }
        let split = |t: Array, heads: i32| heads_first(&t, b, l, heads);
        let mut q = split(q, self.n_heads)?;
        let mut k = split(k, self.n_kv_heads)?;
        let mut v = split(v, self.n_kv_heads)?;
        if let (Some(qn), Some(kn), false) = (&self.q_norm, &self.k_norm, self.qk_norm_whole) {
            q = qn.forward(&q)?;
            k = kn.forward(&k)?;
        }
        if let Some(eps) = self.v_norm {
            v = fast::rms_norm(&v, None, eps)?;
        }
        Ok((q, k, v, gate))
    }

    /// The queries alone, [B, heads, L, head_dim], normed (a layer that borrows keys and values).
    fn project_queries(&self, x: &Array) -> Result<Array> {
        let Qkv::QueryOnly(q) = &self.qkv else {
            return Err(Error::Internal("a layer with its own keys was asked for queries alone".into()));
        };
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let q = heads_first(&q.forward(x)?, b, l, self.n_heads)?;
        match &self.q_norm {
            Some(n) => n.forward(&q),
            None => Ok(q),
        }
    }

    /// `project` for independent rows, q and k rotated at each row's own offset.
    fn project_rows(&self, x: &Array, offsets: &Array) -> Result<(Array, Array, Array, Option<Array>)> {
        let (q, k, v, gate) = self.project(x)?;
        Ok((self.rope.forward_rows(&q, offsets)?, self.rope.forward_rows(&k, offsets)?, v, gate))
    }

    /// Cache update, then attention, for one sequence whose q and k carry their positions.
    fn attend(&self, q: &Array, k: Array, v: Array, mask: &Mask, cache: &mut LayerCache) -> Result<(Array, (Kv, Kv))> {
        let (k, v) = cache.update_and_fetch(k, v)?;
        Ok((self.attend_fetched(q, &k, &v, mask)?, (k, v)))
    }

    /// Attention over keys and values already in a cache.
    fn attend_fetched(&self, q: &Array, k: &Kv, v: &Kv, mask: &Mask) -> Result<Array> {
        if self.softcap.is_some() {
            // Soft-capped scores need the keys themselves (mlx-lm has no quantized variant).
            let (Some(k), Some(v)) = (k.plain(), v.plain()) else {
                return Err(Error::UnsupportedOption { option: "kvBits".into(), reason: "quantized KV caches are not supported with soft-capped attention".into() });
            };
            return self.sdpa(q, k, v, mask.sdpa());
        }
        crate::cache::attention(q, k, v, self.scale, mask, self.factored)
    }

    /// MLX's fused attention, or the explicit soft-capped one when scores are capped.
    fn sdpa(&self, q: &Array, k: &Array, v: &Array, mask: Option<ScaledDotProductAttentionMask>) -> Result<Array> {
        match self.softcap {
            Some(cap) => softcapped_attention(q, k, v, self.scale, cap, mask),
            None => Ok(fast::scaled_dot_product_attention(q, k, v, self.scale, mask, None)?),
        }
    }

    fn output(&self, o: &Array, b: i32, l: i32, gate: Option<Array>) -> Result<Array> {
        // One position: [B, heads, 1, dim] holds its values in [B, 1, heads · dim]'s order.
        let o = if l == 1 { o.reshape(&[b, 1, -1])? } else { o.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])? };
        match gate {
            Some(g) => self.o_proj.forward(&ops::multiply(&o, &ops::sigmoid(&g)?)?),
            None => self.o_proj.forward(&o),
        }
    }

    /// Layer `layer` of one step: `x` [B, L, D] holds each row's new tokens, right-aligned (see
    /// `CacheView`); the keys and values go to the row caches, or to the stacked cache.
    pub fn forward(&self, x: &Array, cache: &mut CacheView, layer: usize, shape: &StepShape, sliding: bool) -> Result<Array> {
        Ok(self.forward_kv(x, cache, layer, shape, sliding, None)?.0)
    }

    /// `forward`, also returning the keys and values attended over, for layers that borrow
    /// them. With `borrowed`, the layer attends over those instead of its own (its cache slot
    /// `layer` is not touched) and returns none.
    pub fn forward_kv(&self, x: &Array, cache: &mut CacheView, layer: usize, shape: &StepShape, sliding: bool, borrowed: Option<&StepKv>) -> Result<(Array, Option<StepKv>)> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let mut gate = None;
        let (o, kv) = match (cache, shape, borrowed) {
            (CacheView::Rows(_), StepShape::Rows(step), Some(StepKv::One(k, v))) => {
                let q = self.rope.forward(&self.project_queries(x)?, step.offsets[0])?;
                (self.attend_fetched(&q, k, v, step.mask(0, sliding))?, None)
            }
            (CacheView::Rows(rows), StepShape::Rows(step), None) if b == 1 => {
                // One sequence: rotated at its offset and attending over its cache, as mlx-lm does.
                let (q, k, v, g) = self.project(x)?;
                gate = g;
                let offset = step.offsets[0];
                let (q, k) = (self.rope.forward(&q, offset)?, self.rope.forward(&k, offset)?);
                let (o, (k, v)) = self.attend(&q, k, v, step.mask(0, sliding), &mut rows[0][layer])?;
                (o, Some(StepKv::One(k, v)))
            }
            (CacheView::Rows(rows), StepShape::Rows(step), borrowed) => {
                // Independent rows: projections batched, attention row by row on each row's cache.
                let offsets = step.rope_offsets(l);
                let (q, k, v) = match borrowed {
                    None => {
                        let (q, k, v, g) = self.project_rows(x, &offsets)?;
                        gate = g;
                        (q, Some(k), Some(v))
                    }
                    Some(_) => (self.rope.forward_rows(&self.project_queries(x)?, &offsets)?, None, None),
                };
                let mut kept = Vec::with_capacity(b as usize);
                let mut outs = Vec::with_capacity(b as usize);
                for (i, cache) in (0..b).zip(rows.iter_mut()) {
                    let pad = l - step.counts[i as usize];
                    let row = |t: &Array| if pad == 0 { t.index(i..i + 1) } else { t.index((i..i + 1, .., pad.., ..)) };
                    let mask = step.mask(i as usize, sliding);
                    let o = match (borrowed, &k, &v) {
                        (Some(StepKv::Rows(kv)), _, _) => {
                            let (k, v) = &kv[i as usize];
                            self.attend_fetched(&row(&q), k, v, mask)?
                        }
                        (None, Some(k), Some(v)) => {
                            let (o, kv) = self.attend(&row(&q), row(k), row(v), mask, &mut cache[layer])?;
                            kept.push(kv);
                            o
                        }
                        _ => return Err(Error::Internal("borrowed keys and values do not match the step's rows".into())),
                    };
                    outs.push(pad_front(o, pad)?);
                }
                (ops::concatenate(&outs, 0)?, borrowed.is_none().then_some(StepKv::Rows(kept)))
            }
            (CacheView::Stacked(_), StepShape::Stacked(step), Some(StepKv::Stacked(k, v))) => {
                let q = self.rope.forward_rows(&self.project_queries(x)?, &step.offsets)?;
                (self.attend_stacked(&q, k, v, step)?, None)
            }
            (CacheView::Stacked(stack), StepShape::Stacked(step), None) => {
                let (q, k, v, g) = self.project_rows(x, &step.offsets)?;
                gate = g;
                let (k, v) = stack.update_and_fetch(layer, k, v)?;
                (self.attend_stacked(&q, &k, &v, step)?, Some(StepKv::Stacked(k, v)))
            }
            _ => return Err(Error::Internal("a step's shape does not match its caches".into())),
        };
        Ok((self.output(&o, b, l, gate)?, kv))
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
/// `t` [B, L, heads · dim] as [B, heads, L, dim]. One position (decode steps) is one reshape:
/// with L = 1 the transposition moves nothing, and on MLX's CPU backend each node of a step's graph
/// costs microseconds whatever its size.
fn heads_first(t: &Array, b: i32, l: i32, heads: i32) -> Result<Array> {
    Ok(if l == 1 { t.reshape(&[b, heads, 1, -1])? } else { t.reshape(&[b, l, heads, -1])?.transpose_axes(&[0, 2, 1, 3])? })
}

fn pad_front(o: Array, pad: i32) -> Result<Array> {
    if pad == 0 {
        return Ok(o);
    }
    let s = o.shape();
    let zeros = ops::zeros_dtype(&[s[0], s[1], pad, s[3]], o.dtype())?;
    Ok(ops::concatenate(&[zeros, o], 2)?)
}
