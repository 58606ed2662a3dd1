//! Raw bindings to mlx-c, generated at build time (see build.rs).
#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case, clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
include!(concat!(env!("OUT_DIR"), "/compat.rs"));

// Our kernels (kernels/*.cpp), built beside mlx-c.
extern "C" {
    /// Whether `mlx_bun_affine_rows_matmul` runs here: x86_64 with AVX2 and F16C, not macOS.
    pub fn mlx_bun_affine_rows_fast() -> bool;
    /// Whether `mlx_bun_affine_rows_matmul` with `form` 2 takes the int8 form for rows of `k`
    /// values with a matrix of `bits` in groups of `group_size` (else the factored one).
    pub fn mlx_bun_affine_int8_fits(bits: ::std::os::raw::c_int, group_size: ::std::os::raw::c_int, k: ::std::os::raw::c_int) -> bool;
    /// `x · Wᵀ` for an MLX affine-quantized `W`, bit for bit as MLX's CPU kernel computes it (in
    /// the promoted dtype of x and the scales), or, with `form` 1 for an f32 product, each
    /// group as scale · Σ x·q + bias · Σ x in fused multiply-adds (faster, other roundings), or
    /// with `form` 2 so at 2 bits and with x quantized to 8 bits per 32 values and integer dot
    /// products at 4 and 8; 0, or 1 with a message in `err`.
    pub fn mlx_bun_affine_rows_matmul(
        res: *mut mlx_array,
        x: mlx_array,
        w: mlx_array,
        scales: mlx_array,
        biases: mlx_array,
        group_size: ::std::os::raw::c_int,
        bits: ::std::os::raw::c_int,
        form: ::std::os::raw::c_int,
        s: mlx_stream,
        err: *mut ::std::os::raw::c_char,
        err_len: usize,
    ) -> ::std::os::raw::c_int;
    /// `x · Wᵀ (+ bias)` for bf16 or f16 x, W and bias (null for none), bit for bit as MLX's
    /// CPU matmul/addmm computes it; 0, or 1 with a message in `err`.
    pub fn mlx_bun_half_rows_matmul(
        res: *mut mlx_array,
        x: mlx_array,
        w: mlx_array,
        bias: *const mlx_array,
        s: mlx_stream,
        err: *mut ::std::os::raw::c_char,
        err_len: usize,
    ) -> ::std::os::raw::c_int;
    /// Whether our kernels' forms in fused multiply-adds run here (`mlx_bun_f32t_rows_matmul`, the
    /// factored form of `mlx_bun_affine_rows_matmul`): x86_64 with AVX2, F16C and FMA, not macOS.
    pub fn mlx_bun_fma_kernels() -> bool;
    /// `x · Wt (+ bias)` for f32 x [..., K], Wt [K, N] and bias [N] (null for none): each output
    /// one chain of fused multiply-adds over k ascending, then the bias; 0, or 1 with a message in
    /// `err`.
    pub fn mlx_bun_f32t_rows_matmul(
        res: *mut mlx_array,
        x: mlx_array,
        wt: mlx_array,
        bias: *const mlx_array,
        s: mlx_stream,
        err: *mut ::std::os::raw::c_char,
        err_len: usize,
    ) -> ::std::os::raw::c_int;
    /// x [B, heads, L, head_dim] (f32, bf16 or f16) with its first `dims` features rotated by
    /// `cos` and `sin` (x's dtype, broadcast against [B, heads, L, dims / 2]) as MLX's CPU fallback
    /// of `fast::rope` rotates them, bit for bit; 0, or 1 with a message in `err`.
    pub fn mlx_bun_rope_rows(
        res: *mut mlx_array,
        x: mlx_array,
        cos: mlx_array,
        sin: mlx_array,
        dims: ::std::os::raw::c_int,
        traditional: ::std::os::raw::c_int,
        s: mlx_stream,
        err: *mut ::std::os::raw::c_char,
        err_len: usize,
    ) -> ::std::os::raw::c_int;
    /// RMSNorm of x [..., n] times `weight` [n] (x's dtype: f32, bf16 or f16), with `eps` and
    /// `inv_n` (1/n as f32), as MLX's CPU fallback of `fast::rms_norm` computes it, bit for bit;
    /// 0, or 1 with a message in `err`.
    pub fn mlx_bun_rms_rows(
        res: *mut mlx_array,
        x: mlx_array,
        weight: mlx_array,
        eps: f32,
        inv_n: f32,
        s: mlx_stream,
        err: *mut ::std::os::raw::c_char,
        err_len: usize,
    ) -> ::std::os::raw::c_int;
    /// Whether `mlx_bun_sdpa_rows` builds here: our kernels run, and the process has a
    /// `cblas_sgemm` (the one MLX calls).
    pub fn mlx_bun_sdpa_rows_fast() -> bool;
    /// Attention of q [B, heads, 1, D] over k [B, kv_heads, T, D] and v [B, kv_heads, T, Dv], all
    /// f32, no mask, as MLX's CPU fallback of `fast::scaled_dot_product_attention` computes it, bit
    /// for bit, or with `factored` its products in fused multiply-adds (other roundings); 0, or 1
    /// with a message in `err`.
    pub fn mlx_bun_sdpa_rows(
        res: *mut mlx_array,
        q: mlx_array,
        k: mlx_array,
        v: mlx_array,
        scale: f32,
        factored: ::std::os::raw::c_int,
        s: mlx_stream,
        err: *mut ::std::os::raw::c_char,
        err_len: usize,
    ) -> ::std::os::raw::c_int;
    /// Each row of x [..., n] (f32) minus its logsumexp, as MLX's CPU `logsumexp` over the last
    /// axis and `subtract` compute it, bit for bit; 0, or 1 with a message in `err`.
    pub fn mlx_bun_log_softmax_rows(
        res: *mut mlx_array,
        x: mlx_array,
        s: mlx_stream,
        err: *mut ::std::os::raw::c_char,
        err_len: usize,
    ) -> ::std::os::raw::c_int;
    /// silu(gate) · x for gate and x of one shape in f32, as mlx-lm's compiled `swiglu` computes
    /// it on MLX's CPU backend, bit for bit; 0, or 1 with a message in `err`.
    pub fn mlx_bun_swiglu_rows(
        res: *mut mlx_array,
        gate: mlx_array,
        x: mlx_array,
        s: mlx_stream,
        err: *mut ::std::os::raw::c_char,
        err_len: usize,
    ) -> ::std::os::raw::c_int;
}
