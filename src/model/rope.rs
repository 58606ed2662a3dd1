//! Rotary position embeddings: the RoPE variants of the supported architectures, applied to q and
//! k at one sequence's offset or at each row's own.
use std::cell::{OnceCell, RefCell};

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{fast, ops, Array, Dtype};

use super::config::{ModelConfig, RopeScaling};
use super::layers::scalar;
use crate::error::{Error, Result};
use crate::mlx::{backend, compiled, kernels};

/// Rotary position embedding: default, linear-scaled, Llama 3 or Phi-3 "su/longrope" frequencies,
/// over the first `dims` features of each head.
pub struct Rope {
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    freqs: Option<Array>,
    /// Phi-3's long-context attention scaling, applied to the rotated features first.
    input_scale: Option<f32>,
    /// The inverse frequencies MLX's CPU fallback computes in every call, computed once
    /// (`compiled`), and their bits (which name them in `ANGLES`).
    inv_freqs: OnceCell<(Array, Vec<u32>)>,
}

impl Rope {
    /// The RoPE `cfg` describes, with `base` overriding rope_theta (Gemma's local layers).
    pub fn new(cfg: &ModelConfig, dims: usize, base: Option<f32>) -> Result<Self> {
        let dims = dims as i32;
        let theta = base.unwrap_or(cfg.rope_theta);
        let plain = |scale| Rope { dims, traditional: cfg.rope_traditional, base: Some(theta), scale, freqs: None, input_scale: None, inv_freqs: OnceCell::new() };
        if base.is_some() {
            return Ok(plain(1.0));
        }
        Ok(match &cfg.rope_scaling {
            None => plain(1.0),
            Some(RopeScaling::Linear { factor }) => plain(1.0 / factor),
            Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => Rope {
                freqs: Some(llama3_freqs(dims, theta, *factor, *low_freq_factor, *high_freq_factor, *original_max_position_embeddings)?),
                base: None,
                ..plain(1.0)
            },
            Some(RopeScaling::SuScaled { long_factor, max_position_embeddings, original_max_position_embeddings }) => {
                let exps = ops::divide(&ops::arange::<_, f32>(0, dims, 2)?, Array::from_f32(dims as f32))?;
                let freqs = ops::multiply(
                    Array::from_slice(long_factor, &[long_factor.len() as i32]),
                    ops::power(Array::from_f32(theta), &exps)?,
                )?;
                freqs.eval()?;
                let factor = max_position_embeddings / original_max_position_embeddings;
                let mscale = if factor <= 1.0 {
                    1.0
                } else {
                    (1.0 + factor.ln() / original_max_position_embeddings.ln()).sqrt()
                };
                Rope { dims, traditional: false, base: None, scale: 1.0, freqs: Some(freqs), input_scale: Some(mscale), inv_freqs: OnceCell::new() }
            }
        })
    }

    /// Unscaled RoPE over `dims` features, whatever `rope_scaling` says (mlx-lm's `nn.RoPE`).
    pub fn plain(dims: usize, base: f32, traditional: bool) -> Self {
        Rope { dims: dims as i32, traditional, base: Some(base), scale: 1.0, freqs: None, input_scale: None, inv_freqs: OnceCell::new() }
    }

    /// Gemma 4's "proportional" RoPE: frequencies of a `dims`-wide rotation for the first
    /// `rotated` features, scaled by `factor`; the other features get infinite wavelengths (no
    /// rotation). Computed with MLX ops in mlx-lm's order so the values match bit for bit.
    pub fn proportional(dims: usize, rotated: usize, base: f32, factor: f32, traditional: bool) -> Result<Self> {
        let exps = ops::divide(&ops::arange::<_, f32>(0, rotated as i32, 2)?, Array::from_f32(dims as f32))?;
        let turning = ops::multiply(Array::from_f32(factor), &ops::power(Array::from_f32(base), &exps)?)?;
        let still = ops::full::<f32>(&[((dims - rotated) / 2) as i32], Array::from_f32(f32::INFINITY))?;
        let freqs = ops::concatenate(&[turning, still], 0)?;
        freqs.eval()?;
        Ok(Rope { dims: dims as i32, traditional, base: None, scale: 1.0, freqs: Some(freqs), input_scale: None, inv_freqs: OnceCell::new() })
    }

    /// No rotation (SmolLM3's NoPE layers see positions only through the causal mask).
    pub fn none() -> Self {
        Self::plain(0, 0.0, false)
    }

    pub fn forward(&self, x: &Array, offset: i32) -> Result<Array> {
        if self.dims == 0 {
            return Ok(x.clone());
        }
        let x = self.scale_input(x)?;
        if self.compiles(&x) {
            return self.compiled_at(&x, offset);
        }
        Ok(fast::rope(&x, self.dims, self.traditional, self.base, self.scale, offset, self.freqs.as_ref())?)
    }

