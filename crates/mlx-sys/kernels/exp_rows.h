// MLX's exponential eight values at a time, and the decode step's operations built on it: the
// sampler's log-softmax (logits − logsumexp(logits)) and SwiGLU's silu(gate) · x, one graph node
// each, equal bit for bit to MLX's CPU ops; and the attention's softmax (sdpa_rows.h). Included at
// the end of affine_rows.cpp after row_ops.h (the file is built without contraction into fused
// multiply-adds).
//
// Why: every exponential MLX's CPU backend computes on x86_64 is `simd::exp<float, 1>` (its
// vector types exist only for Apple's Accelerate and NEON), one value at a time, each of its seven
// multiply-adds a call into libm (libmlx is built for CPUs without FMA). A SmolLM2 decode step
// takes ~50 000 of them for the logsumexp over the vocabulary, ~46 000 in SwiGLU and a few
// thousand per 100 positions in the attention: `perf` put them at ~15 % of the stream thread's
// time. Here the same operations run in AVX2 lanes with FMA (one rounding each, as libm's fmaf):
// lane by lane the same values.
//
// MLX's exp (mlx/backend/cpu/simd/math.h): y = x · log2(e); i = floor(y + 0.5), the addition in
// double (0.5 is a double literal there); f = y − i; p = the degree-6 polynomial in f by six
// fused multiply-adds; the result 2^i (as bits) · p, then NaN kept, > 88 to inf, < −88 to 0.

#if defined(__x86_64__) && !defined(__APPLE__)
#include <cmath>
#include <limits>

#include "mlx/backend/cpu/simd/simd.h"

namespace {

// MLX's exp of each lane.
KERNEL_FMA __attribute__((always_inline)) inline __m256 mlx_exp8(__m256 x_init) {
  const __m256 y = _mm256_mul_ps(x_init, _mm256_set1_ps(1.442695f));
  // floor(y + 0.5) in double, as MLX computes it, four lanes at a time.
  const __m256d half = _mm256_set1_pd(0.5);
  const __m128 lo = _mm256_cvtpd_ps(_mm256_floor_pd(_mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(y)), half)));
  const __m128 hi = _mm256_cvtpd_ps(_mm256_floor_pd(_mm256_add_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(y, 1)), half)));
  const __m256 ipart = _mm256_set_m128(hi, lo);
  const __m256 f = _mm256_sub_ps(y, ipart);
  __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.000000000000000f));
  // Truncation as C++'s float-to-int (the lanes where it overflows are replaced below).
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(ipart), _mm256_set1_epi32(127)), 23);
  __m256 r = _mm256_mul_ps(_mm256_castsi256_ps(e), p);
  r = _mm256_blendv_ps(r, x_init, _mm256_cmp_ps(x_init, x_init, _CMP_UNORD_Q));
  r = _mm256_blendv_ps(r, _mm256_set1_ps(std::numeric_limits<float>::infinity()), _mm256_cmp_ps(x_init, _mm256_set1_ps(88.0f), _CMP_GT_OQ));
  return _mm256_blendv_ps(r, _mm256_setzero_ps(), _mm256_cmp_ps(x_init, _mm256_set1_ps(-88.0f), _CMP_LT_OQ));
}

// MLX's exp of one value (its own function).
inline float mlx_exp1(float x) {
  return mlx::core::simd::exp(mlx::core::simd::Simd<float, 1>(x)).value;
}

// exp(x[i] − top) in place for i < n, a multiple of 8 (CPUs with FMA).
KERNEL_FMA void exp_minus8(float* x, int n, float top) {
  for (int i = 0; i < n; i += 8) {
    _mm256_storeu_ps(x + i, mlx_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(top))));
  }
}

