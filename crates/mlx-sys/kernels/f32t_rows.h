// x · Wt (+ bias) for f32 x [M, K] and an f32 matrix held transposed, Wt [K, N] (what the opt-in
// `f32Matmuls: 'all'` holds), for products of a few rows of x (decode steps). Included at the end
// of affine_rows.cpp (one translation unit: it uses KERNEL_FMA, has_fma, parallel_rows, x_in_f32,
// copy_message, and half_rows.h's MatrixProduct).
//
// Why: MLX multiplies f32 matrices with BLAS's sgemm, and OpenBLAS (0.3.21, Debian's) copies the
// whole matrix into its packed layout at every call, however few rows x has: for Gemma-3's Q6_K
// matrices (held in f32, nine 640 × 2048 a step) the copies were 15 % of a decode step's samples
// (`perf`: sgemm_itcopy), every byte read twice and written once. Here each row k of Wt is read
// once, and each output is one chain of fused multiply-adds over k ascending, then the bias: not
// BLAS's order (the opt-in measures what it changes with the eval instrument), the same whatever
// the number of x rows and whichever core computes it.

#if defined(__x86_64__)
namespace {

// Columns [n0, n1) of out [M, N], their sums kept in `acc` while Wt's rows pass.
KERNEL_FMA void f32t_range(const float* x, const float* wt, const float* bias, float* out, int M, int K, int N, int n0, int n1) {
  const int width = n1 - n0, vectors = width / 8;
  std::vector<float> acc(size_t(M) * width, 0.0f);
  for (int k = 0; k < K; k++) {
    const float* row = wt + size_t(k) * N + n0;
    // The row four ahead, asked for now: rows are N floats apart, so the hardware prefetcher,
    // which follows addresses within a page, does not see where the next one starts.
    if (k + 4 < K) {
      const char* ahead = reinterpret_cast<const char*>(row + size_t(4) * N);
      for (int b = 0; b < width * 4; b += 64) {
        _mm_prefetch(ahead + b, _MM_HINT_T0);
      }
    }
    for (int m = 0; m < M; m++) {
      const float xk = x[size_t(m) * K + k];
      const __m256 xv = _mm256_set1_ps(xk);
      float* a = acc.data() + size_t(m) * width;
      for (int v = 0; v < vectors; v++) {
        _mm256_storeu_ps(a + 8 * v, _mm256_fmadd_ps(xv, _mm256_loadu_ps(row + 8 * v), _mm256_loadu_ps(a + 8 * v)));
      }
      for (int j = vectors * 8; j < width; j++) {
        a[j] = __builtin_fmaf(xk, row[j], a[j]);
      }
    }
  }
  for (int m = 0; m < M; m++) {
    for (int j = 0; j < width; j++) {
      const float sum = acc[size_t(m) * width + j];
      out[size_t(m) * N + n0 + j] = bias ? sum + bias[n0 + j] : sum;
    }
  }
}

// Nothing here throws but an allocation failure: this runs on MLX's stream thread.
void f32t_rows_compute(const array& x, const array& wt, const array* bias, array& out) {
  const int K = wt.shape(0), N = wt.shape(1), M = int(x.size() / std::max(K, 1));
  std::vector<float> xs = x_in_f32(x);
  const float* b = bias ? bias->data<float>() : nullptr;
  float* o = out.data<float>();
  // Blocks of columns on every core (row_pool.h), in whole vectors.
  parallel_rows(N, 8, [&](int n0, int n1) { f32t_range(xs.data(), wt.data<float>(), b, o, M, K, N, n0, n1); });
}

}  // namespace
#endif

// Whether our kernels' forms in fused multiply-adds run here (mlx_bun_f32t_rows_matmul, the
// factored form of mlx_bun_affine_rows_matmul): our kernels' CPUs with FMA.
extern "C" bool mlx_bun_fma_kernels() {
#if defined(__x86_64__)
  return has_fma();
#else
  return false;
#endif
}

// x [..., K] times Wt [K, N] plus `bias` [N] if not null, all f32; the result [..., N] in f32.
// Returns 0, or 1 with the reason in `err`.
extern "C" int mlx_bun_f32t_rows_matmul(
    mlx_array* res,
    const mlx_array x_in,
    const mlx_array wt_in,
    const mlx_array* bias_in,
    const mlx_stream s,
    char* err,
    size_t err_len) {
  try {
#if defined(__x86_64__)
    if (!has_fma()) {
      throw std::invalid_argument("[f32t_rows_matmul] needs an x86_64 CPU with AVX2, F16C and FMA (not macOS)");
    }
    auto stream = mlx_stream_get_(s);
    std::vector<array> inputs = product_inputs(x_in, wt_in, bias_in);
    auto& x = inputs[0];
    auto& wt = inputs[1];
    if (x.dtype() != float32 || wt.dtype() != float32 || x.ndim() < 1 || wt.ndim() != 2 || x.shape(-1) != wt.shape(0) ||
        (bias_in && (inputs[2].dtype() != float32 || inputs[2].ndim() != 1 || inputs[2].shape(0) != wt.shape(1)))) {
      throw std::invalid_argument("[f32t_rows_matmul] expects x [..., K], wt [K, N] and a bias [N], all f32");
    }
    auto shape = x.shape();
    shape.back() = wt.shape(1);
    mlx_array_set_(*res, array(std::move(shape), float32, std::make_shared<MatrixProduct>(stream, "f32t_rows_matmul", f32t_rows_compute), std::move(inputs)));
    return 0;
#else
    throw std::invalid_argument("[f32t_rows_matmul] needs an x86_64 CPU with AVX2, F16C and FMA (not macOS)");
#endif
  } catch (std::exception& e) {
    copy_message(e.what(), err, err_len);
    return 1;
  }
}
