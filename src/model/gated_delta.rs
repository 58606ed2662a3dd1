//! The gated DeltaNet linear-attention layer of Qwen3.5 and Qwen3-Next (mlx-lm's
//! `GatedDeltaNet` and `gated_delta.py`, its ops path). Instead of attending over every earlier
//! position, each token updates a fixed-size state per value head, [value_dim, key_dim], by the
//! delta rule: the state decays by a learned gate, then moves towards storing the token's value
//! under its key (by `beta`); the token's output reads the state with its query. Queries, keys
//! and values first pass through a short causal depthwise convolution over the last `kernel`
//! tokens, so the cache (`RecurrentCache`) is that convolution's last inputs and the state.
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::compile::compile;
use mlx_rs::{fast, ops, Array, Dtype};

use super::config::ModelConfig;
use super::layers::{scalar, Linear, RmsNorm};
use super::weights::Weights;
use crate::cache::file::LayerShape;
use crate::cache::{CacheView, LayerCache, RecurrentCache, StepShape};
use crate::error::{Error, Result};
use crate::mlx::compiled;

/// How the input projections are stored. Qwen3.5 keeps them apart; Qwen3-Next fuses each pair
/// per key head; llama.cpp's Qwen3-Next files keep b and a fused but q, k, v and z apart.
enum Qkvz {
    /// q, k, v in one projection (the convolution's channels, in that order), z apart.
    Split { qkv: Linear, z: Linear },
    /// Per key head: its query, key, then the values and z of its value heads.
    Grouped(Linear),
}

enum Ba {
    Split { b: Linear, a: Linear },
    /// Per key head: b, then a, of its value heads.
    Grouped(Linear),
}

/// The sizes of a model's linear-attention layers, read and checked once.
#[derive(Clone, Copy)]
pub struct DeltaSizes {
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub kernel: usize,
}

impl DeltaSizes {
    pub fn read(cfg: &ModelConfig) -> Result<Self> {
        let need = |k: &str| cfg.usize_opt(k).filter(|&n| n > 0 && n <= 1 << 16).ok_or_else(|| Error::config(&cfg.source, format!("{} needs {k} (1 to 65536)", cfg.model_type)));
        let s = DeltaSizes {
            k_heads: need("linear_num_key_heads")?,
            v_heads: need("linear_num_value_heads")?,
            k_dim: need("linear_key_head_dim")?,
            v_dim: need("linear_value_head_dim")?,
            kernel: cfg.usize_opt("linear_conv_kernel_dim").unwrap_or(4),
        };
        if s.v_heads % s.k_heads != 0 {
            return Err(Error::config(&cfg.source, format!("linear_num_value_heads {} is not a multiple of linear_num_key_heads {}", s.v_heads, s.k_heads)));
        }
        if !(1..=64).contains(&s.kernel) {
            return Err(Error::config(&cfg.source, format!("linear_conv_kernel_dim {} is not 1 to 64", s.kernel)));
        }
        // Every size below becomes an MLX (i32) dimension.
        if s.conv_dim() + s.value_dim() > i32::MAX as usize || s.v_heads * s.v_dim * s.k_dim > i32::MAX as usize {
            return Err(Error::config(&cfg.source, "linear attention sizes too large".to_string()));
        }
        Ok(s)
    }

    fn key_dim(&self) -> usize {
        self.k_heads * self.k_dim
    }

    fn value_dim(&self) -> usize {
        self.v_heads * self.v_dim
    }

    /// Channels of the convolution: q, k and v side by side.
    fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
}

pub struct GatedDeltaNet {
    qkvz: Qkvz,
    ba: Ba,
    /// Depthwise, [channels, kernel, 1].
    conv: Array,
    dt_bias: Array,
    a_log: Array,
    /// RMSNorm of each head's output, then gated by silu(z).
    norm: RmsNorm,
    out_proj: Linear,
    s: DeltaSizes,
}