    /// A batch whose row `i` starts at position `offsets[i]` ([B] int32), in one op. MLX gives
    /// each row exactly what `forward` gives it alone.
    pub fn forward_rows(&self, x: &Array, offsets: &Array) -> Result<Array> {
        if self.dims == 0 {
            return Ok(x.clone());
        }
        let x = self.scale_input(x)?;
        if self.compiles(&x) {
            return self.compiled(&x, offsets);
        }
        Ok(fast::rope_dynamic(&x, self.dims, self.traditional, self.base, self.scale, offsets, self.freqs.as_ref())?)
    }

    /// Whether `x` goes through `compiled`: on MLX's CPU backend (elsewhere RoPE is one kernel),
    /// [B, heads, 1, head_dim]: a decode step.
    fn compiles(&self, x: &Array) -> bool {
        backend::is_cpu() && x.ndim() == 4 && compiled::compiles(x)
    }

    /// RoPE as MLX's CPU fallback of `fast::rope` computes it (~25 nodes: positions, frequencies,
    /// sines and cosines, the rotation), with the rotation's elementwise nodes fused by a kept
    /// compiled function, shared by every layer. Each row at its own offset ([B] int32).
    fn compiled(&self, x: &Array, offsets: &Array) -> Result<Array> {
        let [cos, sin] = angles(offsets, &self.inv_freqs()?.0, &Array::from_f32(self.scale), 1, x.dtype())?;
        self.rotated(x, cos, sin)
    }

    /// `compiled` for one sequence at `offset`: every layer of a step rotates at the same
    /// positions, so the angles' cosines and sines are computed once a step (by the first layer)
    /// and the other layers only rotate (12 nodes fewer a layer on MLX's CPU backend). They are
    /// not compiled: once a step, their nodes cost little, and each fused kernel is C++ that MLX
    /// compiles with g++ on its first use on a machine (~0.8 s).
    fn compiled_at(&self, x: &Array, offset: i32) -> Result<Array> {
        let (inv_freqs, bits) = self.inv_freqs()?;
        let (scale, dtype) = (self.scale.to_bits(), x.dtype());
        let same = |k: &AnglesKey| k.inv_freqs == *bits && k.scale == scale && k.offset == offset && k.dtype == dtype;
        let known = ANGLES.with(|a| a.borrow().iter().find(|(k, _)| same(k)).map(|(_, v)| v.clone()));
        let [cos, sin] = match known {
            Some(v) => v,
            None => {
                let [cos, sin] = angles(&Array::from_int(offset), inv_freqs, &Array::from_f32(self.scale), 1, dtype)?;
                ANGLES.with(|a| {
                    let mut a = a.borrow_mut();
                    // A step's worth (a model may rotate with two kinds, as Gemma 3's local and
                    // global layers do); older steps' go.
                    if a.len() >= 8 {
                        a.clear();
                    }
                    a.push((AnglesKey { inv_freqs: bits.clone(), scale, offset, dtype }, [cos.clone(), sin.clone()]));
                });
                [cos, sin]
            }
        };
        self.rotated(x, cos, sin)
    }

    /// x rotated by the angles whose cosines and sines are given: by our kernel in one node where
    /// it runs, else through a kept compiled function (its elementwise nodes fused; every value an
    /// input). Both give the fallback's numbers.
    fn rotated(&self, x: &Array, cos: Array, sin: Array) -> Result<Array> {
        let (dims, traditional) = (self.dims, self.traditional);
        if kernels::affine_rows_fast() {
            return Ok(kernels::rope_rows(x, &cos, &sin, dims, traditional)?);
        }
        self.rotated_compiled(x, cos, sin)
    }

    fn rotated_compiled(&self, x: &Array, cos: Array, sin: Array) -> Result<Array> {
        let (dims, traditional) = (self.dims, self.traditional);
        let f = move |a: &[Array]| rotation(&a[0], &a[1], &a[2], dims, traditional);
        Ok(compiled::call1(("rope_rotation", [dims as u32, traditional as u32, 0, 0]), false, &[x.clone(), cos, sin], f)?)
    }

    /// The inverse frequencies (`fallback_inv_freqs`) and their bits, computed on first use.
    fn inv_freqs(&self) -> Result<&(Array, Vec<u32>)> {
        if self.inv_freqs.get().is_none() {
            let f = self.fallback_inv_freqs()?;
            f.eval()?;
            let bits = f.as_slice::<f32>().iter().map(|v| v.to_bits()).collect();
            let _ = self.inv_freqs.set((f, bits));
        }
        self.inv_freqs.get().ok_or_else(|| Error::Internal("RoPE frequencies were just computed".into()))
    }