// MLX's CPU softmax of one f32 row in place (mlx/backend/cpu/softmax.cpp, one lane on x86_64):
// the maximum, each exp(x − max) stored and summed in order from the first, then each times
// 1 / sum. With FMA the exponentials take eight lanes; the sum stays in order.
void softmax_row(float* x, int n) {
  using namespace mlx::core::simd;
  Simd<float, 1> vmax(-std::numeric_limits<float>::infinity());
  for (int i = 0; i < n; i++) {
    vmax = maximum(Simd<float, 1>(x[i]), vmax);
  }
  const float top = max(vmax);
  const int lanes = has_fma() ? n / 8 * 8 : 0;
  exp_minus8(x, lanes, top);
  for (int i = lanes; i < n; i++) {
    x[i] = mlx_exp1(x[i] - top);
  }
  float norm = 0.0f;
  for (int i = 0; i < n; i++) {
    norm = norm + x[i];
  }
  norm = 1 / norm;
  for (int i = 0; i < n; i++) {
    x[i] = x[i] * norm;
  }
}

// The rows (every axis but the last) of an f32 array, each a pointer to n values in order: read
// through the array's strides where its last axis is contiguous (a slice of a wider row, as a
// fused gate-and-up product's halves are), else from a row-major copy.
class F32Rows {
 public:
  explicit F32Rows(const array& a) : a_(a), n_(a.shape(-1)) {
    if (a.strides().back() != 1 && n_ > 1) {
      copy_ = x_in_f32(a);
    }
  }

  const float* row(size_t r) const {
    if (!copy_.empty()) {
      return copy_.data() + r * n_;
    }
    int64_t offset = 0;
    for (int d = int(a_.ndim()) - 2; d >= 0; d--) {
      offset += int64_t(r % a_.shape(d)) * a_.strides()[d];
      r /= a_.shape(d);
    }
    return a_.data<float>() + offset;
  }

 private:
  const array& a_;
  size_t n_;
  std::vector<float> copy_;
};

// Input x [..., n]: each row minus its logsumexp, as MLX's `logsumexp` (the LogSumExp primitive of
// mlx/backend/cpu/logsumexp.cpp over the last axis) and `subtract` compute it: the maximum m; the
// sum in order from the first of exp(x − m); lse = m if m is infinite, else log(sum) + m; then
// each x − lse. The maximum is taken in lanes: without a NaN it is the same value (but for the
// sign of a zero, which changes none of the results: x − (±0), log(sum) + (±0) and exp(±0)
// agree), and a row holding a NaN takes MLX's scalar steps.
KERNEL_FMA void log_softmax_compute(const std::vector<array>& in, const RowOp::Params&, array& out) {
  using namespace mlx::core::simd;
  const F32Rows rows(in[0]);
  const int n = in[0].shape(-1);
  const size_t count = in[0].size() / n;
  alignas(32) float lanes[8];
  for (size_t r = 0; r < count; r++) {
    const float* x = rows.row(r);
    float* o = out.data<float>() + r * n;
    __m256 m8 = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), nan8 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      m8 = _mm256_max_ps(m8, v);
      nan8 = _mm256_or_ps(nan8, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    _mm256_store_ps(lanes, m8);
    bool nan = _mm256_movemask_ps(nan8) != 0;
    float m = -std::numeric_limits<float>::infinity();
    for (float l : lanes) {
      m = l > m ? l : m;
    }
    for (; i < n; i++) {
      nan = nan || std::isnan(x[i]);
      m = x[i] > m ? x[i] : m;
    }
    if (nan) {
      Simd<float, 1> vmax(-std::numeric_limits<float>::infinity());
      for (int k = 0; k < n; k++) {
        vmax = maximum(Simd<float, 1>(x[k]), vmax);
      }
      m = max(vmax);
    }
    float sum = 0.0f;
    i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm256_store_ps(lanes, mlx_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(m))));
      for (float e : lanes) {
        sum = sum + e;
      }
    }
    for (; i < n; i++) {
      sum = sum + mlx_exp1(x[i] - m);
    }
    const float lse = std::isinf(m) ? m : std::log(sum) + m;
    i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(o + i, _mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(lse)));
    }
    for (; i < n; i++) {
      o[i] = x[i] - lse;
    }
  }
}

