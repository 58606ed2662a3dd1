//! Our own MLX primitives (crates/mlx-sys/kernels/): products MLX's CPU backend runs slowly, and
//! decode-step operations its CPU fallbacks spread over many graph nodes.
use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype, Stream};

use super::backend;

/// Whether `affine_rows_matmul` runs here: MLX's CPU backend on an x86_64 CPU with AVX2 and F16C,
/// not macOS. Elsewhere MLX's own kernel is used (on a Mac MLX's CPU kernel is vectorised, in
/// another summation order, and the GPU is the device anyway).
pub fn affine_rows_fast() -> bool {
    // SAFETY: a plain query of the CPU's features.
    backend::is_cpu() && unsafe { mlx_sys::mlx_bun_affine_rows_fast() }
}

/// `x · Wᵀ` for `W` in MLX's affine quantization (`bits` 2, 4 or 8; x and the scales in f32,
/// bf16 or f16), equal bit for bit to `quantized_matmul(x, w, scales, biases, transpose=true)` on
/// MLX's CPU backend, only faster: MLX's kernel is scalar on x86_64 (and emulates half precision
/// value by value), this one computes eight output rows at once with the same operations in the
/// same order. Built on this thread's current stream (so `backend::on_second_stream` works as
/// with any op). Only for `affine_rows_fast()` machines (an error elsewhere).
///
/// `form` says how an f32 product computes where the CPU has FMA (elsewhere, and for
/// half-precision products, always in MLX's order); each output is computed alike whatever the
/// number of x rows.
pub fn affine_rows_matmul(x: &Array, w: &Array, scales: &Array, biases: &Array, group_size: i32, bits: i32, form: AffineForm) -> Result<Array, Exception> {
    // SAFETY: every handle is a live mlx-rs array for the call (`build` checks the rest).
    build(|res, stream, err, len| unsafe { mlx_sys::mlx_bun_affine_rows_matmul(res, x.as_ptr(), w.as_ptr(), scales.as_ptr(), biases.as_ptr(), group_size, bits, form as i32, stream, err, len) })
}

/// Whether `affine_rows_matmul` takes `AffineForm::Int8` for rows of `k` values with a matrix of
/// `bits` in groups of `group_size` here: our kernels with FMA; 4 or 8 bits; groups of 32, 64,
/// 128 or 256; rows of 256 values or more. Elsewhere that form is the factored one.
pub fn int8_fits(bits: i32, group_size: i32, k: i32) -> bool {
    // SAFETY: a plain query of the CPU's features and of three numbers.
    backend::is_cpu() && unsafe { mlx_sys::mlx_bun_affine_int8_fits(bits, group_size, k) }
}

/// How `affine_rows_matmul` computes an f32 product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AffineForm {
    /// MLX's operations in MLX's order: its numbers bit for bit.
    Mlx = 0,
    /// The opt-in `f32Matmuls: 'all'`: each group's part as scale · Σ x·q + bias · Σ x with fused
    /// multiply-adds, a matrix row at a time (its bytes widen straight into lanes: ~1.8x faster at
    /// 8 bits than eight rows in lanes): not MLX's roundings, nearer the exact product.
    Factored = 1,
    /// The opt-in `f32Matmuls: 'int8'`: at 4 and 8 bits, x quantized to 8 bits per 32 values (one
    /// f32 scale each, llama.cpp's Q8_0) and each group's Σ q·x̂ an integer dot product
    /// (kernels/q8_rows.h): the product of the stored weights with the rounded x, in f32 within
    /// its rounding, the same on every x86_64 CPU. Where `int8_fits` says no, the factored form.
    Int8 = 2,
}

/// Whether `half_rows_matmul` takes `x · Wᵀ (+ bias)`: our CPU kernels run here, and x, W and
/// the bias (a vector, if any) share one half-precision dtype.
pub fn half_rows_fits(x: &Array, w: &Array, bias: Option<&Array>) -> bool {
    let t = w.dtype();
    matches!(t, Dtype::Bfloat16 | Dtype::Float16)
        && x.dtype() == t
        && w.ndim() == 2
        && bias.is_none_or(|b| b.dtype() == t && b.ndim() == 1)
        && affine_rows_fast()
}

