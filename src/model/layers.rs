//! Building blocks shared by every architecture: linear and embedding layers (dense or MLX affine
//! quantized), RMSNorm and gated MLPs (attention in attention.rs, RoPE in rope.rs). Scalars that
//! meet activations are cast to the activation dtype first, as Python's weak scalars are in
//! mlx-lm, so bf16 models stay bf16 and match it bit for bit.
use std::ops::Range;

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::compile::compile;
use mlx_rs::{fast, ops, Array, Dtype};

use super::blocks::gelu;
use super::config::{ModelConfig, QuantParams};
use super::weights::{F32Matmuls, Weights};
use crate::error::{Error, Result};
use crate::mlx::{backend, kernels};

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
    /// outputs are cast back to. With f32 scales a product runs in f32, one rounding per
    /// operation where a half-precision one has two (our CPU kernel: SmolLM2 4-bit bf16 decode
    /// 35 -> 54 tok/s; MLX's own, elsewhere, 7x (bf16) to 35x (f16) slower in half precision);
    /// outputs differ from mlx-lm's (closer to the f32 ones).
    half: Option<Dtype>,
    /// `f32Matmuls: 'all'` on MLX's CPU backend: products of many rows (prefill, big batched
    /// decode steps) dequantize the matrix to f32 and go through BLAS. Quantized kernels multiply
    /// row by row (576×1536, 4-bit, our kernel: 0.19 ms at 1 row, 1.3 ms at 16, 2.8 ms at 32;
    /// MLX's: 2 ms at 1 row, 100 ms at 128), while dequantizing and BLAS cost 1.5-2.6 ms from 1
    /// to 32 rows. Rounds differently from the quantized kernel.
    dequantize_rows: bool,
    /// Products go through our kernel (`kernels::affine_rows_matmul`): MLX's numbers, several
    /// times faster where MLX's CPU kernel is scalar (x86_64).
    rows_kernel: bool,
}

