// x · Wᵀ (+ bias) for bf16 or f16 x and W, bit for bit as MLX's CPU backend computes it, only
// faster. Included at the end of affine_rows.cpp (one translation unit: it uses that file's
// rounding types Bf16/F16, chunk_words, x_in_f32, store_half and has_avx2).
//
// Why: MLX's CPU matmul for half-precision types (`simd_gemm<T, float>` in
// mlx/backend/cpu/gemms/simd_gemm.h) runs one lane at a time where MLX has no SIMD types (x86_64):
// a bf16 model decoded ~8 tokens/s where its f32 copy, through BLAS, did ~18. Its arithmetic per
// output element is: acc = 0; for k ascending, acc += float(x[k]) * float(w[k]) in f32; then the
// result rounded to T (with a bias, `addmm`: float(bias) added in f32 first). A product of two
// half-precision values is exact in f32 (8- or 11-bit significands), so each step rounds once,
// at the addition, whatever the instructions. Here eight output rows sit in eight lanes, each
// lane one such sum in that order: the results equal MLX's on every x86_64 CPU. W's rows are read
// as 32-bit words (two values each) and turned eight rows at a time with transpose8, as the
// quantized kernel reads its packed words.

#include <optional>
#include <type_traits>

#if defined(__x86_64__)
namespace {

// The two values of each lane's word as f32: the first (low half) and the second (high half).
template <bool bf16>
KERNEL __attribute__((always_inline)) inline void halves_f32(__m256i w, __m256* first, __m256* second) {
  if constexpr (bf16) {
    *first = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    *second = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(int(0xFFFF0000u))));
  } else {
    const __m256i lo = _mm256_and_si256(w, _mm256_set1_epi32(0xFFFF)), hi = _mm256_srli_epi32(w, 16);
    *first = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1)));
    *second = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)));
  }
}

// Words [0, count) of sixteen rows (t0: rows 0-7, t1: rows 8-15, transposed) added into the
// lanes, values in order. Kept apart so that the sums stay in registers (see group_words).
template <bool bf16>
KERNEL __attribute__((noinline)) void half_words(float* acc, const __m256i* t0, const __m256i* t1, const float* x, int count) {
  __m256 acc0 = _mm256_loadu_ps(acc), acc1 = _mm256_loadu_ps(acc + 8);
  for (int i = 0; i < count; i++) {
    __m256 a0, b0, a1, b1;
    halves_f32<bf16>(t0[i], &a0, &b0);
    halves_f32<bf16>(t1[i], &a1, &b1);
    const __m256 xa = _mm256_broadcast_ss(x + 2 * i), xb = _mm256_broadcast_ss(x + 2 * i + 1);
    acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(xa, a0));
    acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(xa, a1));
    acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(xb, b0));
    acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(xb, b1));
  }
  _mm256_storeu_ps(acc, acc0);
  _mm256_storeu_ps(acc + 8, acc1);
}

// One half-precision value of W as f32.
template <bool bf16>
KERNEL inline float half_at(const uint16_t* w, size_t i) {
  if constexpr (bf16) {
    uint32_t bits = uint32_t(w[i]) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  } else {
    return _cvtsh_ss(w[i]);
  }
}

// Rows [n0, n1) of out [M, N] (f32 values, rounded to T) = x [M, K] · Wᵀ (+ bias [N]), W [N, K]
// of T. Each block of sixteen rows of W is read and turned once for all rows of x (their sums
// wait in `acc`).
template <bool bf16>
KERNEL void half_rows_range(const float* x, const uint16_t* w, const uint16_t* bias, float* out, int M, int N, int K, int n0, int n1) {
  using R = std::conditional_t<bf16, Bf16, F16>;
  const int words = K % 2 == 0 ? K / 2 : 0;  // rows read as words need an even length
  const uint32_t* ww = reinterpret_cast<const uint32_t*>(w);
  const __m256i stride = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(words));
  std::vector<float> acc(size_t(16) * M);  // each x row's sixteen sums
  int n = n0;
  for (; words > 0 && n + 16 <= n1; n += 16) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    const uint32_t* w0 = ww + size_t(n) * words;
    const uint32_t* w1 = w0 + size_t(8) * words;
    const char* next = reinterpret_cast<const char*>(w0 + size_t(16) * words);
    const char* next_end = reinterpret_cast<const char*>(ww + size_t(std::min(n + 32, n1)) * words);
    alignas(32) __m256i t0[8], t1[8];
    for (int c = 0; c < words; c += 8) {
      const int chunk = std::min(8, words - c);
      chunk_words(w0 + c, w1 + c, words, chunk, stride, next, next_end, t0, t1);
      for (int m = 0; m < M; m++) {
        half_words<bf16>(acc.data() + 16 * m, t0, t1, x + size_t(m) * K + size_t(c) * 2, chunk);
      }
    }
    alignas(32) float b[16] = {};
    if (bias) {
      for (int j = 0; j < 16; j++) {
        b[j] = half_at<bf16>(bias, n + j);
      }
    }
    for (int m = 0; m < M; m++) {
      for (int s = 0; s < 2; s++) {
        __m256 v = _mm256_loadu_ps(acc.data() + 16 * m + 8 * s);
        if (bias) {
          v = _mm256_add_ps(v, _mm256_load_ps(b + 8 * s));
        }
        _mm256_storeu_ps(out + size_t(m) * N + n + 8 * s, R::lanes(v));
      }
    }
  }
  // The rows left over (or every row, for an odd K): the same sums one at a time.
  for (; n < n1; n++) {
    const uint16_t* row = w + size_t(n) * K;
    for (int m = 0; m < M; m++) {
      const float* xm = x + size_t(m) * K;
      float sum = 0;
      for (int k = 0; k < K; k++) {
        sum += xm[k] * half_at<bf16>(row, k);
      }
      if (bias) {
        sum += half_at<bf16>(bias, n);
      }
      out[size_t(m) * N + n] = R::one(sum);
    }
  }
}

