//! Rotary position embeddings: the RoPE variants of the supported architectures, applied to q and
//! k at one sequence's offset or at each row's own.
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{fast, ops, Array};

use super::config::{ModelConfig, RopeScaling};
use super::layers::scalar;
use crate::error::Result;

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
}

impl Rope {
    /// The RoPE `cfg` describes, with `base` overriding rope_theta (Gemma's local layers).
    pub fn new(cfg: &ModelConfig, dims: usize, base: Option<f32>) -> Result<Self> {
        let dims = dims as i32;
        let theta = base.unwrap_or(cfg.rope_theta);
        let plain = |scale| Rope { dims, traditional: cfg.rope_traditional, base: Some(theta), scale, freqs: None, input_scale: None };
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
                Rope { dims, traditional: false, base: None, scale: 1.0, freqs: Some(freqs), input_scale: Some(mscale) }
            }
        })
    }

    /// Unscaled RoPE over `dims` features, whatever `rope_scaling` says (mlx-lm's `nn.RoPE`).
    pub fn plain(dims: usize, base: f32, traditional: bool) -> Self {
        Rope { dims: dims as i32, traditional, base: Some(base), scale: 1.0, freqs: None, input_scale: None }
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
        Ok(Rope { dims: dims as i32, traditional, base: None, scale: 1.0, freqs: Some(freqs), input_scale: None })
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
        Ok(fast::rope(&x, self.dims, self.traditional, self.base, self.scale, offset, self.freqs.as_ref())?)
    }

    /// A batch whose row `i` starts at position `offsets[i]` ([B] int32), in one op. MLX gives
    /// each row exactly what `forward` gives it alone.
    pub fn forward_rows(&self, x: &Array, offsets: &Array) -> Result<Array> {
        if self.dims == 0 {
            return Ok(x.clone());
        }
        let x = self.scale_input(x)?;
        Ok(fast::rope_dynamic(&x, self.dims, self.traditional, self.base, self.scale, offsets, self.freqs.as_ref())?)
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
