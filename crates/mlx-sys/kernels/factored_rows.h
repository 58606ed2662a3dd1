// The factored form of affine_rows.cpp's product, for the opt-in `f32Matmuls: 'all'` (f32
// products, CPUs with FMA): each group's part of a row's sum as scale · Σ x·q + bias · Σ x, in
// fused multiply-adds. Not MLX's rounding: the eval instrument measures what it changes, and it is
// nearer the exact product than MLX's order (layers_tests.rs,
// `factored_kernel_is_within_f32_rounding_of_the_exact_product`).
//
// It runs a matrix row at a time, where MLX's order runs eight rows in eight lanes. MLX packs
// values little-endian into words, so a row's bytes hold its values in order, 8 / bits to a byte
// (the lowest bits first): eight bytes widen straight into eight lanes of one row, and each of
// their 8 / bits parts meets the x values it multiplies, which every x row has rearranged once
// per product. No transposition, no gathered scales: three to four vector operations per eight
// values, and at 8 bits a decode step's product runs ~1.8x faster than in eight-row lanes
// (Gemma-3's 262 144 x 640 output matrix: 26 -> 15 ms on one core). The bias part, Σ over groups
// of bias · Σ x, uses sums of x computed once per x row too.
// Rows of x run inside the loop over matrix rows (a matrix row is read from memory once), and
// each output is computed the same way whatever the number of x rows.
//
// Included by affine_rows.cpp inside its anonymous namespace (Operands, scale_at, KERNEL_FMA).

// Values of x per iteration of a group's loop: eight bytes' worth, and at least 16 so that two
// chains of additions are in flight.
constexpr int factored_step(int bits) {
  return bits == 2 ? 32 : 16;
}

// Whether a product takes the factored form: its groups hold whole iterations (MLX's group sizes,
// 32, 64 and 128, do at every width).
inline bool factored_fits(const Operands& o, int bits) {
  return o.group_size % factored_step(bits) == 0;
}

// Eight lanes' sum.
KERNEL_FMA inline float lanes_sum(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

// Part p (bits p·bits and up) of eight bytes widened to lanes, as f32.
template <int bits, int p>
KERNEL_FMA __attribute__((always_inline)) inline __m256 part(__m256i bytes) {
  if constexpr (bits == 8) {
    return _mm256_cvtepi32_ps(bytes);
  } else {
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(bytes, p * bits), _mm256_set1_epi32((1 << bits) - 1)));
  }
}

KERNEL_FMA __attribute__((always_inline)) inline __m256i widen8(const uint8_t* q) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
}

// Σ x·q over one group of `size` values for R matrix rows, row r's bytes at q + r · stride, x
// (rearranged) at the group's first value. Each row's sum is its own two chains, in the same
// operations and order whatever R: the rows only share the loads of x.
template <int bits, int R>
KERNEL_FMA __attribute__((always_inline)) inline void group_dots(const uint8_t* q, size_t stride, const float* x, int size, __m256* dot) {
  // Bytes of one step (factored_step values).
  constexpr int step_bytes = bits == 8 ? 16 : 8;
  __m256 a[R], b[R];
  #pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    a[r] = b[r] = _mm256_setzero_ps();
  }
  for (const float* end = x + size; x < end; x += factored_step(bits), q += step_bytes) {
    const __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      const uint8_t* qr = q + r * stride;
      if constexpr (bits == 8) {
        a[r] = _mm256_fmadd_ps(x0, part<8, 0>(widen8(qr)), a[r]);
        b[r] = _mm256_fmadd_ps(x1, part<8, 0>(widen8(qr + 8)), b[r]);
      } else {
        const __m256i v = widen8(qr);
        a[r] = _mm256_fmadd_ps(x0, part<bits, 0>(v), a[r]);
        b[r] = _mm256_fmadd_ps(x1, part<bits, 1>(v), b[r]);
        if constexpr (bits == 2) {
          a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 16), part<2, 2>(v), a[r]);
          b[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 24), part<2, 3>(v), b[r]);
        }
      }
    }
  }
  #pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    dot[r] = _mm256_add_ps(a[r], b[r]);
  }
}

constexpr size_t PREFETCH_ROWS = 4;

