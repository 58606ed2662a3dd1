// The int8 form of affine_rows.cpp's product, for the opt-in `f32Matmuls: 'int8'` (4- and 8-bit
// matrices, CPUs with AVX2 and FMA): every 32 values of an x row are rounded to 8 bits with one
// f32 scale (x̂ = dx · xq, xq in [-127, 127], llama.cpp's Q8_0 form), and each 32-value block's
// Σ q·xq is an integer dot product (`maddubs` multiplies bytes and adds pairs into 16 bits,
// `madd` adds those into 32), where the factored form (factored_rows.h) widens every value to an
// f32 lane: two blocks of a 4-bit row in about ten instructions instead of about fifty.
// node-llama-cpp multiplies GGUFs so; it decoded 1.1x to 1.7x faster than our factored form on
// an AMD EPYC, 2.4x to 4.8x on an Intel Xeon whose cache holds the whole model.
//
// The numbers: a block's part of a row's sum is scale · dx · Σ q·xq + bias · Σ x̂, i.e. the
// product of the stored weights with x̂ (each integer sum exact, then f32 multiply-adds in a fixed
// order): the same on every x86_64 CPU, whatever the number of x rows, and what x's rounding
// costs the eval instrument measures. The bias term is taken with Σ x̂, not Σ x, so the error is
// Σ w·(x̂ − x), not Σ scale·q·(x̂ − x), which is ~8x larger where q is unsigned.
//
// 8-bit values (0..255) do not fit `maddubs`' signed 16-bit pair sums against a signed byte, so
// they run as q − 128 (a signed byte): its magnitude against xq carrying q − 128's sign, the
// bias taking back 128 · scale.
//
// A row's scales and biases are read 8 blocks at a time as vectors, multiplied by the 8 blocks'
// dx at once, and each block's combined scale moved into place by a permute: per block no scalar
// work, which had cost as much as the dot products themselves.
//
// Included by affine_rows.cpp inside its anonymous namespace (Operands, scale_at, lanes_sum,
// PREFETCH_ROWS, parallel_rows, KERNEL_FMA).

constexpr int Q8_BLOCK = 32;

// Blocks per chunk: a row's scales and biases for 8 blocks load and combine as one vector.
constexpr int Q8_CHUNK = 8;

// Whether a product takes the int8 form: 4 or 8 bits, groups of 32 to 256 (whole blocks, a whole
// number of them in a chunk), rows of a chunk at least (MLX's group sizes, 32, 64 and 128, and
// rows of 256 values or more: every model's).
inline bool q8_fits(int bits, int group_size, int K) {
  return (bits == 4 || bits == 8) && group_size % Q8_BLOCK == 0 && group_size > 0 && Q8_CHUNK % (group_size / Q8_BLOCK) == 0 &&
         K % group_size == 0 && K >= Q8_CHUNK * Q8_BLOCK;
}

// x quantized: per row, K bytes, a scale per block (`d`) and per block Σ x̂ (`sums`). At 8 bits
// the values are in order; at 4 bits each pair of blocks i, i + 1 holds, 16 bytes each, the even
// values of i, those of i + 1, the odd values of i, those of i + 1 (a last block alone: its even
// values, then its odd ones): the order of the matrix bytes' low nibbles and high nibbles when
// the two blocks' 32 bytes load as one vector.
struct Q8Rows {
  std::vector<int8_t> q;
  std::vector<float> d, sums;
};

template <int bits>
KERNEL_FMA Q8Rows q8_quantize(const Operands& o) {
  const int blocks = o.K / Q8_BLOCK;
  Q8Rows x{std::vector<int8_t>(size_t(o.M) * o.K), std::vector<float>(size_t(o.M) * blocks), std::vector<float>(size_t(o.M) * blocks)};
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int m = 0; m < o.M; m++) {
    int8_t* row = x.q.data() + size_t(m) * o.K;
    for (int b = 0; b < blocks; b++) {
      const float* v = o.x + size_t(m) * o.K + size_t(b) * Q8_BLOCK;
      __m256 amax8 = _mm256_setzero_ps();
      for (int k = 0; k < Q8_BLOCK; k += 8) {
        amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + k)));
      }
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, amax8);
      const float amax = *std::max_element(lanes, lanes + 8);
      const float d = amax / 127, inv = d > 0 ? 127 / amax : 0;
      // Rounded to nearest, ties to even (the default rounding mode, which MLX leaves as it is).
      alignas(32) int32_t q[Q8_BLOCK];
      for (int k = 0; k < Q8_BLOCK; k += 8) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(q + k), _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + k), _mm256_set1_ps(inv))));
      }
      // At 4 bits: where block b's even and odd values go (`stride` apart) in its pair's 64 bytes.
      const bool paired = b % 2 == 1 || b + 1 < blocks;
      int8_t* to = row + size_t(b - b % 2) * Q8_BLOCK + (paired ? (b % 2) * 16 : 0);
      const int stride = paired ? 32 : 16;
      int sum = 0;
      for (int k = 0; k < Q8_BLOCK; k++) {
        sum += q[k];
        if constexpr (bits == 4) {
          to[(k % 2) * stride + k / 2] = int8_t(q[k]);
        } else {
          row[size_t(b) * Q8_BLOCK + k] = int8_t(q[k]);
        }
      }
      x.d[size_t(m) * blocks + b] = d;
      x.sums[size_t(m) * blocks + b] = d * float(sum);
    }
  }
  return x;
}

