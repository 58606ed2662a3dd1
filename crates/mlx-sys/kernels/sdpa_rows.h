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
// neither layout fits). Under the opt-in `f32Matmuls: 'all'` the products are our own chains of
// fused multiply-adds instead (sdpa_head_factored), and the heads are spread over the cores.

// Where the kernel is built: where our kernels run (x86_64, not macOS, whose MLX multiplies
// through Accelerate).
#if defined(__x86_64__) && !defined(__APPLE__)
#define MLX_BUN_SDPA_ROWS 1
#include "mlx/backend/cpu/simd/simd.h"

// The process's cblas_sgemm, bound as MLX's own reference to it is (OpenBLAS, linked ahead of the
// wheel's bundled BLAS, or that one): weak, so that a build linking no BLAS of its own (the
// `mlx-bun` command with MLX_BUN_BLAS=reference) still links; the kernel is offered only where it
// is bound (mlx_bun_sdpa_rows_fast). CBLAS's enum values below.
extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                            const float* b, int ldb, float beta, float* c, int ldc) __attribute__((weak));

namespace {

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

// A packed copy of a matrix whose rows are not contiguous with each value next to the last, or
// the matrix itself.
const float* packed_rows(const float* p, int rows, int cols, int64_t s_row, int64_t s_col, std::vector<float>& copy) {
  if (s_col == 1 && s_row == cols) {
    return p;
  }
  copy.resize(size_t(rows) * cols);
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < cols; c++) {
      copy[size_t(r) * cols + c] = p[r * s_row + c * s_col];
    }
  }
  return copy.data();
}

// A matrix [rows, cols] (row r, column c at r · s_row + c · s_col) as MLX's CPU matmul passes an
// operand to BLAS: as it is when its rows are contiguous, transposed when its columns are (checked
// in that order), else packed (packed_rows). The data, whether transposed, and the leading
// dimension.
struct Operand {
  const float* data;
  bool transposed;
  int ld;
};

Operand blas_operand(const float* p, int rows, int cols, int64_t s_row, int64_t s_col, std::vector<float>& copy) {
  if (!(s_col == 1 && s_row == cols) && s_row == 1 && s_col == rows) {
    return {p, true, int(s_col)};
  }
  return {packed_rows(p, rows, cols, s_row, s_col, copy), false, cols};
}

// The opt-in form (`f32Matmuls: 'all'`): the two products as chains of fused multiply-adds, not
// BLAS calls (OpenBLAS packs both operands at each of its calls, two per head: ~6 % of a SmolLM2
// decode step's samples), the softmax as MLX computes it. Each score one chain over the head's
// features in eight lanes, then their sum; each output eight features at a time, one chain over
// positions ascending. Not BLAS's roundings; the same for a head whatever the others.
KERNEL_FMA void sdpa_head_factored(const float* q, const float* k, const float* v, int D, int T, int Dv, float* scores, float* out) {
  for (int t = 0; t < T; t++) {
    const float* kt = k + size_t(t) * D;
    __m256 acc = _mm256_setzero_ps();
    int d = 0;
    for (; d + 8 <= D; d += 8) {
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(kt + d), acc);
    }
    float s = lanes_sum(acc);
    for (; d < D; d++) {
      s = std::fma(q[d], kt[d], s);
    }
    scores[t] = s;
  }
  softmax_row(scores, T);
  int d = 0;
  for (; d + 8 <= Dv; d += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int t = 0; t < T; t++) {
      acc = _mm256_fmadd_ps(_mm256_set1_ps(scores[t]), _mm256_loadu_ps(v + size_t(t) * Dv + d), acc);
    }
    _mm256_storeu_ps(out + d, acc);
  }
  for (; d < Dv; d++) {
    float acc = 0.0f;
    for (int t = 0; t < T; t++) {
      acc = std::fma(scores[t], v[size_t(t) * Dv + d], acc);
    }
    out[d] = acc;
  }
}

// The opt-in form over every head of q [B, H, 1, D] (k and v of KH heads as sdpa_rows_compute
// gets them): each group's keys and values as packed rows (copied where the cache's are not),
// then the heads spread over the cores (kernels/row_pool.h), each head's output computed by one
// thread as alone.
void sdpa_factored_heads(const array& q, const array& k, const array& v, float scale, float* o) {
  const int B = q.shape(0), H = q.shape(1), D = q.shape(3), KH = k.shape(1), T = k.shape(2), Dv = v.shape(3);
  const int repeats = H / KH;
  const auto &qs = q.strides(), &ks = k.strides(), &vs = v.strides();
  std::vector<std::vector<float>> copies(size_t(B) * KH * 2);
  std::vector<const float*> keys(size_t(B) * KH), values(size_t(B) * KH);
  for (int b = 0; b < B; b++) {
    for (int g = 0; g < KH; g++) {
      const size_t i = size_t(b) * KH + g;
      keys[i] = packed_rows(k.data<float>() + b * ks[0] + g * ks[1], T, D, ks[2], ks[3], copies[2 * i]);
      values[i] = packed_rows(v.data<float>() + b * vs[0] + g * vs[1], T, Dv, vs[2], vs[3], copies[2 * i + 1]);
    }
  }
  parallel_rows(B * H, 1, [&](int h0, int h1) {
    std::vector<float> qrow(D), scores(T);
    for (int bh = h0; bh < h1; bh++) {
      const int b = bh / H, h = bh % H;
      const float* qh = q.data<float>() + b * qs[0] + h * qs[1];
      for (int i = 0; i < D; i++) {
        qrow[i] = scale * qh[i * qs[3]];
      }
      const size_t group = size_t(b) * KH + h / repeats;
      sdpa_head_factored(qrow.data(), keys[group], values[group], D, T, Dv, scores.data(), o + size_t(bh) * Dv);
    }
  });
}