/// `x · Wᵀ (+ bias)` for bf16 or f16 x, W [N, K] and bias [N], equal bit for bit to MLX's CPU
/// `matmul` / `addmm` (each output a sum over k in order of exact f32 products, rounded once to
/// the dtype; MLX's kernel does it one value at a time on x86_64, this one eight rows per AVX2
/// vector: kernels/half_rows.h). Built on this thread's current stream. Only where
/// `half_rows_fits` (an error elsewhere).
pub fn half_rows_matmul(x: &Array, w: &Array, bias: Option<&Array>) -> Result<Array, Exception> {
    with_bias(mlx_sys::mlx_bun_half_rows_matmul, x, w, bias)
}

/// Whether our kernels' forms in fused multiply-adds run here (`f32t_rows_matmul`, and the
/// factored form of `affine_rows_matmul`): our kernels' CPUs with FMA.
pub fn fma_kernels() -> bool {
    // SAFETY: a plain query of the CPU's features.
    backend::is_cpu() && unsafe { mlx_sys::mlx_bun_fma_kernels() }
}

/// `x · Wt (+ bias)` for f32 x [..., K], a matrix held transposed, Wt [K, N], and a bias [N]: each
/// output one chain of fused multiply-adds over k ascending, then the bias (kernels/f32t_rows.h):
/// for products of a few rows, where BLAS copies the whole matrix at every call. Not BLAS's
/// roundings (used under the opt-in `f32Matmuls: 'all'` only); the same for a row of x alone or
/// among others. Built on this thread's current stream. Only where `fma_kernels` (an error
/// elsewhere).
pub fn f32t_rows_matmul(x: &Array, wt: &Array, bias: Option<&Array>) -> Result<Array, Exception> {
    with_bias(mlx_sys::mlx_bun_f32t_rows_matmul, x, wt, bias)
}

/// RoPE's rotation of x [B, heads, L, head_dim] (f32, bf16 or f16) in its first `dims` features
/// by `cos` and `sin` (x's dtype, broadcast against [B, heads, L, dims / 2]): one graph node,
/// equal bit for bit to the rotation of MLX's CPU fallback of `fast::rope` (the same operations in
/// the same order, each rounded to the dtype), which is five nodes even compiled. Built on this
/// thread's current stream. Only for `affine_rows_fast()` machines (an error elsewhere).
pub fn rope_rows(x: &Array, cos: &Array, sin: &Array, dims: i32, traditional: bool) -> Result<Array, Exception> {
    // SAFETY: every handle is a live mlx-rs array for the call (`build` checks the rest).
    build(|res, stream, err, len| unsafe { mlx_sys::mlx_bun_rope_rows(res, x.as_ptr(), cos.as_ptr(), sin.as_ptr(), dims, traditional as i32, stream, err, len) })
}

/// RMSNorm of x [..., n] times `weight` [n] (x's dtype: f32, bf16 or f16), with `eps` and `inv_n`
/// (1/n as f32): one graph node, equal bit for bit to MLX's CPU fallback of `fast::rms_norm` (the
/// same operations in the same order), which is three nodes even compiled. Built on this thread's
/// current stream. Only for `affine_rows_fast()` machines (an error elsewhere).
pub fn rms_rows(x: &Array, weight: &Array, eps: f32, inv_n: f32) -> Result<Array, Exception> {
    // SAFETY: every handle is a live mlx-rs array for the call (`build` checks the rest).
    build(|res, stream, err, len| unsafe { mlx_sys::mlx_bun_rms_rows(res, x.as_ptr(), weight.as_ptr(), eps, inv_n, stream, err, len) })
}

/// Whether `sdpa_rows` takes this attention: our kernels run here (with the process's
/// `cblas_sgemm`, the one MLX calls), one query position (a decode step), q, k and v in f32 of
/// four axes.
pub fn sdpa_rows_fits(q: &Array, k: &Array, v: &Array) -> bool {
    // SAFETY: a plain query of the CPU's features and of a symbol's binding.
    [q, k, v].iter().all(|a| a.ndim() == 4 && a.dtype() == Dtype::Float32) && q.shape()[2] == 1 && backend::is_cpu() && unsafe { mlx_sys::mlx_bun_sdpa_rows_fast() }
}

