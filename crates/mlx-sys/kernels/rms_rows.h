// RMSNorm of x [..., n] (f32, bf16 or f16) times a weight [n] of its dtype, in one graph node, equal
// bit for bit to MLX's CPU fallback of `fast::rms_norm` (mlx/fast.cpp). Included at the end of
// affine_rows.cpp after row_ops.h (the file is built without contraction into fused
// multiply-adds).
//
// Why: on MLX's CPU backend each node of a decode step's graph costs microseconds whatever its
// size, and the fallback is three nodes even with its elementwise operations fused by MLX's
// compiler (the square, the sum, the rest), six a layer. Here each row is computed with the
// fallback's operations in its order: in f32, the sum of squares from the first value to the last
// (MLX's CPU reduction on x86_64, one lane: ((0 + x0²) + x1²) + …, then + 0), times 1/n, plus
// eps, r = 1 / sqrt(that); each value x · r rounded to the dtype, then times the weight in the
// dtype.

#include <cmath>

#if defined(__x86_64__)
namespace {

// Inputs x, weight; params eps, 1/n.
template <class R>
KERNEL void rms_rows_typed(const std::vector<array>& in, const RowOp::Params& p, array& out) {
  const float eps = p[0], inv_n = p[1];
  const int n = in[0].shape(-1);
  const size_t rows = in[0].size() / n;
  const std::vector<float> xs = x_in_f32(in[0]), ws = x_in_f32(in[1]);
  for (size_t m = 0; m < rows; m++) {
    const float* v = xs.data() + m * n;
    float sum = 0.0f;
    for (int k = 0; k < n; k++) {
      sum = sum + v[k] * v[k];
    }
    sum = sum + 0.0f;
    const float r = 1.0f / std::sqrt(sum * inv_n + eps);
    for (int k = 0; k < n; k++) {
      store_value(out, m * n + k, R::one(R::one(v[k] * r) * ws[k]));
    }
  }
}

void rms_rows_compute(const std::vector<array>& in, const RowOp::Params& p, array& out) {
  by_dtype(out.dtype(), [&]<class R>() { rms_rows_typed<R>(in, p, out); });
}

}  // namespace
#endif

// RMSNorm of x [..., n] times `weight` [n] (x's dtype: f32, bf16 or f16) with `eps` and `inv_n`
// (1/n rounded to f32, as MLX's fallback takes it); the result in x's dtype and shape. Returns 0,
// or 1 with the reason in `err`.
extern "C" int mlx_bun_rms_rows(
    mlx_array* res,
    const mlx_array x_in,
    const mlx_array weight_in,
    float eps,
    float inv_n,
    const mlx_stream s,
    char* err,
    size_t err_len) {
  return build_row_op("rms_rows", err, err_len, [&] {
#if defined(__x86_64__)
    auto& x = mlx_array_get_(x_in);
    auto& weight = mlx_array_get_(weight_in);
    const Dtype t = x.dtype();
    if (x.ndim() < 1 || x.shape(-1) < 1 || (t != float32 && t != bfloat16 && t != float16) || weight.dtype() != t ||
        weight.ndim() != 1 || weight.shape(0) != x.shape(-1)) {
      throw std::invalid_argument("[rms_rows] expects x [..., n] in f32, bf16 or f16 and a weight [n] in its dtype");
    }
    const RowOp::Params params{eps, inv_n, 0.0f};
    mlx_array_set_(*res, array(x.shape(), t, std::make_shared<RowOp>(mlx_stream_get_(s), "RmsRows", rms_rows_compute, params), {x, weight}));
#endif
  });
}
