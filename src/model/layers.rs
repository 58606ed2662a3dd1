//! Building blocks shared by every architecture: linear and embedding layers (dense or MLX affine
//! quantized), RMSNorm and gated MLPs (attention in attention.rs, RoPE in rope.rs). Scalars that
//! meet activations are cast to the activation dtype first, as Python's weak scalars are in
//! mlx-lm, so bf16 models stay bf16 and match it bit for bit.
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{fast, ops, Array, Dtype};

use super::blocks::gelu;
use super::config::{ModelConfig, QuantParams};
use super::weights::{F32Matmuls, Weights};
use crate::error::{Error, Result};
use crate::mlx::kernels::{self, AffineForm};
use crate::mlx::{backend, compiled};

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
    /// The stored dtype of half-precision scales whose products run in f32 (`f32Matmuls: 'all'`),
    /// which the outputs are cast back to: one rounding per operation where a half-precision
    /// product has two (our CPU kernel: SmolLM2 4-bit bf16 decode 35 -> 54 tok/s; MLX's own,
    /// elsewhere, 7x (bf16) to 35x (f16) slower in half precision); outputs differ from mlx-lm's
    /// (closer to the f32 ones). The scales are held in f32 unless `form` is our kernel's
    /// factored or int8 one.
    half: Option<Dtype>,
    /// `f32Matmuls: 'all'` on MLX's CPU backend where its kernel runs (not ours): products of
    /// several rows (prefill, batched decode steps) dequantize the matrix to f32 and go through
    /// BLAS. MLX's kernel multiplies row by row (576×1536, 4-bit: 2 ms at 1 row, 100 ms at 128),
    /// while dequantizing and BLAS cost 1.5-2.6 ms from 1 to 32 rows. Rounds differently from
    /// the quantized kernel.
    dequantize_rows: bool,
    /// Products go through our kernel (`kernels::affine_rows_matmul`): MLX's numbers, several
    /// times faster where MLX's CPU kernel is scalar (x86_64).
    rows_kernel: bool,
    /// `f32Matmuls: 'all'` where our kernel's FMA form runs (`AffineForm::Factored`): every
    /// product in f32, those of fewer than `FACTORED_MAX_ROWS` rows in the factored form, not
    /// MLX's roundings (SmolLM2 Q4_0 GGUF decode 37 -> 50 tok/s). `f32Matmuls: 'int8'` there, for
    /// a matrix the int8 form takes (`kernels::int8_fits`; else as 'all'): every product in that
    /// form (`AffineForm::Int8`), x rounded to 8 bits (SmolLM2 Q4_1 GGUF on an AMD EPYC, decode
    /// 44 -> 59 tok/s, a 128-token prefill 114 -> 177). Both forms convert half-precision scales
    /// to f32 exactly as they read them, so they are held as stored, and f32 ones in f16 where
    /// every value is an f16 exactly (GGUF's Q8_0, Q5_0 and Q4_0 scales are, and their biases
    /// -128, -16 and -8 times them): a
    /// decode step reads 17 % fewer bytes of a 4-bit matrix, 10 % of an 8-bit one, with the same
    /// numbers.
    form: AffineForm,
    /// `[weight, scales, biases]` of each half of the rows where products split (`split_at`).
    halves: Option<[[Array; 3]; 2]>,
}

/// Rows of `x` from which a product dequantizes under `dequantize_rows`: where MLX's row-by-row
/// kernel's cost passes the dequantization's (3.1 ms against 1.6 at 4 rows).
const DEQUANTIZE_MIN_ROWS: i64 = 4;

