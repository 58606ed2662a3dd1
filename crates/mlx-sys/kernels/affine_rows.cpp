// x · Wᵀ for a matrix W in MLX's affine quantization (w = scale·q + bias per group of columns),
// computed on the CPU eight output rows at a time in AVX2 lanes.
//
// Why: MLX's CPU kernel for this product (`_qmm_t` in mlx/backend/cpu/quantized.cpp) is scalar on
// x86_64 (its SIMD path exists only where MLX has SIMD types, i.e. Apple's Accelerate): one
// multiply-add chain per output element, ~10 tokens/s for a 135M 4-bit model on two cores, and
// 7x (bf16) to 35x (f16) slower again in half precision, whose arithmetic MLX emulates there.
// Each output element here is computed with exactly MLX's operations in exactly its order: the
// sum over columns k, ascending, of x[k] * (scale * q[k] + bias), in the product's dtype T
// (f32, bf16 or f16), every operation done in f32 and rounded to T as MLX's T does (no fused
// multiply-add: the file is built with -ffp-contract=off and the AVX2 code is not given FMA).
// Lanes hold different output rows, never parts of one sum, so the results equal MLX's bit for
// bit on every x86_64 CPU; the scalar function below is the same order for the rows left over.
//
// It is an MLX primitive, so it joins the lazy graph like any operation and runs on the stream
// it was built on (the engine splits big products over two CPU streams, one per core).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "mlx/c/private/mlx.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "row_pool.h"