impl GatedDeltaNet {
    /// `<path>.*` (mlx-lm's names), each pair of input projections fused or apart as stored.
    pub fn load(w: &Weights, cfg: &ModelConfig, path: &str, s: DeltaSizes) -> Result<Self> {
        let (d, kd, vd) = (cfg.hidden_size, s.key_dim(), s.value_dim());
        let lin = |name: &str, out: usize, inp: usize| Linear::load(w, cfg, &format!("{path}.{name}"), out, inp, false);
        let stored = |name: &str| w.has(&format!("{path}.{name}.weight"));
        let qkvz = match stored("in_proj_qkvz") {
            true => Qkvz::Grouped(lin("in_proj_qkvz", 2 * kd + 2 * vd, d)?),
            false => Qkvz::Split { qkv: lin("in_proj_qkv", 2 * kd + vd, d)?, z: lin("in_proj_z", vd, d)? },
        };
        let ba = match stored("in_proj_ba") {
            true => Ba::Grouped(lin("in_proj_ba", 2 * s.v_heads, d)?),
            false => Ba::Split { b: lin("in_proj_b", s.v_heads, d)?, a: lin("in_proj_a", s.v_heads, d)? },
        };
        Ok(GatedDeltaNet {
            qkvz,
            ba,
            conv: conv_weight(w, &format!("{path}.conv1d.weight"), s.conv_dim(), s.kernel)?,
            dt_bias: w.array_shaped(&format!("{path}.dt_bias"), &[s.v_heads])?,
            a_log: w.array_shaped(&format!("{path}.A_log"), &[s.v_heads])?,
            norm: RmsNorm::load(w, &format!("{path}.norm"), s.v_dim, cfg.rms_norm_eps)?,
            out_proj: lin("out_proj", d, vd)?,
            s,
        })
    }

    /// The convolution's inputs (q, k, v) [B, S, channels], z [B, S, Hv, Dv], b and a [B, S, Hv].
    fn project(&self, x: &Array) -> Result<(Array, Array, Array, Array)> {
        let (b_, s_) = (x.shape()[0], x.shape()[1]);
        let DeltaSizes { k_heads: nk, v_heads: nv, k_dim: dk, v_dim: dv, .. } = self.s;
        let (nk, nv, dk, dv) = (nk as i32, nv as i32, dk as i32, dv as i32);
        let (qkv, z) = match &self.qkvz {
            Qkvz::Split { qkv, z } => (qkv.forward(x)?, z.forward(x)?),
            Qkvz::Grouped(qkvz) => {
                let per = nv / nk * dv;
                let m = qkvz.forward(x)?.reshape(&[b_, s_, nk, -1])?;
                let (q, k) = (m.index((.., .., .., ..dk)), m.index((.., .., .., dk..2 * dk)));
                let (v, z) = (m.index((.., .., .., 2 * dk..2 * dk + per)), m.index((.., .., .., 2 * dk + per..)));
                let flat = |t: &Array| t.reshape(&[b_, s_, -1]);
                (ops::concatenate(&[flat(&q)?, flat(&k)?, flat(&v)?], -1)?, z)
            }
        };
        let (b, a) = match &self.ba {
            Ba::Split { b, a } => (b.forward(x)?, a.forward(x)?),
            Ba::Grouped(ba) => {
                let ba = ba.forward(x)?.reshape(&[b_, s_, nk, -1])?;
                (ba.index((.., .., .., ..nv / nk)).reshape(&[b_, s_, nv])?, ba.index((.., .., .., nv / nk..)).reshape(&[b_, s_, nv])?)
            }
        };
        Ok((qkv, z.reshape(&[b_, s_, nv, dv])?, b, a))
    }

    /// What its cache holds.
    pub fn cache_shape(&self) -> LayerShape {
        LayerShape::Recurrent { conv: [self.s.kernel - 1, self.s.conv_dim()], state: [self.s.v_heads, self.s.v_dim, self.s.k_dim] }
    }