/// Rows of `x` from which a factored product runs in MLX's order instead (f32, the as-stored
/// numbers): our kernel dequantizes W's rows once for all rows of x there, while the factored
/// form reads each row of W once per row of x. 32 keeps a decode step of up to 31 rows in the
/// factored form, each row computed as alone; a 128-token prompt prefills faster in MLX's order
/// than through dequantization and BLAS (BENCHMARKS.md). The int8 form, its products a half to a
/// third of the factored form's cost, runs at every size: a 128-token prefill 1.55x faster than
/// in MLX's order.
const FACTORED_MAX_ROWS: i64 = 32;

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
        let all = w.f32_matmuls().in_f32();
        let rows_kernel = matches!(params.bits, 2 | 4 | 8) && kernels::affine_rows_fast();
        let factored = all && rows_kernel && kernels::fma_kernels();
        let form = match w.f32_matmuls() {
            F32Matmuls::Int8 if factored && i32::try_from(cols).is_ok_and(|k| kernels::int8_fits(params.bits, params.group_size, k)) => AffineForm::Int8,
            _ if factored => AffineForm::Factored,
            _ => AffineForm::Mlx,
        };
        let half = (all && scales.dtype() != Dtype::Float32).then(|| scales.dtype());
        if half.is_some() && !factored {
            scales = scales.as_dtype(Dtype::Float32)?;
            biases = biases.as_dtype(Dtype::Float32)?;
            mlx_rs::transforms::eval([&scales, &biases])?;
        } else if factored && half.is_none() {
            (scales, biases) = f16_if_exact(scales, biases)?;
        }
        let dequantize_rows = all && backend::is_cpu() && !rows_kernel;
        let weight = w.array_shaped(&format!("{path}.weight"), &[rows, packed])?;
        let halves = match split_at(rows, cols) {
            Some(h) if !rows_kernel => {
                let [w0, w1] = halves(&weight, h)?;
                let [s0, s1] = halves(&scales, h)?;
                let [b0, b1] = halves(&biases, h)?;
                Some([[w0, s0, b0], [w1, s1, b1]])
            }
            _ => None,
        };
        Ok(QuantWeight { weight, scales, biases, params, half, dequantize_rows, rows_kernel, form, halves })
    }

    /// `a` in the dtype the stored scales give outputs (as it is, unless they are held in f32).
    fn stored(&self, a: Array, like: &Array) -> Result<Array> {
        Ok(match self.half {
            Some(_) => a.as_dtype(like.dtype())?,
            None => a,
        })
    }

    /// Whether a product with `x` dequantizes and goes through BLAS (`dequantize_rows`).
    fn dequantizes(&self, x: &Array) -> bool {
        self.dequantize_rows && rows(x) >= DEQUANTIZE_MIN_ROWS
    }

    /// `x · Wᵀ`; `split`: in halves where the matrix has them (`split_at`).
    fn matmul_t(&self, x: &Array, split: bool) -> Result<Array> {
        if self.dequantizes(x) {
            // In f32 from f32 scales (those held compact would round the weights to their dtype).
            let (s, b) = (self.scales.as_dtype(Dtype::Float32)?, self.biases.as_dtype(Dtype::Float32)?);
            let w = ops::dequantize(&self.weight, &s, &b, self.params.group_size, self.params.bits)?;
            let y = ops::matmul(&x.as_dtype(Dtype::Float32)?, &w.t())?;
            return Ok(y.as_dtype(x.dtype())?);
        }
        let (group, bits) = (self.params.group_size, self.params.bits);
        // Products in f32 under the factored and int8 forms, whatever the dtype its scales are
        // held in.
        let x32 = &if self.form != AffineForm::Mlx { x.as_dtype(Dtype::Float32)? } else { x.clone() };
        let form = if rows(x) < FACTORED_MAX_ROWS || self.form == AffineForm::Int8 { self.form } else { AffineForm::Mlx };
        let product = |[w, s, b]: &[Array; 3]| -> Result<Array> {
            if self.rows_kernel {
                return Ok(kernels::affine_rows_matmul(x32, w, s, b, group, bits, form)?);
            }
            Ok(ops::quantized_matmul(x32, w, s, b, true, group, bits)?)
        };
        let y = match &self.halves {
            Some([first, second]) if split => joined(product(first)?, backend::on_second_stream(|| product(second))?)?,
            _ => product(&[self.weight.clone(), self.scales.clone(), self.biases.clone()])?,
        };
        self.stored(y, x)
    }
}

/// `scales` and `biases` in f16 if every value converts to it and back unchanged, else as they are.
fn f16_if_exact(scales: Array, biases: Array) -> Result<(Array, Array)> {
    let exact = |a: &Array| -> Result<Option<Array>> {
        let h = a.as_dtype(Dtype::Float16)?;
        let same = ops::array_eq(&h.as_dtype(Dtype::Float32)?, a, false)?.try_item_exact::<bool>().map_err(|e| Error::Internal(e.to_string()))?;
        Ok(same.then_some(h))
    };
    Ok(match (exact(&scales)?, exact(&biases)?) {
        (Some(s), Some(b)) => {
            mlx_rs::transforms::eval([&s, &b])?;
            (s, b)
        }
        _ => (scales, biases),
    })
}