namespace {

using namespace mlx::core;

#if defined(__x86_64__)
#define KERNEL __attribute__((target("avx2,f16c")))
#define KERNEL_FMA __attribute__((target("avx2,fma,f16c")))

// Whether this process runs the kernel: a CPU with AVX2 and F16C, and not macOS (MLX built with
// Accelerate has a vectorised kernel there, whose sums run in another order).
bool has_avx2() {
#if defined(__APPLE__)
  return false;
#else
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return yes;
#endif
}

// Whether the factored form (factored_rows.h) runs here: fused multiply-adds.
bool has_fma() {
  static const bool yes = has_avx2() && __builtin_cpu_supports("fma");
  return yes;
}

// The rounding types (F32, Bf16, F16), values read in f32, f16 or bf16, and arrays' values read
// and written as f32: what every kernel here shares.
#include "values.h"

struct Operands {
  const float* x;  // [M, K] in f32 (values of T)
  const uint32_t* w;  // [N, K * bits / 32]
  const void* scales;  // [N, K / group_size], f32, f16 or bf16 (whose values T holds)
  const void* biases;
  Dtype scale_type;
  float* out;  // [M, N] in f32 (values of T)
  int M, N, K, group_size;
};

// Row n's packed words, and its k-th value (the rows left over from the vector loops).
template <int bits>
inline const uint32_t* row(const Operands& o, int n) {
  return o.w + size_t(n) * (o.K / (32 / bits));
}

template <int bits>
inline float value_at(const uint32_t* w, int k) {
  constexpr int per_word = 32 / bits;
  return float((w[k / per_word] >> ((k % per_word) * bits)) & ((1u << bits) - 1));
}

template <int bits, class R>
KERNEL void rows_scalar(const Operands& o, const float* x, float* out, int n0, int n1) {
  const size_t groups = o.K / o.group_size;
  for (int n = n0; n < n1; n++) {
    const uint32_t* w = row<bits>(o, n);
    float sum = 0;
    for (int k = 0; k < o.K; k++) {
      size_t g = n * groups + k / o.group_size;
      float scale = load_f32(o.scales, g, o.scale_type), bias = load_f32(o.biases, g, o.scale_type);
      float q = value_at<bits>(w, k);
      float t = R::one(scale * q);
      t = R::one(t + bias);
      t = R::one(x[k] * t);
      sum = R::one(sum + t);
    }
    out[n] = sum;
  }
}

// Eight rows' scales (or biases) of group g, as f32 lanes.
KERNEL inline __m256 load8(const Operands& o, const void* p, int n, int g) {
  const int groups = o.K / o.group_size;
  const size_t i = size_t(n) * groups + g;
  if (o.scale_type == float32) {
    const float* f = static_cast<const float*>(p) + i;
    return _mm256_setr_ps(f[0], f[groups], f[2 * groups], f[3 * groups], f[4 * groups], f[5 * groups], f[6 * groups], f[7 * groups]);
  }
  const uint16_t* h = static_cast<const uint16_t*>(p) + i;
  __m128i v = _mm_setr_epi16(h[0], h[groups], h[2 * groups], h[3 * groups], h[4 * groups], h[5 * groups], h[6 * groups], h[7 * groups]);
  if (o.scale_type == float16) {
    return _mm256_cvtph_ps(v);
  }
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

// One step of eight lanes: acc += x * (scale * q + bias), each operation rounded to T.
template <class R>
KERNEL __attribute__((always_inline)) inline __m256
step(__m256 acc, __m256i word, __m256i mask, __m256 scale, __m256 bias, __m256 x) {
  __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(word, mask));
  __m256 t = R::lanes(_mm256_mul_ps(scale, q));
  t = R::lanes(_mm256_add_ps(t, bias));
  t = R::lanes(_mm256_mul_ps(x, t));
  return R::lanes(_mm256_add_ps(acc, t));
}

// Words c..c+7 of eight rows `stride` words apart, turned so that t[i] holds word c+i of each row.
KERNEL __attribute__((always_inline)) inline void transpose8(const uint32_t* w, size_t stride, __m256i* t) {
  __m256i r[8], a[8], b[8];
  for (int i = 0; i < 8; i++) {
    r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i * stride));
  }
  for (int i = 0; i < 8; i += 2) {
    a[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    a[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    b[i] = _mm256_unpacklo_epi64(a[i], a[i + 2]);
    b[i + 1] = _mm256_unpackhi_epi64(a[i], a[i + 2]);
    b[i + 2] = _mm256_unpacklo_epi64(a[i + 1], a[i + 3]);
    b[i + 3] = _mm256_unpackhi_epi64(a[i + 1], a[i + 3]);
  }
  for (int i = 0; i < 4; i++) {
    t[i] = _mm256_permute2x128_si256(b[i], b[i + 4], 0x20);
    t[i + 4] = _mm256_permute2x128_si256(b[i], b[i + 4], 0x31);
  }
}

// Words [0, chunk) (eight, or a row's last few) of sixteen rows, w0: rows 0-7 and w1: rows 8-15,
// each `words` apart, turned into t0 and t1 as transpose8 turns them (fewer than eight by one
// gather per word, `stride` holding 0, words, 2·words...). Also fetches a little of the next
// block of rows, from `next` up to `next_end`, so that their loads do not wait on memory (16
// streams at once are more than the hardware prefetcher follows; the loads were half of the
// quantized kernel's time without this).
KERNEL __attribute__((always_inline)) inline void chunk_words(const uint32_t* w0, const uint32_t* w1, int words, int chunk, __m256i stride,
                                                              const char*& next, const char* next_end, __m256i* t0, __m256i* t1) {
  if (chunk == 8) {
    for (int l = 0; l < 8 && next < next_end; l++, next += 64) {
      _mm_prefetch(next, _MM_HINT_T0);
    }
    transpose8(w0, words, t0);
    transpose8(w1, words, t1);
  } else {
    for (int i = 0; i < chunk; i++) {
      t0[i] = _mm256_i32gather_epi32(reinterpret_cast<const int*>(w0 + i), stride, 4);
      t1[i] = _mm256_i32gather_epi32(reinterpret_cast<const int*>(w1 + i), stride, 4);
    }
  }
}

// Words [0, count) of one group for sixteen rows (t0: rows 0-7, t1: rows 8-15, transposed),
// added into the two sets of lanes. Kept apart from the transposition so that the compiler holds
// the sums in registers (inlined into one loop, they were spilled to the stack at every word: a
// store and a load on each sum's chain of dependent additions).
template <int bits, class R>
KERNEL __attribute__((noinline)) void group_words(__m256* acc, const __m256i* t0, const __m256i* t1, const float* x, int count,
                                                  __m256 s0, __m256 b0, __m256 s1, __m256 b1) {
  constexpr int per_word = 32 / bits;
  const __m256i mask = _mm256_set1_epi32((1u << bits) - 1);
  __m256 acc0 = acc[0], acc1 = acc[1];
  for (int i = 0; i < count; i++) {
    __m256i v0 = t0[i], v1 = t1[i];
    const float* xk = x + size_t(i) * per_word;
#pragma GCC unroll 1
    for (int j = 0; j < per_word; j++) {
      const __m256 xj = _mm256_broadcast_ss(xk + j);
      acc0 = step<R>(acc0, v0, mask, s0, b0, xj);
      acc1 = step<R>(acc1, v1, mask, s1, b1, xj);
      v0 = _mm256_srli_epi32(v0, bits);
      v1 = _mm256_srli_epi32(v1, bits);
    }
  }
  acc[0] = acc0, acc[1] = acc1;
}

// Rows [n0, n1) sixteen at a time (two sets of lanes in flight hide the latency of the
// additions, each lane's sum being one dependent chain); returns the first row not done. Words
// are read eight per row at once and transposed (a gather per word is several times slower).
template <int bits, class R>
KERNEL int rows_avx2(const Operands& o, const float* x, float* out, int n0, int n1) {
  constexpr int per_word = 32 / bits;
  const int words = o.K / per_word, words_per_group = o.group_size / per_word;
  const __m256i stride = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(words));
  int n = n0;
  for (; n + 16 <= n1; n += 16) {
    alignas(32) __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    const uint32_t* w0 = o.w + size_t(n) * words;
    const uint32_t* w1 = w0 + size_t(8) * words;
    // The sixteen rows of the next block follow these in memory: fetched a little at each
    // transposition (chunk_words).
    const char* next = reinterpret_cast<const char*>(w0 + size_t(16) * words);
    const char* next_end = reinterpret_cast<const char*>(o.w + size_t(std::min(n + 32, n1)) * words);
    // And their scales and biases, at once (a sixth of the weights' bytes or less).
    const size_t scale_bytes = o.scale_type == float32 ? 4 : 2, groups = o.K / o.group_size;
    for (const void* p : {o.scales, o.biases}) {
      const char* from = static_cast<const char*>(p) + size_t(std::min(n + 16, n1)) * groups * scale_bytes;
      const char* to = static_cast<const char*>(p) + size_t(std::min(n + 32, n1)) * groups * scale_bytes;
      for (; from < to; from += 64) {
        _mm_prefetch(from, _MM_HINT_T0);
      }
    }
    alignas(32) __m256i t0[8], t1[8];
    for (int c = 0; c < words; c += 8) {
      const int chunk = std::min(8, words - c);
      chunk_words(w0 + c, w1 + c, words, chunk, stride, next, next_end, t0, t1);
      // The chunk's words group by group (a group may start or end inside it).
      for (int i = 0; i < chunk;) {
        const int g = (c + i) / words_per_group;
        const int count = std::min(chunk - i, words_per_group - (c + i) % words_per_group);
        const __m256 s0 = load8(o, o.scales, n, g), b0 = load8(o, o.biases, n, g);
        const __m256 s1 = load8(o, o.scales, n + 8, g), b1 = load8(o, o.biases, n + 8, g);
        group_words<bits, R>(acc, t0 + i, t1 + i, x + size_t(c + i) * per_word, count, s0, b0, s1, b1);
        i += count;
      }
    }
    _mm256_storeu_ps(out + n, acc[0]);
    _mm256_storeu_ps(out + n + 8, acc[1]);
  }
  return n;
}