    /// The convolution and the delta rule for rows of S tokens each: `qkv` [B, S, channels], b
    /// and a [B, S, Hv], from each row's convolution inputs and state (`None`: zeros, a row's
    /// first step). Returns the outputs [B, S, Hv, Dv], the convolution inputs to keep and the
    /// states after the last token.
    fn mix(&self, qkv: Array, b: &Array, a: &Array, conv_state: Option<Array>, state: Option<Array>) -> Result<(Array, Array, Array)> {
        let (b_, s_) = (qkv.shape()[0], qkv.shape()[1]);
        let DeltaSizes { k_heads: nk, v_heads: nv, k_dim: dk, v_dim: dv, kernel } = self.s;
        let keep = kernel as i32 - 1;
        let conv_state = match conv_state {
            Some(c) => c,
            None => ops::zeros_dtype(&[b_, keep, self.s.conv_dim() as i32], qkv.dtype())?,
        };
        let conv_input = ops::concatenate(&[conv_state, qkv], 1)?;
        let total = conv_input.shape()[1];
        let new_conv = conv_input.index((.., total - keep.., ..)).contiguous()?;
        let conv_out = mlx_rs::nn::silu(ops::conv1d(&conv_input, &self.conv, 1, 0, 1, self.s.conv_dim() as i32)?)?;
        let (kd, nk, nv, dk, dv) = ((nk * dk) as i32, nk as i32, nv as i32, dk as i32, dv as i32);
        let q = conv_out.index((.., .., ..kd)).reshape(&[b_, s_, nk, dk])?;
        let k = conv_out.index((.., .., kd..2 * kd)).reshape(&[b_, s_, nk, dk])?;
        let v = conv_out.index((.., .., 2 * kd..)).reshape(&[b_, s_, nv, dv])?;
        let (q, k) = normalize_qk(&q, &k, dk as usize)?;
        let state = match state {
            Some(s) => s,
            None => ops::zeros_dtype(&[b_, nv, dv, dk], Dtype::Float32)?,
        };
        let (out, state) = gated_delta(&q, &k, &v, a, b, &self.a_log, &self.dt_bias, state)?;
        Ok((out, new_conv, state))
    }

