//! Raw bindings to mlx-c, generated at build time (see build.rs).
#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case, clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
include!(concat!(env!("OUT_DIR"), "/compat.rs"));

// Our kernels (kernels/*.cpp), built beside mlx-c.
extern "C" {
    /// Whether this CPU runs `mlx_bun_affine_rows_matmul` vectorised (AVX2).
    pub fn mlx_bun_affine_rows_fast() -> bool;
    /// `x · Wᵀ` for an MLX affine-quantized `W`, as MLX's CPU kernel computes it (f32 result);
    /// 0, or 1 with a message in `err`.
    pub fn mlx_bun_affine_rows_matmul(
        res: *mut mlx_array,
        x: mlx_array,
        w: mlx_array,
        scales: mlx_array,
        biases: mlx_array,
        group_size: ::std::os::raw::c_int,
        bits: ::std::os::raw::c_int,
        s: mlx_stream,
        err: *mut ::std::os::raw::c_char,
        err_len: usize,
    ) -> ::std::os::raw::c_int;
}