/// Where a product with a matrix of `out` rows of `inner` columns splits its rows in two: on
/// MLX's CPU backend, whose bf16/f16 and quantized matmul kernels run on one core, the first half
/// is computed on the thread's default stream, the second on its second stream (another core), and
/// the halves joined: each output element is computed exactly as in one product (bit for bit,
/// checked with mlx on SmolLM2's shapes for 1, 8 and 128 rows of x), 1.5-2x faster. Below
/// SPLIT_MIN_ELEMENTS the second stream costs more than it saves (192×576: 0.18 ms at once, 0.23
/// ms split). f32 products (BLAS, already threaded), our kernels (on every core already:
/// crates/mlx-sys/kernels/row_pool.h) and Metal use one product.
fn split_at(out: usize, inner: usize) -> Option<i32> {
    const SPLIT_MIN_ELEMENTS: usize = 1 << 18;
    (out.saturating_mul(inner) >= SPLIT_MIN_ELEMENTS && backend::is_cpu()).then_some((out / 2) as i32)
}

/// Rows `..h` and `h..` of `a`, sliced once at load: a slice taken in every step would be one more
/// node of each step's graph for MLX to evaluate (30 a layer of SmolLM2), each as costly to
/// schedule as a small product. An evaluated slice is a view of the same buffer (no copy).
fn halves(a: &Array, h: i32) -> Result<[Array; 2]> {
    let parts = [a.index(..h), a.index(h..)];
    mlx_rs::transforms::eval(&parts)?;
    Ok(parts)
}

/// A product's two halves of output columns joined.
fn joined(first: Array, second: Array) -> Result<Array> {
    Ok(ops::concatenate(&[&first, &second], -1)?)
}

/// A dense matrix W [out, in] for `x · Wᵀ`.
pub enum Dense {
    /// As stored; MLX multiplies by its transposed view. `halves`: its rows in two where
    /// half-precision products split (`split_at`; f32 goes through BLAS, threaded already).
    Native { w: Array, halves: Option<[Array; 2]> },
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
        if !w.f32_matmuls().in_f32() {
            let halves = match split_at(rows, cols) {
                Some(h) if dtype != Dtype::Float32 && !kernels::affine_rows_fast() => Some(halves(&weight, h)?),
                _ => None,
            };
            return Ok(Dense::Native { w: weight, halves });
        }
        let wt = weight.as_dtype(Dtype::Float32)?.t().contiguous()?;
        wt.eval()?;
        Ok(Dense::F32T { wt, dtype })
    }

    /// `x · Wᵀ (+ bias)`, in x's dtype; `split`: in halves where the matrix has them.
    fn matmul_t(&self, x: &Array, bias: Option<&Array>, split: bool) -> Result<Array> {
        match self {
            Dense::Native { w, halves } => {
                // Half-precision products take our kernel where it runs (MLX's numbers, faster).
                let product = |w: &Array, b: Option<Array>| -> Result<Array> {
                    Ok(match b {
                        b if kernels::half_rows_fits(x, w, b.as_ref()) => kernels::half_rows_matmul(x, w, b.as_ref())?,
                        Some(b) => ops::addmm(b, x, w.t(), None, None)?,
                        None => ops::matmul(x, w.t())?,
                    })
                };
                match halves {
                    Some([first, second]) if split => {
                        let h = first.shape()[0];
                        let (b0, b1) = (bias.map(|b| b.index(..h)), bias.map(|b| b.index(h..)));
                        joined(product(first, b0)?, backend::on_second_stream(|| product(second, b1))?)
                    }
                    _ => product(w, bias.cloned()),
                }
            }
            Dense::F32T { wt, .. } => {
                let x32 = x.as_dtype(Dtype::Float32)?;
                let b32 = bias.map(|b| b.as_dtype(Dtype::Float32)).transpose()?;
                let y = match b32 {
                    _ if rows(x) < F32T_KERNEL_MAX_ROWS && kernels::fma_kernels() => kernels::f32t_rows_matmul(&x32, wt, b32.as_ref())?,
                    Some(b) => ops::addmm(b, &x32, wt, None, None)?,
                    None => ops::matmul(&x32, wt)?,
                };
                Ok(y.as_dtype(x.dtype())?)
            }
        }
    }

    /// Rows `ids` of W (an embedding lookup), in the stored dtype.
    fn rows(&self, ids: &Array) -> Result<Array> {
        match self {
            Dense::Native { w, .. } => Ok(w.take_axis(ids, 0)?),
            Dense::F32T { wt, dtype } => {
                let mut shape = ids.shape().to_vec();
                shape.push(wt.shape()[0]);
                let cols = wt.take_axis(&ids.reshape(&[-1])?, 1)?;
                Ok(cols.t().reshape(&shape)?.as_dtype(*dtype)?)
            }
        }
    }
}

