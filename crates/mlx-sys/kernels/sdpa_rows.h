// Attention of one query position over plain f32 keys and values, in one graph node, equal bit for
// bit to MLX's CPU fallback of `fast::scaled_dot_product_attention` (mlx/fast.cpp) without a mask:
// the same BLAS calls with the same arguments, and MLX's own softmax arithmetic (its `simd::exp`
// from the headers of the libmlx we link). Included at the end of affine_rows.cpp after row_ops.h
// (the file is built without contraction into fused multiply-adds).
//
// Why: on MLX's CPU backend each node of a decode step's graph costs microseconds whatever its
// size, and the fallback is eleven nodes a layer (the query's scaling, the grouping of heads, the
// keys' transposition and broadcast, two products, the softmax, the flattening). Here, for each
// query head h (of group g = h / repeats): q' = scale · q, then MLX's products as its CPU matmul
// makes them, one `cblas_sgemm` per head: scores = q' · Kgᵀ, softmax, out = probabilities · Vg;
// operands laid out as MLX lays them out (its transposition check, or a packed copy where
// neither layout fits).

#include "mlx/backend/cpu/simd/simd.h"

// OpenBLAS's (the process's) cblas_sgemm, the one MLX calls; CBLAS's enum values.
extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                            const float* b, int ldb, float beta, float* c, int ldc);

#if defined(__x86_64__)
namespace {

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

// A batch of matrices [rows, cols] (row r, column c at r · s_row + c · s_col) as MLX's CPU matmul
// passes one operand to BLAS: as it is when rows or columns are contiguous (transposed in the
// second case), else copied packed into `copy`. Returns the data, whether transposed, and the
// leading dimension.
struct Operand {
  const float* data;
  bool transposed;
  int ld;
};

Operand blas_operand(const float* p, int rows, int cols, int64_t s_row, int64_t s_col, std::vector<float>& copy) {
  if (s_row == cols && s_col == 1) {
    return {p, false, int(s_row)};
  }
  if (s_row == 1 && s_col == rows) {
    return {p, true, int(s_col)};
  }
  copy.resize(size_t(rows) * cols);
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < cols; c++) {
      copy[size_t(r) * cols + c] = p[r * s_row + c * s_col];
    }
  }
  return {copy.data(), false, cols};
}

// MLX's CPU softmax of one f32 row in place (softmax<float, float>, one lane on x86_64).
void mlx_softmax_row(float* x, int n) {
  using namespace mlx::core::simd;
  Simd<float, 1> vmax(-std::numeric_limits<float>::infinity());
  for (int i = 0; i < n; i++) {
    vmax = maximum(Simd<float, 1>(x[i]), vmax);
  }
  const float top = max(vmax);
  Simd<float, 1> vnorm(0.0);
  for (int i = 0; i < n; i++) {
    Simd<float, 1> e = exp(Simd<float, 1>(x[i]) - top);
    x[i] = e.value;
    vnorm = vnorm + e;
  }
  float norm = sum(vnorm);
  norm = 1 / norm;
  for (int i = 0; i < n; i++) {
    x[i] = (Simd<float, 1>(x[i]) * norm).value;
  }
}

// Inputs q [B, heads, 1, D], k [B, kv_heads, T, D], v [B, kv_heads, T, Dv]; params scale.
void sdpa_rows_compute(const std::vector<array>& in, const RowOp::Params& p, array& out) {
  const array &q = in[0], &k = in[1], &v = in[2];
  const float scale = p[0];
  const int B = q.shape(0), H = q.shape(1), D = q.shape(3), KH = k.shape(1), T = k.shape(2), Dv = v.shape(3);
  const int repeats = H / KH;
  const auto &qs = q.strides(), &ks = k.strides(), &vs = v.strides();
  std::vector<float> qrow(D), scores(T), kcopy, vcopy;
  float* o = out.data<float>();
  for (int b = 0; b < B; b++) {
    for (int g = 0; g < KH; g++) {
      // Kgᵀ [D, T] and Vg [T, Dv] of this group, shared by its query heads.
      const Operand kt = blas_operand(k.data<float>() + b * ks[0] + g * ks[1], D, T, ks[3], ks[2], kcopy);
      const Operand vg = blas_operand(v.data<float>() + b * vs[0] + g * vs[1], T, Dv, vs[2], vs[3], vcopy);
      for (int r = 0; r < repeats; r++) {
        const int h = g * repeats + r;
        const float* qh = q.data<float>() + b * qs[0] + h * qs[1];
        for (int i = 0; i < D; i++) {
          qrow[i] = scale * qh[i * qs[3]];
        }
        cblas_sgemm(kRowMajor, kNoTrans, kt.transposed ? kTrans : kNoTrans, 1, T, D, 1.0f, qrow.data(), D, kt.data, kt.ld, 0.0f,
                    scores.data(), T);
        mlx_softmax_row(scores.data(), T);
        cblas_sgemm(kRowMajor, kNoTrans, vg.transposed ? kTrans : kNoTrans, 1, Dv, T, 1.0f, scores.data(), T, vg.data, vg.ld, 0.0f,
                    o + (size_t(b) * H + h) * Dv, Dv);
      }
    }
  }
}

}  // namespace
#endif

// Attention of q [B, heads, 1, D] over k [B, kv_heads, T, D] and v [B, kv_heads, T, Dv], all f32,
// heads a multiple of kv_heads, no mask, scaled by `scale`; the result [B, heads, 1, Dv] in f32.
// Returns 0, or 1 with the reason in `err`.
extern "C" int mlx_bun_sdpa_rows(
    mlx_array* res,
    const mlx_array q_in,
    const mlx_array k_in,
    const mlx_array v_in,
    float scale,
    const mlx_stream s,
    char* err,
    size_t err_len) {
  return build_row_op("sdpa_rows", err, err_len, [&] {
#if defined(__x86_64__)
    auto& q = mlx_array_get_(q_in);
    auto& k = mlx_array_get_(k_in);
    auto& v = mlx_array_get_(v_in);
    for (auto* a : {&q, &k, &v}) {
      if (a->ndim() != 4 || a->dtype() != float32) {
        throw std::invalid_argument("[sdpa_rows] expects q, k and v of four axes in f32");
      }
    }
    const int H = q.shape(1), KH = k.shape(1);
    if (q.shape(2) != 1 || q.shape(0) != k.shape(0) || v.shape(0) != k.shape(0) || KH < 1 || v.shape(1) != KH || H % KH != 0 ||
        q.shape(3) != k.shape(3) || v.shape(2) != k.shape(2) || k.shape(2) < 1) {
      throw std::invalid_argument("[sdpa_rows] expects q [B, heads, 1, D], k [B, kv_heads, T, D] and v [B, kv_heads, T, Dv]");
    }
    const RowOp::Params params{scale, 0.0f, 0.0f};
    Shape shape{q.shape(0), H, 1, v.shape(3)};
    mlx_array_set_(*res, array(std::move(shape), float32, std::make_shared<RowOp>(mlx_stream_get_(s), "SdpaRows", sdpa_rows_compute, params), {q, k, v}));
#endif
  });
}