// Matrix rows [n, n + R) times every row of x. Each row's sum over groups is one chain of
// dependent multiply-adds (two per group); R rows at once keep R chains in flight and share each
// load of x. Every output is computed alike whatever R.
template <int bits, ScaleType T, int R>
KERNEL_FMA __attribute__((always_inline)) inline void factored_rows_at(const Operands& o, const float* xs, const float* xsums, int n) {
  constexpr int per_byte = 8 / bits;
  const size_t group_bytes = size_t(o.group_size) / per_byte;
  const int groups = o.K / o.group_size;
  const size_t row_bytes = size_t(o.K) / per_byte;
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(o.w);
  const uint8_t* q = bytes + size_t(n) * row_bytes;
  const size_t first = size_t(n) * groups;
  // The rows PREFETCH_ROWS ahead, asked for now: without it a row's loads wait on memory (on an
  // Intel Xeon, 44 % of this kernel's samples were on one load's first use, and 'all' decoded
  // slower than MLX's order, which prefetches), rows this short leaving the hardware
  // prefetcher too little to go on. Four rows ahead measured best of 2, 4, 8 and 16.
  const size_t end = size_t(o.N) * row_bytes;
  const size_t ahead = (size_t(n) + PREFETCH_ROWS) * row_bytes;
  for (size_t b = ahead; b < ahead + R * row_bytes && b < end; b += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(bytes + b), _MM_HINT_T0);
  }
  for (int m = 0; m < o.M; m++) {
    const float* x = xs + size_t(m) * o.K;
    const float* xsum = xsums + size_t(m) * groups * 8;
    // Each lane's part of the group, scale · Σ x·q + bias · Σ x, joins the lane's sum: the two
    // terms cancel each other within the group (the bias is about -scale · 2^(bits-1)), not
    // across the whole row.
    __m256 acc[R], dot[R];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      acc[r] = _mm256_setzero_ps();
    }
    for (int g = 0; g < groups; g++) {
      group_dots<bits, R>(q + g * group_bytes, row_bytes, x + size_t(g) * o.group_size, o.group_size, dot);
      const __m256 sum = _mm256_loadu_ps(xsum + size_t(g) * 8);
      #pragma GCC unroll 4
      for (int r = 0; r < R; r++) {
        const size_t at = first + size_t(r) * groups + g;
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(scale_at<T>(o.biases, at)), sum, acc[r]);
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(scale_at<T>(o.scales, at)), dot[r], acc[r]);
      }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      o.out[size_t(m) * o.N + n + r] = lanes_sum(acc[r]);
    }
  }
}

// Matrix rows at once in factored_range: three kept a 1536 x 576 4-bit product ~5 % faster than
// one on an Intel Xeon, within AVX2's sixteen registers (three sums and two chains each, x shared).
constexpr int FACTORED_ROWS = 3;

// Rows [n0, n1) of the product, x rearranged (`xs`) with its sums per group (`xsums`).
template <int bits, ScaleType T>
KERNEL_FMA void factored_range(const Operands& o, const float* xs, const float* xsums, int n0, int n1) {
  int n = n0;
  for (; n + FACTORED_ROWS <= n1; n += FACTORED_ROWS) {
    factored_rows_at<bits, T, FACTORED_ROWS>(o, xs, xsums, n);
  }
  for (; n < n1; n++) {
    factored_rows_at<bits, T, 1>(o, xs, xsums, n);
  }
}

template <int bits>
KERNEL_FMA void factored_rows(const Operands& o) {
  constexpr int per_byte = 8 / bits, unit = 8 * per_byte;  // values in eight bytes
  const int groups = o.K / o.group_size;
  // Each x row's values in the order of the lanes' parts (within every unit, part p of lane j
  // multiplies value j · per_byte + p), and per group the sums of the values each lane meets.
  std::vector<float> xs(size_t(o.M) * o.K), xsums(size_t(o.M) * groups * 8);
  for (int m = 0; m < o.M; m++) {
    const float* x = o.x + size_t(m) * o.K;
    float* to = xs.data() + size_t(m) * o.K;
    for (int k = 0; k < o.K; k += unit) {
      for (int p = 0; p < per_byte; p++) {
        for (int j = 0; j < 8; j++) {
          to[k + 8 * p + j] = x[k + j * per_byte + p];
        }
      }
    }
    for (int g = 0; g < groups; g++) {
      __m256 sum = _mm256_setzero_ps();
      for (int k = g * o.group_size; k < (g + 1) * o.group_size; k += 8) {
        sum = _mm256_add_ps(sum, _mm256_loadu_ps(to + k));
      }
      _mm256_storeu_ps(xsums.data() + (size_t(m) * groups + g) * 8, sum);
    }
  }
  // Blocks of rows on every core (row_pool.h), in a form for the scales' stored type.
  const float *x = xs.data(), *sums = xsums.data();
  if (o.scale_type == float32) {
    parallel_rows(o.N, 8, [&](int n0, int n1) { factored_range<bits, ScaleType::F32>(o, x, sums, n0, n1); });
  } else if (o.scale_type == float16) {
    parallel_rows(o.N, 8, [&](int n0, int n1) { factored_range<bits, ScaleType::F16>(o, x, sums, n0, n1); });
  } else {
    parallel_rows(o.N, 8, [&](int n0, int n1) { factored_range<bits, ScaleType::Bf16>(o, x, sums, n0, n1); });
  }
}

inline void factored_bits(const Operands& o, int bits) {
  switch (bits) {
    case 2: factored_rows<2>(o); break;
    case 4: factored_rows<4>(o); break;
    default: factored_rows<8>(o); break;
  }
}