    /// Layer `layer` of one step: `x` [B, L, D] holds each row's new tokens, right-aligned. The
    /// projections run for the whole batch; each row's convolution and delta rule run over its
    /// own tokens and state (the padding in front never reaches them): all rows at once when
    /// each feeds all L tokens (a decode step, rows prefilling together), row by row otherwise.
    pub fn forward(&self, x: &Array, cache: &mut CacheView, layer: usize, shape: &StepShape) -> Result<Array> {
        let (CacheView::Rows(rows), StepShape::Rows(step)) = (cache, shape) else {
            return Err(Error::Internal("linear-attention layers do not stack".into()));
        };
        let (b_, l) = (x.shape()[0], x.shape()[1]);
        let (qkv, z, b, a) = self.project(x)?;
        let mut caches = rows
            .iter_mut()
            .map(|row| match &mut row[layer] {
                LayerCache::Recurrent(c) => Ok(c),
                _ => Err(Error::Internal(format!("layer {layer} is linear attention but its cache is not recurrent"))),
            })
            .collect::<Result<Vec<&mut RecurrentCache>>>()?;
        let out = if step.counts.iter().all(|&n| n == l) {
            // One call over the stacked states.
            let stacked = |part: usize, like: &dyn Fn() -> Result<Array>| -> Result<Option<Array>> {
                if b_ == 1 {
                    return Ok(caches[0].get_part(part).cloned());
                }
                let each = caches.iter().map(|c| c.get_part(part).cloned().map_or_else(like, Ok)).collect::<Result<Vec<_>>>()?;
                Ok(Some(ops::concatenate(&each, 0)?))
            };
            let keep = self.s.kernel as i32 - 1;
            let conv = stacked(0, &|| Ok(ops::zeros_dtype(&[1, keep, self.s.conv_dim() as i32], x.dtype())?))?;
            let (nv, dv, dk) = (self.s.v_heads as i32, self.s.v_dim as i32, self.s.k_dim as i32);
            let state = stacked(1, &|| Ok(ops::zeros_dtype(&[1, nv, dv, dk], Dtype::Float32)?))?;
            let (out, conv, state) = self.mix(qkv, &b, &a, conv, state)?;
            for (i, c) in (0..).zip(caches.iter_mut()) {
                let row = |t: &Array| if b_ == 1 { t.clone() } else { t.index(i..i + 1) };
                c.set(row(&conv), row(&state), l as usize);
            }
            out
        } else {
            let mut outs = Vec::with_capacity(caches.len());
            for (i, c) in caches.iter_mut().enumerate() {
                let pad = l - step.counts[i];
                let i = i as i32;
                let row = |t: &Array| t.index((i..i + 1, pad..));
                let (out, conv, state) = self.mix(row(&qkv), &row(&b), &row(&a), c.get_part(0).cloned(), c.get_part(1).cloned())?;
                c.set(conv, state, (l - pad) as usize);
                outs.push(if pad == 0 {
                    out
                } else {
                    let s = out.shape();
                    ops::concatenate(&[ops::zeros_dtype(&[1, pad, s[2], s[3]], out.dtype())?, out], 1)?
                });
            }
            ops::concatenate(&outs, 0)?
        };
        // Padded positions hold zeros, which the norm keeps finite; nothing reads them.
        let out = precise_swiglu(&out, &z, &self.norm.forward(&out)?)?;
        self.out_proj.forward(&out.reshape(&[b_, l, -1])?)
    }
}

/// The depthwise convolution's weight as MLX wants it, [channels, kernel, 1]; a Hugging Face
/// checkpoint stores [channels, 1, kernel] (mlx-lm's sanitize moves the axis).
fn conv_weight(w: &Weights, name: &str, channels: usize, kernel: usize) -> Result<Array> {
    let t = w.get(name).ok_or_else(|| Error::tensor(name, "missing"))?;
    if t.shape == [channels, 1, kernel] && kernel != 1 {
        return Ok(w.array_shaped(name, &[channels, 1, kernel])?.swap_axes(1, 2)?);
    }
    w.array_shaped(name, &[channels, kernel, 1])
}

/// Whether the weights are a Hugging Face checkpoint's (convolutions not yet in MLX's layout),
/// whose RMSNorms scale by (1 + weight).
pub fn is_hf_layout(w: &Weights, conv_name: &str) -> bool {
    w.get(conv_name).is_some_and(|t| t.shape.last().is_some_and(|&k| k != 1))
}

/// mlx-lm's `normalize_qk`: q and k L2-normalised (through RMSNorm, its epsilon scaled to match),
/// q also scaled by key_dim^-½.
fn normalize_qk(q: &Array, k: &Array, dk: usize) -> Result<(Array, Array)> {
    let inv = (dk as f64).powf(-0.5);
    let eps = (1e-6 * inv * inv) as f32;
    let q = ops::multiply(&scalar((inv * inv) as f32, q)?, &fast::rms_norm(q, None, eps)?)?;
    let k = ops::multiply(&scalar(inv as f32, k)?, &fast::rms_norm(k, None, eps)?)?;
    Ok((q, k))
}