    /// The inverse frequencies as MLX's fallback computes them: 1 / freqs, or
    /// exp(-i · (ln(base) / (dims/2))) with the factor rounded to f32 as C++'s `std::log(float)`
    /// and a float division give it.
    fn fallback_inv_freqs(&self) -> Result<Array> {
        let half = self.dims / 2;
        Ok(match (&self.freqs, self.base) {
            (Some(freqs), _) => freqs.reciprocal()?,
            (None, Some(base)) => {
                let factor = Array::from_f32(base.ln() / half as f32);
                ops::exp(ops::multiply(ops::arange::<_, f32>(0, -half, -1)?, factor)?)?
            }
            (None, None) => return Err(Error::Internal("a RoPE with neither a base nor frequencies".into())),
        })
    }

    fn scale_input(&self, x: &Array) -> Result<Array> {
        Ok(match self.input_scale {
            Some(s) => {
                let head = x.shape()[x.ndim() - 1];
                let scaled = ops::multiply(&x.index((.., .., .., ..self.dims)), &scalar(s, x)?)?;
                if self.dims < head {
                    ops::concatenate(&[scaled, x.index((.., .., .., self.dims..))], -1)?
                } else {
                    scaled
                }
            }
            None => x.clone(),
        })
    }
}

/// What a step's RoPE angles are computed from: the same key, the same values.
struct AnglesKey {
    inv_freqs: Vec<u32>,
    scale: u32,
    offset: i32,
    dtype: Dtype,
}

thread_local! {
    /// The cosines and sines of the angles the last layers rotated by (`Rope::compiled_at`).
    static ANGLES: RefCell<Vec<(AnglesKey, [Array; 2])>> = const { RefCell::new(Vec::new()) };
}

/// MLX's CPU fallback of `fast::rope` (mlx/fast.cpp), operation for operation, in two parts:
/// the cosines and sines of the angles of positions offset..offset+len (each row's own for
/// offsets [B]) in `dtype`, with `inv_freqs` computed before...
fn angles(offset: &Array, inv_freqs: &Array, scale: &Array, len: i32, dtype: Dtype) -> std::result::Result<[Array; 2], Exception> {
    let offset = if offset.size() > 1 { offset.expand_dims_axes(&[-1, -2])? } else { offset.clone() };
    let positions = ops::multiply(ops::add(ops::arange::<_, f32>(0, len, 1)?, &offset)?, scale)?;
    let theta = ops::multiply(positions.expand_dims(-1)?, inv_freqs)?;
    Ok([ops::cos(&theta)?.as_dtype(dtype)?, ops::sin(&theta)?.as_dtype(dtype)?])
}

/// ... and the rotation of x [B, heads, L, head_dim] by them, every value an input (MLX's compiler
/// prints constants into its kernels' source with 7 significant digits, which can change an f32).
fn rotation(x: &Array, cos: &Array, sin: &Array, dims: i32, traditional: bool) -> std::result::Result<Vec<Array>, Exception> {
    let shape = x.shape().to_vec();
    let (b, n, t, d) = (shape[0], shape[1], shape[2], shape[3]);
    let half = dims / 2;
    let rotate = |x1: &Array, x2: &Array| -> std::result::Result<[Array; 2], Exception> {
        Ok([ops::subtract(x1.multiply(cos)?, x2.multiply(sin)?)?, ops::add(x1.multiply(sin)?, x2.multiply(cos)?)?])
    };
    let rest = || x.index((.., .., .., dims..));
    let out = if traditional {
        let x1 = x.index((.., .., .., ops::indexing::StrideBy { inner: 0..dims, stride: 2 }));
        let x2 = x.index((.., .., .., ops::indexing::StrideBy { inner: 1..dims, stride: 2 }));
        let [a, c] = rotate(&x1, &x2)?;
        let out = ops::concatenate(&[a.expand_dims(-1)?, c.expand_dims(-1)?], -1)?.reshape(&[b, n, t, dims])?;
        if dims < d {
            ops::concatenate(&[out, rest()], -1)?
        } else {
            out
        }
    } else {
        let [a, c] = rotate(&x.index((.., .., .., ..half)), &x.index((.., .., .., half..dims)))?;
        let outs = if dims < d { vec![a, c, rest()] } else { vec![a, c] };
        ops::concatenate(&outs, -1)?
    };
    Ok(vec![out.reshape(&shape)?])
}

