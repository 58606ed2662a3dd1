// RoPE's rotation of x [B, heads, L, head_dim] by given cosines and sines, in one graph node, equal
// bit for bit to the rotation of MLX's CPU fallback of `fast::rope` (mlx/fast.cpp). Included at
// the end of affine_rows.cpp after row_ops.h (the file is built without contraction into fused
// multiply-adds).
//
// Why: on MLX's CPU backend each node of a decode step's graph costs microseconds whatever its
// size, and the fallback's rotation is five nodes a call even with its arithmetic fused by MLX's
// compiler (two slices, two fused kernels, a concatenation), ten a layer. Here each value is
// computed with the fallback's operations in its order, each rounded to the dtype as MLX's dtype
// rounds it: first = x1·cos − x2·sin, second = x1·sin + x2·cos, where (x1, x2) are the two halves
// of the rotated features (or, `traditional`, each even feature and the odd one after it); the
// features past `dims` are copied.

#if defined(__x86_64__)
namespace {

// Strides of `a` broadcast to a 4-D shape from the right (0 on axes it does not have or has once).
std::array<int64_t, 4> broadcast_strides(const array& a) {
  std::array<int64_t, 4> s{0, 0, 0, 0};
  for (int d = 0; d < int(a.ndim()) && d < 4; d++) {
    const int axis = int(a.ndim()) - 1 - d;
    s[3 - d] = a.shape(axis) == 1 ? 0 : a.strides()[axis];
  }
  return s;
}

// Inputs x, cos, sin; params dims, traditional.
template <class R>
KERNEL void rope_rows_typed(const std::vector<array>& in, const RowOp::Params& p, array& out) {
  const array &x = in[0], &cos = in[1], &sin = in[2];
  const int dims = int(p[0]), half = dims / 2;
  const bool traditional = p[1] != 0;
  const int B = x.shape(0), H = x.shape(1), L = x.shape(2), D = x.shape(3);
  const auto xs = x.strides();
  const auto cs = broadcast_strides(cos), ss = broadcast_strides(sin);
  std::vector<float> row(D);
  size_t o = 0;
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < H; h++) {
      for (int l = 0; l < L; l++) {
        const int64_t xr = b * xs[0] + h * xs[1] + l * xs[2];
        const int64_t cr = b * cs[0] + h * cs[1] + l * cs[2], sr = b * ss[0] + h * ss[1] + l * ss[2];
        for (int i = 0; i < half; i++) {
          const int i1 = traditional ? 2 * i : i, i2 = traditional ? 2 * i + 1 : i + half;
          const float x1 = to_f32(x, xr + i1 * xs[3]), x2 = to_f32(x, xr + i2 * xs[3]);
          const float c = to_f32(cos, cr + i * cs[3]), s = to_f32(sin, sr + i * ss[3]);
          row[i1] = R::one(R::one(x1 * c) - R::one(x2 * s));
          row[i2] = R::one(R::one(x1 * s) + R::one(x2 * c));
        }
        for (int i = dims; i < D; i++) {
          row[i] = to_f32(x, xr + i * xs[3]);
        }
        for (int i = 0; i < D; i++) {
          store_value(out, o++, row[i]);
        }
      }
    }
  }
}

void rope_rows_compute(const std::vector<array>& in, const RowOp::Params& p, array& out) {
  by_dtype(out.dtype(), [&]<class R>() { rope_rows_typed<R>(in, p, out); });
}

}  // namespace
#endif

// x [B, heads, L, head_dim] (f32, bf16 or f16) rotated in its first `dims` features by `cos` and
// `sin` (x's dtype, broadcast against [B, heads, L, dims / 2] from the right); the result in x's
// dtype and shape. Returns 0, or 1 with the reason in `err`.
extern "C" int mlx_bun_rope_rows(
    mlx_array* res,
    const mlx_array x_in,
    const mlx_array cos_in,
    const mlx_array sin_in,
    int dims,
    int traditional,
    const mlx_stream s,
    char* err,
    size_t err_len) {
  return build_row_op("rope_rows", err, err_len, [&] {
#if defined(__x86_64__)
    auto& x = mlx_array_get_(x_in);
    auto& cos = mlx_array_get_(cos_in);
    auto& sin = mlx_array_get_(sin_in);
    const Dtype t = x.dtype();
    if (x.ndim() != 4 || (t != float32 && t != bfloat16 && t != float16) || cos.dtype() != t || sin.dtype() != t) {
      throw std::invalid_argument("[rope_rows] expects x [B, heads, L, head_dim] in f32, bf16 or f16, and cos and sin in its dtype");
    }
    if (dims <= 0 || dims % 2 != 0 || dims > x.shape(3)) {
      throw std::invalid_argument("[rope_rows] dims must be even and at most head_dim");
    }
    for (auto* a : {&cos, &sin}) {
      bool fits = a->ndim() >= 1 && a->ndim() <= 4 && a->shape(-1) == dims / 2;
      for (int d = 2; fits && d <= int(a->ndim()); d++) {
        fits = a->shape(-d) == 1 || a->shape(-d) == x.shape(4 - d);
      }
      if (!fits) {
        throw std::invalid_argument("[rope_rows] cos and sin must broadcast against [B, heads, L, dims / 2]");
      }
    }
    const RowOp::Params params{float(dims), float(traditional != 0), 0.0f};
    mlx_array_set_(*res, array(x.shape(), t, std::make_shared<RowOp>(mlx_stream_get_(s), "RopeRows", rope_rows_compute, params), {x, cos, sin}));
#endif
  });
}