// MLX's sigmoid (mlx/backend/cpu/unary_ops.h): y = 1 / (1 + exp(|x|)); y where x < 0, else 1 − y.
KERNEL_FMA __attribute__((always_inline)) inline __m256 mlx_sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 y = _mm256_div_ps(one, _mm256_add_ps(one, mlx_exp8(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x))));
  return _mm256_blendv_ps(_mm256_sub_ps(one, y), y, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
}

inline float mlx_sigmoid1(float x) {
  const float y = 1.0f / (1.0f + mlx_exp1(std::abs(x)));
  return x < 0 ? y : 1.0f - y;
}

// Inputs gate, x (one shape, f32): (gate · sigmoid(gate)) · x, each product rounded, as mlx-lm's
// compiled `swiglu` computes it on MLX's CPU backend.
KERNEL_FMA void swiglu_compute(const std::vector<array>& in, const RowOp::Params&, array& out) {
  const F32Rows gates(in[0]), xs(in[1]);
  const int n = in[0].shape(-1);
  const size_t count = in[0].size() / n;
  for (size_t r = 0; r < count; r++) {
    const float *g = gates.row(r), *x = xs.row(r);
    float* o = out.data<float>() + r * n;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_loadu_ps(g + i);
      _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(v, mlx_sigmoid8(v)), _mm256_loadu_ps(x + i)));
    }
    for (; i < n; i++) {
      o[i] = (g[i] * mlx_sigmoid1(g[i])) * x[i];
    }
  }
}

}  // namespace
#define MLX_BUN_EXP_ROWS 1
#endif

// Builds one of the two nodes: f32 inputs of one shape [..., n], n ≥ 1; CPUs with FMA.
template <class F>
int build_exp_row_op(const char* name, char* err, size_t err_len, F&& build) {
  return build_row_op(name, err, err_len, [&] {
    if (!has_fma()) {
      throw std::invalid_argument(std::string("[") + name + "] needs FMA");
    }
    build();
  });
}

// Each row of x [..., n] (f32) minus its logsumexp: MLX's `x − logsumexp(x, -1, keepdims)` bit
// for bit. Returns 0, or 1 with the reason in `err`.
extern "C" int mlx_bun_log_softmax_rows(mlx_array* res, const mlx_array x_in, const mlx_stream s, char* err, size_t err_len) {
  return build_exp_row_op("log_softmax_rows", err, err_len, [&] {
#if defined(MLX_BUN_EXP_ROWS)
    auto& x = mlx_array_get_(x_in);
    if (x.ndim() < 1 || x.shape(-1) < 1 || x.dtype() != float32) {
      throw std::invalid_argument("[log_softmax_rows] expects x [..., n] in f32");
    }
    mlx_array_set_(*res, array(x.shape(), float32, std::make_shared<RowOp>(mlx_stream_get_(s), "LogSoftmaxRows", log_softmax_compute, RowOp::Params{}), {x}));
#endif
  });
}

// silu(gate) · x for gate and x of one shape [..., n] in f32: mlx-lm's compiled `swiglu` bit for
// bit. Returns 0, or 1 with the reason in `err`.
extern "C" int mlx_bun_swiglu_rows(mlx_array* res, const mlx_array gate_in, const mlx_array x_in, const mlx_stream s, char* err, size_t err_len) {
  return build_exp_row_op("swiglu_rows", err, err_len, [&] {
#if defined(MLX_BUN_EXP_ROWS)
    auto& gate = mlx_array_get_(gate_in);
    auto& x = mlx_array_get_(x_in);
    if (gate.ndim() < 1 || gate.shape(-1) < 1 || gate.dtype() != float32 || x.dtype() != float32 || x.shape() != gate.shape()) {
      throw std::invalid_argument("[swiglu_rows] expects gate and x of one shape [..., n] in f32");
    }
    mlx_array_set_(*res, array(gate.shape(), float32, std::make_shared<RowOp>(mlx_stream_get_(s), "SwigluRows", swiglu_compute, RowOp::Params{}), {gate, x}));
#endif
  });
}