// `count` (1, 2, 4 or 8) values (f32, f16 or bf16) at p, as f32 in the first lanes.
template <ScaleType T>
KERNEL_FMA __attribute__((always_inline)) inline __m256 load_values(const void* p, int count) {
  if constexpr (T == ScaleType::F32) {
    const float* f = static_cast<const float*>(p);
    return count == 8 ? _mm256_loadu_ps(f) : count == 4 ? _mm256_castps128_ps256(_mm_loadu_ps(f)) : count == 2 ? _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(f)))) : _mm256_set1_ps(f[0]);
  } else {
    const uint16_t* h = static_cast<const uint16_t*>(p);
    uint16_t two[2] = {h[0], count > 1 ? h[1] : uint16_t(0)};
    const __m128i v = count == 8 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(h)) : count == 4 ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(h)) : _mm_cvtsi32_si128(int(two[0]) | int(two[1]) << 16);
    if constexpr (T == ScaleType::F16) {
      return _mm256_cvtph_ps(v);
    } else {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    }
  }
}

// Lane i the value (f32, f16 or bf16) of block b0 + i's group, of one matrix row whose groups'
// values start at p, for blocks b0 .. b0 + 8 (b0 at a group's start; `per_group` blocks a group,
// 1, 2, 4 or 8).
template <ScaleType T>
KERNEL_FMA __attribute__((always_inline)) inline __m256 block_values(const void* p, int b0, int per_group) {
  const int g0 = b0 / per_group;
  const void* at = static_cast<const char*>(p) + size_t(g0) * (T == ScaleType::F32 ? 4 : 2);
  const __m256 v = load_values<T>(at, Q8_CHUNK / per_group);
  if (per_group == 1) {
    return v;
  }
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_permutevar8x32_ps(v, per_group == 2 ? _mm256_srli_epi32(lane, 1) : per_group == 4 ? _mm256_srli_epi32(lane, 2) : _mm256_setzero_si256());
}

// Σ q·xq of blocks i and i + 1 of a 4-bit row (32 bytes at q), lanes 0-3 block i's, 4-7 i + 1's.
KERNEL_FMA __attribute__((always_inline)) inline __m256i q4_pair_dot(const uint8_t* q, const int8_t* xq) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)), low = _mm256_set1_epi8(0x0F);
  const __m256i even = _mm256_maddubs_epi16(_mm256_and_si256(v, low), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq)));
  const __m256i odd = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32)));
  // Each 16-bit sum is at most 2 · 15 · 127 in magnitude, two of them fit.
  return _mm256_madd_epi16(_mm256_add_epi16(even, odd), _mm256_set1_epi16(1));
}

// Σ q·xq of one block (4 bits: a last block alone, 16 bytes; 8 bits: 32) in eight lanes.
template <int bits>
KERNEL_FMA __attribute__((always_inline)) inline __m256i q8_block_dot(const uint8_t* q, const int8_t* xq) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq)), ones = _mm256_set1_epi16(1);
  if constexpr (bits == 4) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)), low = _mm_set1_epi8(0x0F);
    const __m256i nibbles = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(nibbles, x), ones);
  } else {
    const __m256i centred = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)), _mm256_set1_epi8(char(0x80)));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(centred), _mm256_sign_epi8(x, centred)), ones);
  }
}