// Inputs q [B, heads, 1, D], k [B, kv_heads, T, D], v [B, kv_heads, T, Dv]; params scale, and
// whether in the opt-in form.
void sdpa_rows_compute(const std::vector<array>& in, const RowOp::Params& p, array& out) {
  const array &q = in[0], &k = in[1], &v = in[2];
  const float scale = p[0];
  if (p[1] != 0) {
    sdpa_factored_heads(q, k, v, scale, out.data<float>());
    return;
  }
  const int B = q.shape(0), H = q.shape(1), D = q.shape(3), KH = k.shape(1), T = k.shape(2), Dv = v.shape(3);
  const int repeats = H / KH;
  const auto &qs = q.strides(), &ks = k.strides(), &vs = v.strides();
  std::vector<float> qrow(D), scores(T), kcopy, vcopy;
  float* o = out.data<float>();
  for (int b = 0; b < B; b++) {
    for (int g = 0; g < KH; g++) {
      // This group's keys and values, shared by its query heads: Kgᵀ [D, T] and Vg [T, Dv] as
      // MLX hands them to BLAS.
      const Operand kt = blas_operand(k.data<float>() + b * ks[0] + g * ks[1], D, T, ks[3], ks[2], kcopy);
      const Operand vg = blas_operand(v.data<float>() + b * vs[0] + g * vs[1], T, Dv, vs[2], vs[3], vcopy);
      for (int r = 0; r < repeats; r++) {
        const int h = g * repeats + r;
        const float* qh = q.data<float>() + b * qs[0] + h * qs[1];
        for (int i = 0; i < D; i++) {
          qrow[i] = scale * qh[i * qs[3]];
        }
        float* oh = o + (size_t(b) * H + h) * Dv;
        cblas_sgemm(kRowMajor, kNoTrans, kt.transposed ? kTrans : kNoTrans, 1, T, D, 1.0f, qrow.data(), D, kt.data, kt.ld, 0.0f,
                    scores.data(), T);
        softmax_row(scores.data(), T);
        cblas_sgemm(kRowMajor, kNoTrans, vg.transposed ? kTrans : kNoTrans, 1, Dv, T, 1.0f, scores.data(), T, vg.data, vg.ld, 0.0f, oh, Dv);
      }
    }
  }
}

}  // namespace
#endif

// Whether mlx_bun_sdpa_rows builds here: our kernels run, and a cblas_sgemm is bound.
extern "C" bool mlx_bun_sdpa_rows_fast() {
#if defined(MLX_BUN_SDPA_ROWS)
  return has_avx2() && cblas_sgemm != nullptr;
#else
  return false;
#endif
}

// Attention of q [B, heads, 1, D] over k [B, kv_heads, T, D] and v [B, kv_heads, T, Dv], all f32,
// heads a multiple of kv_heads, no mask, scaled by `scale`; the result [B, heads, 1, Dv] in f32.
// `factored`: the products in fused multiply-adds (the opt-in form; CPUs with FMA). Returns 0, or
// 1 with the reason in `err`.
extern "C" int mlx_bun_sdpa_rows(
    mlx_array* res,
    const mlx_array q_in,
    const mlx_array k_in,
    const mlx_array v_in,
    float scale,
    int factored,
    const mlx_stream s,
    char* err,
    size_t err_len) {
  return build_row_op("sdpa_rows", err, err_len, [&] {
    if (!mlx_bun_sdpa_rows_fast()) {
      throw std::invalid_argument("[sdpa_rows] needs our kernels' CPU and a cblas_sgemm");
    }
#if defined(MLX_BUN_SDPA_ROWS)
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
    if (factored && !has_fma()) {
      throw std::invalid_argument("[sdpa_rows] the factored form needs FMA");
    }
    const RowOp::Params params{scale, float(factored != 0), 0.0f};
    Shape shape{q.shape(0), H, 1, v.shape(3)};
    mlx_array_set_(*res, array(std::move(shape), float32, std::make_shared<RowOp>(mlx_stream_get_(s), "SdpaRows", sdpa_rows_compute, params), {q, k, v}));
#endif
  });
}