/// Rows of `x` from which a product dequantizes under `dequantize_rows`: where our kernel's
/// row-by-row cost passes the dequantization's (on SmolLM2's 576×1536 at 4 bits: 16 rows 1.3 ms
/// kernel, 2.6 ms dequantized; 32 rows 2.8 against 2.3). With MLX's kernel (no AVX2) it passes at
/// 4 rows (3.1 ms against 1.6).
const DEQUANTIZE_MIN_ROWS: i64 = 32;
const DEQUANTIZE_MIN_ROWS_MLX_KERNEL: i64 = 4;

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
        let dequantize_rows = w.f32_matmuls() == F32Matmuls::All && backend::is_cpu();
        let rows_kernel = matches!(params.bits, 2 | 4 | 8) && kernels::affine_rows_fast();
        Ok(QuantWeight { weight: w.array_shaped(&format!("{path}.weight"), &[rows, packed])?, scales, biases, params, half, dequantize_rows, rows_kernel })
    }

    /// `a` in the dtype the stored scales give outputs (as it is, unless they are held in f32).
    fn stored(&self, a: Array, like: &Array) -> Result<Array> {
        Ok(match self.half {
            Some(_) => a.as_dtype(like.dtype())?,
            None => a,
        })
    }

    fn matmul_t(&self, x: &Array) -> Result<Array> {
        let inner = x.shape().last().copied().unwrap_or(1).max(1) as i64;
        let min_rows = if self.rows_kernel { DEQUANTIZE_MIN_ROWS } else { DEQUANTIZE_MIN_ROWS_MLX_KERNEL };
        if self.dequantize_rows && x.size() as i64 / inner >= min_rows {
            let w = ops::dequantize(&self.weight, &self.scales, &self.biases, self.params.group_size, self.params.bits)?;
            let y = ops::matmul(&x.as_dtype(Dtype::Float32)?, &w.as_dtype(Dtype::Float32)?.t())?;
            return Ok(y.as_dtype(x.dtype())?);
        }
        let (group, bits) = (self.params.group_size, self.params.bits);
        let y = by_halves(self.weight.shape()[0], x, |r| {
            let (w, s, b) = (rows(&self.weight, &r), rows(&self.scales, &r), rows(&self.biases, &r));
            if self.rows_kernel {
                return Ok(kernels::affine_rows_matmul(x, &w, &s, &b, group, bits)?);
            }
            Ok(ops::quantized_matmul(x, &w, &s, &b, true, group, bits)?)
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

    /// An RMSNorm with this weight, computed elsewhere.
    pub fn from_weight(weight: Array, eps: f32) -> Self {
        RmsNorm { weight, eps }
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
        Self::load_sized(w, cfg, path, activation, fused, cfg.intermediate_size)
    }

    /// `load` with a hidden width other than the config's `intermediate_size`.
    pub fn load_sized(w: &Weights, cfg: &ModelConfig, path: &str, activation: Activation, fused: bool, h: usize) -> Result<Self> {
        let (d, bias) = (cfg.hidden_size, cfg.mlp_bias);
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
        self.down_proj.forward(&self.activation.gated(&gate, &up)?)
    }
}

impl Activation {
    /// act(gate) · x.
    pub fn gated(self, gate: &Array, x: &Array) -> Result<Array> {
        match self {
            Activation::Silu => swiglu(gate, x),
            Activation::GeluApprox => Ok(ops::multiply(&gelu_approx(gate)?, x)?),
            Activation::Gelu => Ok(ops::multiply(&gelu(gate)?, x)?),
        }
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
        let stored = QuantWeight { weight: q.clone(), scales: s.clone(), biases: b.clone(), params, half: None, dequantize_rows: false, rows_kernel: false };
        let (s32, b32) = (s.as_dtype(f32).unwrap(), b.as_dtype(f32).unwrap());
        let held = QuantWeight { weight: q.clone(), scales: s32.clone(), biases: b32.clone(), params, half: Some(Dtype::Bfloat16), dequantize_rows: false, rows_kernel: false };
        let exact = host(ops::matmul(&x.as_dtype(f32).unwrap(), ops::dequantize(&q, &s32, &b32, 64, 4).unwrap().t()).unwrap());
        let err = |y: Array| host(y).iter().zip(&exact).map(|(a, e)| (a - e).abs()).fold(0.0f32, f32::max);
        let fast = held.matmul_t(&x).unwrap();
        assert_eq!(fast.dtype(), Dtype::Bfloat16);
        let (fast, slow) = (err(fast), err(stored.matmul_t(&x).unwrap()));
        assert!(fast < slow, "f32 scales {fast}, bf16 kernel {slow}");
    }

    /// `f32Matmuls: 'all'` on the CPU: from `DEQUANTIZE_MIN_ROWS` rows (32 with our kernel, 4
    /// with MLX's) a product dequantizes and multiplies in f32 (BLAS), within f32 rounding of
    /// the quantized kernel's f32 product; fewer rows keep the quantized kernel bit for bit.
    #[test]
    fn many_rows_multiply_dequantized_under_f32_matmuls_all() {
        let w = random::normal::<f32>(&[1536, 576], None, None, None).unwrap();
        let (q, s, b) = ops::quantize(&w, 32, 4).unwrap();
        let params = QuantParams { group_size: 32, bits: 4 };
        let kernels = if kernels::affine_rows_fast() { vec![false, true] } else { vec![false] };
        for rows_kernel in kernels {
            let quantized = QuantWeight { weight: q.clone(), scales: s.clone(), biases: b.clone(), params, half: None, dequantize_rows: false, rows_kernel };
            let opt_in = QuantWeight { weight: q.clone(), scales: s.clone(), biases: b.clone(), params, half: None, dequantize_rows: true, rows_kernel };
            let (kept, dequantized) = if rows_kernel { ([1, 31], [32, 128]) } else { ([1, 3], [4, 128]) };
            for n in kept {
                let x = random::normal::<f32>(&[1, n, 576], None, None, None).unwrap();
                assert_eq!(host(opt_in.matmul_t(&x).unwrap()), host(quantized.matmul_t(&x).unwrap()), "{n} rows");
            }
            for n in dequantized {
                let x = random::normal::<f32>(&[1, n, 576], None, None, None).unwrap();
                let (a, e) = (host(opt_in.matmul_t(&x).unwrap()), host(quantized.matmul_t(&x).unwrap()));
                let diff = a.iter().zip(&e).map(|(a, e)| (a - e).abs()).fold(0.0f32, f32::max);
                assert!(diff < 1e-3, "{n} rows: {diff}");
                // Another kernel ran: 1536 sums of 576 products each, in another order.
                assert!(a != e, "{n} rows: the quantized kernel's own result");
            }
        }
    }

    /// Our CPU kernel for quantized products computes what MLX's computes, bit for bit, for
    /// every bit width, scale type and activation type it takes (f32, bf16 and f16 products, and
    /// mixed ones that promote to f32), for row counts not a multiple of its sixteen lanes and
    /// rows whose words are not a multiple of its eight-word loads, for a strided x, and for
    /// x with NaN, infinities and values whose products overflow (NaN written as MLX writes it).
    #[test]
    fn affine_rows_kernel_equals_mlx_bit_for_bit() {
        #[cfg(all(target_arch = "x86_64", not(target_os = "macos")))]
        assert!(
            kernels::affine_rows_fast() || !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c")),
            "an AVX2 + F16C CPU runs the vectorised kernel"
        );
        if !kernels::affine_rows_fast() {
            // Elsewhere MLX's kernel runs, and ours refuses to build a product.
            let (q, s, b) = ops::quantize(&random::normal::<f32>(&[16, 64], None, None, None).unwrap(), 32, 4).unwrap();
            let x = random::normal::<f32>(&[1, 64], None, None, None).unwrap();
            assert!(kernels::affine_rows_matmul(&x, &q, &s, &b, 32, 4).is_err());
            return;
        }
        let (f32, f16, bf16) = (Dtype::Float32, Dtype::Float16, Dtype::Bfloat16);
        let bits_of = |a: Array| -> Vec<u32> { host(a).iter().map(|v| v.to_bits()).collect() };
        for (bits, group, rows, cols) in [(4, 32, 1536, 576), (4, 64, 37, 320), (8, 32, 50, 96), (2, 32, 19, 160), (4, 128, 16, 256)] {
            let w = random::normal::<f32>(&[rows, cols], None, None, None).unwrap();
            for scale_type in [f32, f16, bf16] {
                let (q, s, b) = ops::quantize(&w.as_dtype(scale_type).unwrap(), group, bits).unwrap();
                let check = |x: Array| {
                    let ours = kernels::affine_rows_matmul(&x, &q, &s, &b, group, bits).unwrap();
                    let mlx = ops::quantized_matmul(&x, &q, &s, &b, true, group, bits).unwrap();
                    assert_eq!((ours.dtype(), ours.shape()), (mlx.dtype(), mlx.shape()));
                    let what = format!("{bits} bits, groups of {group}, {rows}x{cols}, {scale_type:?} scales, x {:?} {:?}", x.dtype(), x.shape());
                    assert!(bits_of(ours) == bits_of(mlx), "{what}");
                };
                for (shape, x_type, transposed) in [(vec![1, 1, cols], f32, false), (vec![2, 3, cols], f32, false), (vec![cols, 5], f32, true), (vec![1, 2, cols], f16, false), (vec![1, 3, cols], bf16, false), (vec![cols, 17], bf16, true)] {
                    let x = random::normal::<f32>(&shape, None, None, None).unwrap();
                    let x = if transposed { x.t() } else { x };
                    check(x.as_dtype(x_type).unwrap());
                }
                // One row with a NaN, one with infinities of both signs, one of values near the
                // largest f32 (their products overflow; inf - inf makes NaN mid-sum).
                let k = cols as usize;
                let mut v: Vec<f32> = (0..3 * k).map(|i| ((i * 37 % 11) as f32 - 5.0) / 3.0).collect();
                v[7] = f32::NAN;
                v[k + 3] = f32::INFINITY;
                v[k + 40] = f32::NEG_INFINITY;
                v[2 * k..].iter_mut().enumerate().for_each(|(i, a)| *a = if i % 2 == 0 { 3.0e38 } else { -3.0e38 });
                for x_type in [f32, f16, bf16] {
                    check(Array::from_slice(&v, &[3, cols]).as_dtype(x_type).unwrap());
                }
            }
        }
    }
}