// Sixteen rows of W (from row n) as their values in T, MLX's scale · q + bias rounded as MLX rounds
// them: dq[k * 16 + r] is row n + r's value at column k. The part of each term that does not
// depend on x, computed once for every row of x.
template <int bits, class R>
KERNEL void dequantize16(const Operands& o, int n, int n1, float* dq) {
  constexpr int per_word = 32 / bits;
  const int words = o.K / per_word, words_per_group = o.group_size / per_word;
  const __m256i stride = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(words));
  const __m256i mask = _mm256_set1_epi32((1u << bits) - 1);
  const uint32_t* w0 = o.w + size_t(n) * words;
  const uint32_t* w1 = w0 + size_t(8) * words;
  const char* next = reinterpret_cast<const char*>(w0 + size_t(16) * words);
  const char* next_end = reinterpret_cast<const char*>(o.w + size_t(std::min(n + 32, n1)) * words);
  alignas(32) __m256i t0[8], t1[8];
  // The current group's scales and biases, read again only when a word starts another group.
  __m256 s0 = _mm256_setzero_ps(), b0 = s0, s1 = s0, b1 = s0;
  for (int c = 0, loaded = -1; c < words; c += 8) {
    const int chunk = std::min(8, words - c);
    chunk_words(w0 + c, w1 + c, words, chunk, stride, next, next_end, t0, t1);
    for (int i = 0; i < chunk; i++) {
      if (const int g = (c + i) / words_per_group; g != loaded) {
        s0 = load8(o, o.scales, n, g), b0 = load8(o, o.biases, n, g);
        s1 = load8(o, o.scales, n + 8, g), b1 = load8(o, o.biases, n + 8, g);
        loaded = g;
      }
      __m256i v0 = t0[i], v1 = t1[i];
      float* d = dq + size_t(c + i) * per_word * 16;
      for (int j = 0; j < per_word; j++, d += 16) {
        _mm256_store_ps(d, R::lanes(_mm256_add_ps(R::lanes(_mm256_mul_ps(s0, _mm256_cvtepi32_ps(_mm256_and_si256(v0, mask)))), b0)));
        _mm256_store_ps(d + 8, R::lanes(_mm256_add_ps(R::lanes(_mm256_mul_ps(s1, _mm256_cvtepi32_ps(_mm256_and_si256(v1, mask)))), b1)));
        v0 = _mm256_srli_epi32(v0, bits);
        v1 = _mm256_srli_epi32(v1, bits);
      }
    }
  }
}