/// Attention of q [B, heads, 1, D] over k [B, kv_heads, T, D] and v [B, kv_heads, T, Dv] (f32, no
/// mask) scaled by `scale`: one graph node, equal bit for bit to MLX's CPU fallback of
/// `fast::scaled_dot_product_attention` (the same BLAS calls with the same arguments, MLX's softmax
/// arithmetic), which is eleven nodes. Built on this thread's current stream. Only where
/// `sdpa_rows_fits` (an error elsewhere).
///
/// `factored` (the opt-in `f32Matmuls: 'all'`, where `fma_kernels`): the two products as chains of
/// fused multiply-adds instead of BLAS calls (OpenBLAS packs its operands at every call, two per
/// head): not BLAS's roundings, the same for a head whatever the others.
pub fn sdpa_rows(q: &Array, k: &Array, v: &Array, scale: f32, factored: bool) -> Result<Array, Exception> {
    // SAFETY: every handle is a live mlx-rs array for the call (`build` checks the rest).
    build(|res, stream, err, len| unsafe { mlx_sys::mlx_bun_sdpa_rows(res, q.as_ptr(), k.as_ptr(), v.as_ptr(), scale, factored as i32, stream, err, len) })
}

/// Whether `log_softmax_rows` and `swiglu_rows` take these operands: our kernels with FMA run
/// here (they compute MLX's exponential eight values at a time), and every operand is f32 of one
/// shape with a last axis.
pub fn exp_rows_fit(operands: &[&Array]) -> bool {
    let shape = operands[0].shape();
    !shape.is_empty() && operands.iter().all(|a| a.dtype() == Dtype::Float32 && a.shape() == shape) && fma_kernels()
}

/// Each row of x [..., n] minus its logsumexp (the log-probabilities of logits): one graph node,
/// equal bit for bit to MLX's CPU `x − logsumexp(x, -1, keepdims)` (two nodes, the exponentials
/// one at a time on x86_64), the exponentials in AVX2 lanes (kernels/exp_rows.h). Built on this
/// thread's current stream. Only where `exp_rows_fit` (an error elsewhere).
pub fn log_softmax_rows(x: &Array) -> Result<Array, Exception> {
    // SAFETY: the handle is a live mlx-rs array for the call (`build` checks the rest).
    build(|res, stream, err, len| unsafe { mlx_sys::mlx_bun_log_softmax_rows(res, x.as_ptr(), stream, err, len) })
}

/// silu(gate) · x for gate and x of one shape: one graph node, equal bit for bit to mlx-lm's
/// compiled `swiglu` on MLX's CPU backend, the sigmoid's exponentials in AVX2 lanes
/// (kernels/exp_rows.h). Built on this thread's current stream. Only where `exp_rows_fit` (an
/// error elsewhere).
pub fn swiglu_rows(gate: &Array, x: &Array) -> Result<Array, Exception> {
    // SAFETY: every handle is a live mlx-rs array for the call (`build` checks the rest).
    build(|res, stream, err, len| unsafe { mlx_sys::mlx_bun_swiglu_rows(res, gate.as_ptr(), x.as_ptr(), stream, err, len) })
}

type WithBias = unsafe extern "C" fn(*mut mlx_sys::mlx_array, mlx_sys::mlx_array, mlx_sys::mlx_array, *const mlx_sys::mlx_array, mlx_sys::mlx_stream, *mut std::os::raw::c_char, usize) -> std::os::raw::c_int;

/// Calls one of our kernels' builders of `x`, a matrix and an optional bias.
fn with_bias(builder: WithBias, x: &Array, w: &Array, bias: Option<&Array>) -> Result<Array, Exception> {
    let bias_handle = bias.map(|b| b.as_ptr());
    let bias_ptr = bias_handle.as_ref().map_or(std::ptr::null(), |b| b as *const _);
    // SAFETY: every handle is a live mlx-rs array for the call (`bias_handle` borrows `bias`).
    build(|res, stream, err, len| unsafe { builder(res, x.as_ptr(), w.as_ptr(), bias_ptr, stream, err, len) })
}

/// Runs one of our kernels' builders on this thread's current stream: `call` gets a fresh result
/// handle, the stream and an error buffer, and returns the builder's status. The handle is ours
/// from then on: wrapped on success, freed (with the builder's message as the error) on failure.
fn build(call: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream, *mut std::os::raw::c_char, usize) -> std::os::raw::c_int) -> Result<Array, Exception> {
    let stream = Stream::thread_local_or_default();
    let mut err = [0 as std::os::raw::c_char; 256];
    // SAFETY: `res` is a fresh handle and `err` a buffer of the length given; the stream is live.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        if call(&mut res, stream.as_ptr(), err.as_mut_ptr(), err.len()) != 0 {
            mlx_sys::mlx_array_free(res);
            return Err(Exception::custom(std::ffi::CStr::from_ptr(err.as_ptr()).to_string_lossy().into_owned()));
        }
        Ok(Array::from_ptr(res))
    }
}