/// Llama 3 RoPE frequencies, computed with MLX ops in the same order as mlx-lm's Llama3RoPE so the
/// values match bit for bit.
fn llama3_freqs(dims: i32, base: f32, factor: f32, low: f32, high: f32, old_ctx: f32) -> Result<Array> {
    let low_wavelen = old_ctx / low;
    let high_wavelen = old_ctx / high;
    let exps = ops::divide(&ops::arange::<_, f32>(0, dims, 2)?, Array::from_f32(dims as f32))?;
    let freqs = ops::power(Array::from_f32(base), &exps)?;
    let wavelens = ops::multiply(Array::from_f32(2.0 * std::f32::consts::PI), &freqs)?;
    let freqs = ops::select(&wavelens.gt(Array::from_f32(low_wavelen))?, &ops::multiply(&freqs, Array::from_f32(factor))?, &freqs)?;
    let medium = ops::logical_and(&wavelens.gt(Array::from_f32(high_wavelen))?, &wavelens.lt(Array::from_f32(low_wavelen))?)?;
    let smooth = ops::divide(
        &ops::subtract(&ops::divide(Array::from_f32(old_ctx), &wavelens)?, Array::from_f32(low))?,
        Array::from_f32(high - low),
    )?;
    let denom = ops::add(&ops::divide(&ops::subtract(Array::from_f32(1.0), &smooth)?, Array::from_f32(factor))?, &smooth)?;
    let out = ops::select(&medium, &ops::divide(&freqs, &denom)?, &freqs)?;
    out.eval()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::{random, Dtype};

    /// How many values of `a` differ from `b`'s, bit for bit.
    fn differ(a: &Array, b: &Array) -> usize {
        let host = |a: &Array| {
            let a = a.as_dtype(Dtype::Float32).unwrap();
            a.eval().unwrap();
            a.as_slice::<f32>().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let (a, b) = (host(a), host(b));
        assert_eq!(a.len(), b.len());
        a.iter().zip(&b).filter(|(a, b)| a != b).count()
    }

    /// The kept compiled RoPE gives MLX's `fast::rope` bit for bit: plain, traditional, partial
    /// (fewer rotated features than the head has), with given frequencies and a scale, in f32,
    /// bf16 and f16, at one offset (with the step's angles computed, then kept) and at each row's
    /// own, for batches of decode steps.
    #[test]
    fn compiled_rope_equals_mlx_bit_for_bit() {
        assert!(backend::is_cpu(), "the compiled RoPE is the CPU backend's");
        let freqs = llama3_freqs(64, 500_000.0, 8.0, 1.0, 4.0, 8192.0).unwrap();
        let ropes = [
            Rope::plain(64, 100_000.0, false),
            Rope::plain(64, 10_000.0, true),
            Rope::plain(32, 1_000_000.0, false),
            Rope { scale: 0.25, ..Rope::plain(64, 10_000.0, false) },
            Rope { freqs: Some(freqs), base: None, ..Rope::plain(64, 0.0, false) },
        ];
        for (i, rope) in ropes.iter().enumerate() {
            for dtype in [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16] {
                for b in [1, 3, 16] {
                    let x = random::normal::<f32>(&[b, 4, 1, 64], None, None, None).unwrap().as_dtype(dtype).unwrap();
                    assert!(rope.compiles(&x));
                    for offset in [0, 7, 4095, 100_000] {
                        let mlx = fast::rope(&x, rope.dims, rope.traditional, rope.base, rope.scale, offset, rope.freqs.as_ref()).unwrap();
                        let ours = rope.compiled(&x, &Array::from_int(offset)).unwrap();
                        assert_eq!(differ(&ours, &mlx), 0, "rope {i} {dtype:?} [{b}, 4, 1] at {offset}");
                        // Angles computed, then taken from the step's cache.
                        for _ in 0..2 {
                            assert_eq!(differ(&rope.compiled_at(&x, offset).unwrap(), &mlx), 0, "rope {i} {dtype:?} [{b}, 4, 1] at {offset}, angles kept");
                        }
                    }
                    let offsets = Array::from_slice(&(0..b).map(|i| i * 4099 + 3).collect::<Vec<_>>(), &[b]);
                    let mlx = fast::rope_dynamic(&x, rope.dims, rope.traditional, rope.base, rope.scale, &offsets, rope.freqs.as_ref()).unwrap();
                    assert_eq!(differ(&rope.compiled(&x, &offsets).unwrap(), &mlx), 0, "rope {i} {dtype:?} rows");
                    // Both ways of rotating (our kernel where it runs, MLX's compiler elsewhere).
                    let [cos, sin] = angles(&offsets, &rope.inv_freqs().unwrap().0, &Array::from_f32(rope.scale), 1, dtype).unwrap();
                    assert_eq!(differ(&rope.rotated_compiled(&x, cos.clone(), sin.clone()).unwrap(), &mlx), 0, "rope {i} {dtype:?} rows, compiled");
                    if kernels::affine_rows_fast() {
                        assert_eq!(differ(&kernels::rope_rows(&x, &cos, &sin, rope.dims, rope.traditional).unwrap(), &mlx), 0, "rope {i} {dtype:?} rows, kernel");
                    }
                }
            }
        }
    }
}