// MR rows of x (from row m) times sixteen dequantized rows of W: each output's sum of
// x[k] · w[k] over k ascending, rounded as rows_avx2 rounds it (the same operations in the same
// order, so the same numbers). MR rows share each load of dq and keep 2·MR sums in flight.
template <int MR, class R>
KERNEL void apply16(const Operands& o, const float* dq, int m, int n) {
  __m256 acc[MR][2];
  for (int r = 0; r < MR; r++) {
    acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  }
  const float* x = o.x + size_t(m) * o.K;
  for (int k = 0; k < o.K; k++) {
    const __m256 d0 = _mm256_load_ps(dq + size_t(k) * 16), d1 = _mm256_load_ps(dq + size_t(k) * 16 + 8);
    for (int r = 0; r < MR; r++) {
      const __m256 xk = _mm256_broadcast_ss(x + size_t(r) * o.K + k);
      acc[r][0] = R::lanes(_mm256_add_ps(acc[r][0], R::lanes(_mm256_mul_ps(xk, d0))));
      acc[r][1] = R::lanes(_mm256_add_ps(acc[r][1], R::lanes(_mm256_mul_ps(xk, d1))));
    }
  }
  for (int r = 0; r < MR; r++) {
    float* out = o.out + size_t(m + r) * o.N + n;
    _mm256_storeu_ps(out, acc[r][0]);
    _mm256_storeu_ps(out + 8, acc[r][1]);
  }
}

// Rows [n0, n1) of W for every row of x, sixteen W rows at a time, each dequantized once into
// `dq` (K · 16 values); returns the first row not done.
template <int bits, class R>
KERNEL int rows_avx2_many(const Operands& o, float* dq, int n0, int n1) {
  int n = n0;
  for (; n + 16 <= n1; n += 16) {
    dequantize16<bits, R>(o, n, n1, dq);
    int m = 0;
    for (; m + 4 <= o.M; m += 4) {
      apply16<4, R>(o, dq, m, n);
    }
    for (; m < o.M; m++) {
      apply16<1, R>(o, dq, m, n);
    }
  }
  return n;
}

// Blocks of W's rows on every core (row_pool.h), each a multiple of rows_avx2's sixteen: every
// output row is computed as in one pass over all of them. Products of several rows of x (prompts,
// batched decode steps) dequantize W's rows once for all of them (rows_avx2_many: a 128-token
// prompt's products ~2x faster); one row reads W's words straight into its sums.
template <int bits, class R>
void compute(const Operands& o) {
  parallel_rows(o.N, 16, [&](int n0, int n1) {
    int n = n0;
    if (o.M > 1) {
      // K · 16 values from a 32-byte boundary (the vector loads and stores need it).
      std::vector<float> dq(size_t(o.K) * 16 + 8);
      const uintptr_t at = reinterpret_cast<uintptr_t>(dq.data());
      n = rows_avx2_many<bits, R>(o, dq.data() + ((32 - at % 32) % 32) / sizeof(float), n0, n1);
    }
    for (int m = 0; m < o.M; m++) {
      const float* x = o.x + size_t(m) * o.K;
      float* out = o.out + size_t(m) * o.N;
      const int done = o.M > 1 ? n : rows_avx2<bits, R>(o, x, out, n0, n1);
      rows_scalar<bits, R>(o, x, out, done, n1);
    }
  });
}