// All of out's rows, in blocks on every core (row_pool.h), each a multiple of sixteen rows: every
// output row is computed as in one pass over all of them.
template <bool bf16>
void half_rows(const float* x, const uint16_t* w, const uint16_t* bias, float* out, int M, int N, int K) {
  parallel_rows(N, 16, [&](int n0, int n1) { half_rows_range<bf16>(x, w, bias, out, M, N, K, n0, n1); });
}

// A product of x with a matrix and an optional bias (inputs 0, 1 and 2), both row-contiguous,
// computed on the stream's thread by `compute` (half_rows.h's and f32t_rows.h's kernels).
class MatrixProduct : public UnaryPrimitive {
 public:
  using Compute = void (*)(const array& x, const array& w, const array* bias, array& out);
  MatrixProduct(Stream stream, const char* name, Compute compute) : UnaryPrimitive(stream), name_(name), compute_(compute) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& x = inputs[0];
    auto& w = inputs[1];
    const array* bias = inputs.size() > 2 ? &inputs[2] : nullptr;
    for (auto* a : {&w, bias}) {
      if (a && !a->flags().row_contiguous) {
        throw std::runtime_error(std::string("[") + name_ + "] the matrix and bias must be row-contiguous");
      }
    }
    out.set_data(allocator::malloc(out.nbytes()));
    auto& encoder = cpu::get_command_encoder(stream());
    for (auto& a : inputs) {
      encoder.set_input_array(a);
    }
    encoder.set_output_array(out);
    encoder.dispatch([out = array::unsafe_weak_copy(out),
                      x = array::unsafe_weak_copy(x),
                      w = array::unsafe_weak_copy(w),
                      bias = bias ? std::optional<array>(array::unsafe_weak_copy(*bias)) : std::nullopt,
                      compute = compute_]() mutable { compute(x, w, bias ? &*bias : nullptr, out); });
  }

  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error(std::string("[") + name_ + "] runs on the CPU only");
  }

  const char* name() const override {
    return name_;
  }

  bool is_equivalent(const Primitive& other) const override {
    return compute_ == static_cast<const MatrixProduct&>(other).compute_;
  }

 private:
  const char* name_;
  Compute compute_;
};

// x, the matrix and the bias (if not null) as the inputs of a MatrixProduct.
std::vector<array> product_inputs(const mlx_array x, const mlx_array w, const mlx_array* bias) {
  std::vector<array> inputs = {mlx_array_get_(x), mlx_array_get_(w)};
  if (bias) {
    inputs.push_back(mlx_array_get_(*bias));
  }
  return inputs;
}

// Nothing here throws but an allocation failure: this runs on MLX's stream thread.
void half_rows_compute(const array& x, const array& w, const array* bias, array& out) {
  const int K = x.shape(-1), N = w.shape(0), M = int(x.size() / std::max(K, 1));
  std::vector<float> xs = x_in_f32(x), ys(out.size());
  const uint16_t* b = bias ? bias->data<uint16_t>() : nullptr;
  if (out.dtype() == bfloat16) {
    half_rows<true>(xs.data(), w.data<uint16_t>(), b, ys.data(), M, N, K);
  } else {
    half_rows<false>(xs.data(), w.data<uint16_t>(), b, ys.data(), M, N, K);
  }
  store_half(ys, out);
}

}  // namespace
#endif

// x [..., K] times Wᵀ (W [N, K]) plus `bias` [N] if not null, all of one dtype, bf16 or f16; the
// result [..., N] in that dtype, as MLX's matmul/addmm give it on the CPU. Returns 0, or 1 with
// the reason in `err`.
extern "C" int mlx_bun_half_rows_matmul(
    mlx_array* res,
    const mlx_array x_in,
    const mlx_array w_in,
    const mlx_array* bias_in,
    const mlx_stream s,
    char* err,
    size_t err_len) {
  try {
#if defined(__x86_64__)
    if (!has_avx2()) {
      throw std::invalid_argument("[half_rows_matmul] needs an x86_64 CPU with AVX2 and F16C (not macOS)");
    }
    auto stream = mlx_stream_get_(s);
    std::vector<array> inputs = product_inputs(x_in, w_in, bias_in);
    auto& x = inputs[0];
    auto& w = inputs[1];
    const Dtype t = w.dtype();
    if ((t != bfloat16 && t != float16) || x.dtype() != t || x.ndim() < 1 || w.ndim() != 2 || x.shape(-1) != w.shape(1) ||
        (bias_in && (inputs[2].dtype() != t || inputs[2].ndim() != 1 || inputs[2].shape(0) != w.shape(0)))) {
      throw std::invalid_argument("[half_rows_matmul] expects x [..., K], w [N, K] and a bias [N] of one dtype, bf16 or f16");
    }
    auto shape = x.shape();
    shape.back() = w.shape(0);
    mlx_array_set_(*res, array(std::move(shape), t, std::make_shared<MatrixProduct>(stream, "half_rows_matmul", half_rows_compute), std::move(inputs)));
    return 0;
#else
    throw std::invalid_argument("[half_rows_matmul] needs an x86_64 CPU with AVX2 and F16C (not macOS)");
#endif
  } catch (std::exception& e) {
    copy_message(e.what(), err, err_len);
    return 1;
  }
}