// Blocks b0 + first .. b0 + 8 of R matrix rows (row r's bytes at q + r · row_bytes, its scales
// and biases from group index gr[r]) against one x row: into acc[r] each block's
// dx · scale · Σ q·xq, into bacc[r] each block's bias · Σ x̂ (lane i block b0 + i). A row's last
// blocks, fewer than 8, run as the last 8 from `first` on: every load a whole vector. Each row
// alike whatever R.
template <int bits, ScaleType T, int R>
KERNEL_FMA __attribute__((always_inline)) inline void q8_chunk(const Operands& o, const uint8_t* q, size_t row_bytes, const size_t* gr, const int8_t* xq, const float* d, const float* sums, int b0, int first, __m256* acc, __m256* bacc) {
  const int per_group = o.group_size / Q8_BLOCK;
  const __m256 dx = _mm256_loadu_ps(d + b0);
  // Σ x̂ of the blocks taken, zero in the lanes before `first`.
  const __m256 sx = _mm256_and_ps(_mm256_loadu_ps(sums + b0), _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(first - 1))));
  __m256 c[R];
  #pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    const size_t at = gr[r] * (T == ScaleType::F32 ? 4 : 2);
    const __m256 s = block_values<T>(static_cast<const char*>(o.scales) + at, b0, per_group);
    __m256 b = block_values<T>(static_cast<const char*>(o.biases) + at, b0, per_group);
    if constexpr (bits == 8) {
      // 8-bit values run as q − 128: the bias takes back 128 · scale.
      b = _mm256_fmadd_ps(s, _mm256_set1_ps(128), b);
    }
    bacc[r] = _mm256_fmadd_ps(b, sx, bacc[r]);
    c[r] = _mm256_mul_ps(s, dx);
  }
  constexpr size_t block_bytes = Q8_BLOCK * bits / 8;
  const int8_t* x = xq + size_t(b0) * Q8_BLOCK;
  const uint8_t* qb = q + size_t(b0) * block_bytes;
  int i = first;
  if constexpr (bits == 4) {
    // Pairs from an even block on (b0 + first is: a multiple of 8), but for a row's last block
    // when the row has an odd number.
    #pragma GCC unroll 4
    for (; i + 1 < Q8_CHUNK; i += 2) {
      const __m256i at = _mm256_add_epi32(_mm256_set1_epi32(i), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
      #pragma GCC unroll 4
      for (int r = 0; r < R; r++) {
        const __m256 dot = _mm256_cvtepi32_ps(q4_pair_dot(qb + r * row_bytes + size_t(i) * block_bytes, x + size_t(i) * Q8_BLOCK));
        acc[r] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(c[r], at), dot, acc[r]);
      }
    }
  }
  #pragma GCC unroll 8
  for (; i < Q8_CHUNK; i++) {
    const __m256i at = _mm256_set1_epi32(i);
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      const __m256 dot = _mm256_cvtepi32_ps(q8_block_dot<bits>(qb + r * row_bytes + size_t(i) * block_bytes, x + size_t(i) * Q8_BLOCK));
      acc[r] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(c[r], at), dot, acc[r]);
    }
  }
}

// Matrix rows [n, n + R) times every row of x: R rows share each load of x, each row's sum its
// own chains, computed alike whatever R.
template <int bits, ScaleType T, int R>
KERNEL_FMA __attribute__((always_inline)) inline void q8_rows_at(const Operands& o, const Q8Rows& x, int n) {
  const int blocks = o.K / Q8_BLOCK, groups = o.K / o.group_size;
  const size_t row_bytes = size_t(o.K) * bits / 8;
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(o.w);
  const uint8_t* q = bytes + size_t(n) * row_bytes;
  size_t gr[R];
  #pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    gr[r] = (size_t(n) + r) * groups;
  }
  // Rows ahead asked for now, as in factored_rows.h (short rows leave the hardware prefetcher
  // too little to go on).
  const size_t end = size_t(o.N) * row_bytes;
  const size_t ahead = (size_t(n) + PREFETCH_ROWS) * row_bytes;
  for (size_t b = ahead; b < ahead + R * row_bytes && b < end; b += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(bytes + b), _MM_HINT_T0);
  }
  for (int m = 0; m < o.M; m++) {
    const int8_t* xq = x.q.data() + size_t(m) * o.K;
    const float* d = x.d.data() + size_t(m) * blocks;
    const float* sums = x.sums.data() + size_t(m) * blocks;
    __m256 acc[R], bacc[R];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      acc[r] = bacc[r] = _mm256_setzero_ps();
    }
    int b0 = 0;
    for (; b0 + Q8_CHUNK <= blocks; b0 += Q8_CHUNK) {
      q8_chunk<bits, T, R>(o, q, row_bytes, gr, xq, d, sums, b0, 0, acc, bacc);
    }
    if (b0 < blocks) {
      q8_chunk<bits, T, R>(o, q, row_bytes, gr, xq, d, sums, blocks - Q8_CHUNK, Q8_CHUNK - (blocks - b0), acc, bacc);
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      o.out[size_t(m) * o.N + n + r] = lanes_sum(_mm256_add_ps(acc[r], bacc[r]));
    }
  }
}

// Matrix rows at once: their sums, scales and x's loads within AVX2's sixteen registers.
constexpr int Q8_ROWS = 3;

template <int bits, ScaleType T>
KERNEL_FMA void q8_range(const Operands& o, const Q8Rows& x, int n0, int n1) {
  int n = n0;
  for (; n + Q8_ROWS <= n1; n += Q8_ROWS) {
    q8_rows_at<bits, T, Q8_ROWS>(o, x, n);
  }
  for (; n < n1; n++) {
    q8_rows_at<bits, T, 1>(o, x, n);
  }
}

template <int bits>
void q8_rows(const Operands& o) {
  const Q8Rows x = q8_quantize<bits>(o);
  if (o.scale_type == float32) {
    parallel_rows(o.N, 8, [&](int n0, int n1) { q8_range<bits, ScaleType::F32>(o, x, n0, n1); });
  } else if (o.scale_type == float16) {
    parallel_rows(o.N, 8, [&](int n0, int n1) { q8_range<bits, ScaleType::F16>(o, x, n0, n1); });
  } else {
    parallel_rows(o.N, 8, [&](int n0, int n1) { q8_range<bits, ScaleType::Bf16>(o, x, n0, n1); });
  }
}

inline void q8_bits(const Operands& o, int bits) {
  if (bits == 4) {
    q8_rows<4>(o);
  } else {
    q8_rows<8>(o);
  }
}