/// The delta rule over S tokens (mlx-lm's `gated_delta_update` on its ops path): q, k
/// [B, S, Hk, Dk], v [B, S, Hv, Dv], a and b [B, S, Hv], state [B, Hv, Dv, Dk] in f32. Returns
/// the outputs [B, S, Hv, Dv] and the state after the last token.
#[allow(clippy::too_many_arguments)]
fn gated_delta(q: &Array, k: &Array, v: &Array, a: &Array, b: &Array, a_log: &Array, dt_bias: &Array, mut state: Array) -> Result<(Array, Array)> {
    let beta = ops::sigmoid(b)?;
    let g = decay(a_log, a, dt_bias)?;
    let repeat = v.shape()[2] / q.shape()[2];
    let (q, k) = if repeat > 1 { (ops::repeat_axis::<f32>(q.clone(), repeat, -2)?, ops::repeat_axis::<f32>(k.clone(), repeat, -2)?) } else { (q.clone(), k.clone()) };
    let steps = q.shape()[1];
    let mut ys = Vec::with_capacity(steps as usize);
    let mut step = compile(delta_step, false);
    for t in 0..steps {
        let at = |x: &Array| x.index((.., t));
        let out = step(&[at(&q), at(&k), at(v), at(&g), at(&beta), state])?;
        let [y, s]: [Array; 2] = out.try_into().map_err(|_| Error::Internal("the delta step returns two arrays".into()))?;
        ys.push(y);
        state = s;
    }
    Ok((ops::stack(&ys, 1)?, state))
}

/// One token of the delta rule (mlx-lm's compiled `_gated_delta_step_ops`): q, k [B, H, Dk],
/// v [B, H, Dv], g and beta [B, H], state [B, H, Dv, Dk].
fn delta_step(args: &[Array]) -> std::result::Result<Vec<Array>, Exception> {
    let [q, k, v, g, beta, state] = args else { unreachable!("six arguments") };
    let state = ops::multiply(state, ops::expand_dims_axes(g, &[-1, -2])?)?;
    let k = ops::expand_dims(k, -2)?;
    let kv_mem = ops::sum_axis(&ops::multiply(&state, &k)?, -1, false)?;
    let delta = ops::multiply(&ops::subtract(v, &kv_mem)?, ops::expand_dims(beta, -1)?)?;
    let state = ops::add(&state, &ops::multiply(&k, ops::expand_dims(&delta, -1)?)?)?;
    let y = ops::sum_axis(&ops::multiply(&state, ops::expand_dims(q, -2)?)?, -1, false)?;
    Ok(vec![y.as_dtype(q.dtype())?, state])
}

/// Each token's state decay: exp(-exp(A_log) · softplus(a + dt_bias)) in f32 (mlx-lm's compiled
/// `compute_g`).
fn decay(a_log: &Array, a: &Array, dt_bias: &Array) -> Result<Array> {
    let f = |i: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
        let (a_log, a, dt_bias) = (&i[0], &i[1], &i[2]);
        let x = ops::add(a, dt_bias)?;
        let softplus = ops::logaddexp(&x, Array::from_f32(0.0).as_dtype(x.dtype())?)?;
        Ok(vec![ops::exp(ops::multiply(ops::negative(ops::exp(a_log.as_dtype(Dtype::Float32)?)?)?, softplus)?)?])
    };
    Ok(compiled::call1(("decay", [0; 4]), true, &[a_log.clone(), a.clone(), dt_bias.clone()], f)?)
}

/// silu(gate) · x computed in f32, in `h`'s dtype (mlx-lm's compiled `precise_swiglu`).
fn precise_swiglu(h: &Array, gate: &Array, x: &Array) -> Result<Array> {
    let f = |i: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
        let (h, gate, x) = (&i[0], &i[1], &i[2]);
        let g = gate.as_dtype(Dtype::Float32)?;
        Ok(vec![ops::multiply(ops::multiply(&g, ops::sigmoid(&g)?)?, x.as_dtype(Dtype::Float32)?)?.as_dtype(h.dtype())?])
    };
    Ok(compiled::call1(("precise_swiglu", [0; 4]), true, &[h.clone(), gate.clone(), x.clone()], f)?)
}