/// Rows of x below which an f32 product with a matrix held transposed runs our kernel
/// (`kernels::f32t_rows_matmul`), not BLAS, which copies the whole matrix at every call: one row
/// (a decode step of one sequence). From two rows BLAS's copy is shared and its kernel faster
/// (640×2048, two cores: one row 0.15 against 0.21 ms, two 0.16 against 0.26, four 0.38 against
/// 0.35, eight 0.68 against 0.38; 576×1536: two rows 0.18 against 0.15).
const F32T_KERNEL_MAX_ROWS: i64 = 2;

/// The rows of `x` as a matrix (its last axis the columns).
fn rows(x: &Array) -> i64 {
    let inner = x.shape().last().copied().unwrap_or(1).max(1) as i64;
    x.size() as i64 / inner
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
        self.product(x, true)
    }

    fn product(&self, x: &Array, split: bool) -> Result<Array> {
        match self {
            Linear::Dense { weight, bias } => weight.matmul_t(x, bias.as_ref(), split),
            Linear::Quantized { q, bias } => {
                let y = q.matmul_t(x, split)?;
                Ok(match bias {
                    Some(b) => ops::add(&y, b)?,
                    None => y,
                })
            }
        }
    }

    /// Whether a product with `x` runs on one core: MLX's CPU kernels for quantized and
    /// half-precision matrices (ours too); f32 goes through BLAS, threaded already.
    fn one_core(&self, x: &Array) -> bool {
        match self {
            Linear::Dense { weight: Dense::Native { w, .. }, bias } => w.dtype() != Dtype::Float32 && !kernels::half_rows_fits(x, w, bias.as_ref()),
            Linear::Dense { weight: Dense::F32T { .. }, .. } => false,
            Linear::Quantized { q, .. } => !q.dequantizes(x) && !q.rows_kernel,
        }
    }
}

/// The products of `first`'s and then `second`'s layers with `x`. On MLX's CPU backend, where
/// they run on one core each (MLX's own kernels: where ours run, they use every core already), `second`'s are computed whole on the thread's second stream while
/// `first`'s are on the default one: products of similar sizes (gate beside up, q beside k and
/// v) keep both cores busy without being split in halves, so there are no halves to join (two
/// nodes fewer a product in each step's graph). The same numbers as `forward` (each output
/// element is computed as in one product).
pub fn side_by_side(first: &[&Linear], second: &[&Linear], x: &Array) -> Result<Vec<Array>> {
    let all = || first.iter().chain(second);
    if !(backend::is_cpu() && all().all(|l| l.one_core(x))) {
        return all().map(|l| l.forward(x)).collect();
    }
    let mut out = first.iter().map(|l| l.product(x, false)).collect::<Result<Vec<_>>>()?;
    out.extend(backend::on_second_stream(|| second.iter().map(|l| l.product(x, false)).collect::<Result<Vec<_>>>())?);
    Ok(out)
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
                // Scales held compact (our kernel's forms) in f32 again: the rows as with f32 scales.
                let compact = |a: &Array| -> Result<Array> {
                    let rows = a.take_axis(ids, 0)?;
                    Ok(if q.form != AffineForm::Mlx { rows.as_dtype(Dtype::Float32)? } else { rows })
                };
                let rows = ops::dequantize(
                    q.weight.take_axis(ids, 0)?,
                    compact(&q.scales)?,
                    &compact(&q.biases)?,
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
            Embedding::Dense(weight) => weight.matmul_t(x, None, true),
            Embedding::Quantized(q) => q.matmul_t(x, true),
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
        let n = x.shape().last().copied().unwrap_or(0);
        if !(backend::is_cpu() && compiled::compiles(x) && x.dtype() == self.weight.dtype() && n > 0) {
            return Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?);
        }
        // MLX's CPU fallback is ten nodes; compiled, three (the sum and one fused kernel each
        // side); our kernel, one. Its constants go in as inputs: MLX's compiler prints constants
        // into its kernels' source with 7 significant digits (1/576 would become another f32).
        let inv_n = (1.0 / n as f64) as f32;
        if kernels::affine_rows_fast() {
            return Ok(kernels::rms_rows(x, &self.weight, self.eps, inv_n)?);
        }
        self.compiled(x, inv_n)
    }

    fn compiled(&self, x: &Array, inv_n: f32) -> Result<Array> {
        let inputs = [x.clone(), self.weight.clone(), Array::from_f32(self.eps), Array::from_f32(inv_n)];
        Ok(compiled::call1(("rms_norm", [0; 4]), false, &inputs, rms_norm_fallback)?)
    }
}