template <class R>
void compute_bits(const Operands& o, int bits) {
  switch (bits) {
    case 2: compute<2, R>(o); break;
    case 4: compute<4, R>(o); break;
    default: compute<8, R>(o); break;
  }
}

// The opt-in factored form, a row at a time (it uses Operands, scale_at and KERNEL_FMA above),
// and the int8 form (it uses the factored form's lanes_sum and PREFETCH_ROWS too).
#include "factored_rows.h"
#include "q8_rows.h"
#else
bool has_avx2() {
  return false;
}
bool has_fma() {
  return false;
}
#endif

// How a product computes: MLX's order; the factored form (factored_rows.h); the int8 form
// (q8_rows.h) where it fits, else the factored one.
enum class Form { Mlx = 0, Factored = 1, Int8 = 2 };

class AffineRowsMatmul : public UnaryPrimitive {
 public:
  AffineRowsMatmul(Stream stream, int group_size, int bits, Form form)
      : UnaryPrimitive(stream), group_size_(group_size), bits_(bits), form_(form) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& x = inputs[0];
    auto& w = inputs[1];
    auto& scales = inputs[2];
    auto& biases = inputs[3];
    for (auto* a : {&w, &scales, &biases}) {
      if (!a->flags().row_contiguous) {
        throw std::runtime_error("[affine_rows_matmul] quantized matrices must be row-contiguous");
      }
    }
#if defined(__x86_64__)
    out.set_data(allocator::malloc(out.nbytes()));
    auto& encoder = cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    encoder.set_input_array(w);
    encoder.set_input_array(scales);
    encoder.set_input_array(biases);
    encoder.set_output_array(out);
    encoder.dispatch([out = array::unsafe_weak_copy(out),
                      x = array::unsafe_weak_copy(x),
                      w = array::unsafe_weak_copy(w),
                      scales = array::unsafe_weak_copy(scales),
                      biases = array::unsafe_weak_copy(biases),
                      group_size = group_size_,
                      bits = bits_,
                      form = form_]() mutable {
      // Nothing here throws but an allocation failure: this runs on MLX's stream thread.
      int K = x.shape(-1);
      // f32 results go straight to `out`; half-precision ones through f32 lanes first.
      const bool f32_out = out.dtype() == float32;
      std::vector<float> xs = x_in_f32(x), ys(f32_out ? 0 : out.size());
      float* dst = f32_out ? out.data<float>() : ys.data();
      Operands o{xs.data(), w.data<uint32_t>(), scales.data<void>(), biases.data<void>(), scales.dtype(), dst, int(x.size() / K), w.shape(0), K, group_size};
      if (f32_out && form == Form::Int8 && q8_fits(bits, group_size, K)) {
        q8_bits(o, bits);
      } else if (f32_out && form != Form::Mlx && factored_fits(o, bits)) {
        factored_bits(o, bits);
      } else if (f32_out) {
        compute_bits<F32>(o, bits);
      } else if (out.dtype() == bfloat16) {
        compute_bits<Bf16>(o, bits);
        store_half(ys, out);
      } else {
        compute_bits<F16>(o, bits);
        store_half(ys, out);
      }
    });
#else
    throw std::runtime_error("[affine_rows_matmul] needs an x86_64 CPU with AVX2 and F16C");
#endif
  }

  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("[affine_rows_matmul] runs on the CPU only");
  }

  const char* name() const override {
    return "AffineRowsMatmul";
  }

  bool is_equivalent(const Primitive& other) const override {
    auto& o = static_cast<const AffineRowsMatmul&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_ && form_ == o.form_;
  }

 private:
  int group_size_;
  int bits_;
  Form form_;
};

void copy_message(const char* what, char* err, size_t err_len) {
  if (err && err_len) {
    std::strncpy(err, what, err_len - 1);
    err[err_len - 1] = 0;
  }
}

}  // namespace

// Whether the kernel runs here (`has_avx2`); elsewhere the builder below refuses.
extern "C" bool mlx_bun_affine_rows_fast() {
  return has_avx2();
}