/// MLX's CPU fallback of `fast::rms_norm` (mlx/fast.cpp), operation for operation, with its
/// constants as inputs: x · rsqrt(mean(x²) + eps) in f32, in x's dtype, times the weight.
/// `mean` is MLX's: the sum times 1/n rounded to f32 from a double.
fn rms_norm_fallback(a: &[Array]) -> std::result::Result<Vec<Array>, Exception> {
    let (x, weight, eps, inv_n) = (&a[0], &a[1], &a[2], &a[3]);
    let x32 = x.as_dtype(Dtype::Float32)?;
    let mean = ops::multiply(ops::sum_axis(ops::square(&x32)?, -1, true)?, inv_n)?;
    let y = ops::multiply(&x32, ops::rsqrt(ops::add(&mean, eps)?)?)?;
    Ok(vec![ops::multiply(y.as_dtype(x.dtype())?, weight)?])
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
            GateUp::Separate { gate, up } => {
                let [gate, up]: [Array; 2] = side_by_side(&[gate], &[up], x)?.try_into().map_err(|_| Error::Internal("two products".into()))?;
                (gate, up)
            }
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

/// mlx-lm's compiled `swiglu`: silu(gate) · x in one fused kernel (in f32 where our kernels run,
/// ours: its numbers, the exponentials eight at a time).
pub(super) fn swiglu(gate: &Array, x: &Array) -> Result<Array> {
    if kernels::exp_rows_fit(&[gate, x]) {
        return Ok(kernels::swiglu_rows(gate, x)?);
    }
    compiled_swiglu(gate, x)
}

fn compiled_swiglu(gate: &Array, x: &Array) -> Result<Array> {
    let f = |a: &[Array]| Ok(vec![a[0].multiply(ops::sigmoid(&a[0])?)?.multiply(&a[1])?]);
    Ok(compiled::call1(("swiglu", [0; 4]), true, &[gate.clone(), x.clone()], f)?)
}

/// MLX's compiled `gelu_approx`, with scalars in the input's dtype like Python's weak floats.
fn gelu_approx(x: &Array) -> Result<Array> {
    let f = |a: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
        let x = &a[0];
        let c = |v: f32| Array::from_f32(v).as_dtype(x.dtype());
        let cube = ops::power(x, &c(3.0)?)?;
        let inner = ops::multiply(&c((2.0f64 / std::f64::consts::PI).sqrt() as f32)?, &ops::add(x, &ops::multiply(&c(0.044715)?, &cube)?)?)?;
        Ok(vec![ops::multiply(&ops::multiply(&c(0.5)?, x)?, &ops::add(&c(1.0)?, &ops::tanh(&inner)?)?)?])
    };
    Ok(compiled::call1(("gelu_approx", [0; 4]), true, &[x.clone()], f)?)
}

#[cfg(test)]
#[path = "layers_tests.rs"]
mod tests;