// Whether an f32 product of rows of K values with a matrix of `bits` in groups of `group_size`
// takes the int8 form here (where it does not, `form` 2 takes the factored one).
extern "C" bool mlx_bun_affine_int8_fits(int bits, int group_size, int K) {
#if defined(__x86_64__)
  return has_fma() && q8_fits(bits, group_size, K);
#else
  return false;
#endif
}

// x [..., K] times Wᵀ, W of N rows quantized with `bits` (2, 4 or 8) in groups of `group_size`;
// the result [..., N] is in the promoted type of x and the scales, as quantized_matmul's is.
// `form`: 0 MLX's order; 1 an f32 product in the factored form where the CPU has FMA (MLX's
// order elsewhere); 2 as 1, but at 4 and 8 bits in the int8 form (x quantized to 8 bits).
// Returns 0, or 1 with the reason in `err`.
extern "C" int mlx_bun_affine_rows_matmul(
    mlx_array* res,
    const mlx_array x_in,
    const mlx_array w_in,
    const mlx_array scales_in,
    const mlx_array biases_in,
    int group_size,
    int bits,
    int form,
    const mlx_stream s,
    char* err,
    size_t err_len) {
  try {
    if (!has_avx2()) {
      throw std::invalid_argument("[affine_rows_matmul] needs an x86_64 CPU with AVX2 and F16C (not macOS)");
    }
    auto stream = mlx_stream_get_(s);
    auto& x = mlx_array_get_(x_in);
    auto& w = mlx_array_get_(w_in);
    auto& scales = mlx_array_get_(scales_in);
    auto& biases = mlx_array_get_(biases_in);
    if (bits != 2 && bits != 4 && bits != 8) {
      throw std::invalid_argument("[affine_rows_matmul] bits must be 2, 4 or 8");
    }
    if (x.ndim() < 1 || w.ndim() != 2 || w.dtype() != uint32 || scales.ndim() != 2 ||
        scales.shape() != biases.shape() || scales.dtype() != biases.dtype() ||
        (scales.dtype() != float32 && scales.dtype() != float16 && scales.dtype() != bfloat16)) {
      throw std::invalid_argument("[affine_rows_matmul] expects x [..., K], w [N, K·bits/32] uint32, scales and biases [N, K/group] of one float type");
    }
    int K = x.shape(-1);
    if (group_size <= 0 || group_size % (32 / bits) != 0 || K % group_size != 0 ||
        int64_t(w.shape(1)) * (32 / bits) != K || scales.shape(0) != w.shape(0) ||
        scales.shape(1) != K / group_size) {
      throw std::invalid_argument("[affine_rows_matmul] shapes do not match the group size and bits");
    }
    // MLX multiplies in the promoted type of x and the scales; both convert to it exactly.
    Dtype type = promote_types(x.dtype(), scales.dtype());
    auto half_or_f32 = [](Dtype t) { return t == float32 || t == bfloat16 || t == float16; };
    if (!half_or_f32(x.dtype()) || !half_or_f32(type)) {
      throw std::invalid_argument("[affine_rows_matmul] x must be f32, bf16 or f16");
    }
    auto shape = x.shape();
    shape.back() = w.shape(0);
    mlx_array_set_(
        *res,
        array(
            std::move(shape),
            type,
            std::make_shared<AffineRowsMatmul>(stream, group_size, bits, type == float32 && has_fma() && form >= 1 && form <= 2 ? Form(form) : Form::Mlx),
            {x, w, scales, biases}));
    return 0;
  } catch (std::exception& e) {
    copy_message(e.what(), err, err_len);
    return 1;
  }
}

// bf16 and f16 products in MLX's order (uses the rounding types, transpose8 and x_in_f32 above).
#include "half_rows.h"

// f32 products of a few rows with a matrix held transposed, under `f32Matmuls: 'all'`.
#include "f32t_rows.h"

// RoPE's rotation and RMSNorm in one node each, in the operations of MLX's fallbacks (they use
// the rounding types, to_f32 and x_in_f32).
#include "row_ops.h"
#include "rope_rows.h"
#include "rms_rows.h"

// MLX's exp in lanes: the sampler's log-softmax and SwiGLU in one node each, and the softmax
// the attention below uses.
#include "exp_rows.h"

// Attention of one query position in one node (MLX's fallback's BLAS calls and softmax).
#include "sdpa_rows.h"
