// What every kernel of affine_rows.cpp and the headers it includes shares: rounding an f32 result
// to a dtype as MLX does on x86_64, values stored as f32, f16 or bf16 read as f32, and an array's
// values read and written as f32. Included by affine_rows.cpp inside its anonymous namespace,
// x86_64 only (KERNEL: AVX2 and F16C).

// Rounding an f32 result to the product's dtype T, as MLX's T does on x86_64 (f32: nothing;
// bf16: to nearest even, NaN to 0x7FC0; f16: to nearest even like F16C, NaN to sign | 0x7D00),
// kept as the f32 of the rounded value. Values read in T (x, scales) convert to f32 exactly.
// The lanes leave a NaN as the hardware makes it (what is NaN stays NaN, and its sign travels
// as in MLX's sums: MLX's NaNs differ only in payload, which no later operation reads), and
// `store` writes MLX's NaN for it: two operations fewer per rounding.
struct F32 {
  KERNEL static float one(float v) {
    return v;
  }
  KERNEL static __m256 lanes(__m256 v) {
    return v;
  }
};

struct Bf16 {
  KERNEL static float one(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    u = v != v ? 0x7FC00000u : (u + ((u >> 16) & 1) + 0x7FFFu) & 0xFFFF0000u;
    std::memcpy(&v, &u, 4);
    return v;
  }
  KERNEL static __m256 lanes(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
    return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32(int(0xFFFF0000u))));
  }
};

struct F16 {
  KERNEL static float one(float v) {
    if (v != v) {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      u = (u & 0x80000000u) | 0x7FA00000u;
      std::memcpy(&v, &u, 4);
      return v;
    }
    return _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT));
  }
  KERNEL static __m256 lanes(__m256 v) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
};

// The scales' stored type as a template argument, for loops that read one per group without a
// branch (factored_rows.h).
enum class ScaleType { F32, F16, Bf16 };

// A value stored as f32, f16 or bf16, as f32 (each converts exactly).
template <ScaleType T>
KERNEL __attribute__((always_inline)) inline float scale_at(const void* p, size_t i) {
  if constexpr (T == ScaleType::F32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (T == ScaleType::F16) {
    return _cvtsh_ss(static_cast<const uint16_t*>(p)[i]);
  } else {
    uint32_t bits = uint32_t(static_cast<const uint16_t*>(p)[i]) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
}

// The same, the type known only at run time.
KERNEL float load_f32(const void* p, size_t i, Dtype t) {
  if (t == float32) {
    return scale_at<ScaleType::F32>(p, i);
  }
  return t == float16 ? scale_at<ScaleType::F16>(p, i) : scale_at<ScaleType::Bf16>(p, i);
}

KERNEL float to_f32(const array& a, size_t offset) {
  return load_f32(a.data<char>() + offset * a.itemsize(), 0, a.dtype());
}

// x's values as f32, row-major (a view such as a transpose is read through its strides).
std::vector<float> x_in_f32(const array& x) {
  std::vector<float> v(x.size());
  if (x.flags().row_contiguous && x.dtype() == float32) {
    std::memcpy(v.data(), x.data<float>(), x.nbytes());
    return v;
  }
  if (x.flags().row_contiguous) {
    for (size_t i = 0; i < x.size(); i++) {
      v[i] = to_f32(x, i);
    }
    return v;
  }
  std::vector<int> index(x.ndim(), 0);
  for (size_t i = 0; i < x.size(); i++) {
    int64_t offset = 0;
    for (int d = 0; d < int(x.ndim()); d++) {
      offset += int64_t(index[d]) * x.strides()[d];
    }
    v[i] = to_f32(x, offset);
    for (int d = x.ndim() - 1; d >= 0 && ++index[d] == x.shape(d); d--) {
      index[d] = 0;
    }
  }
  return v;
}

// `v` (already rounded to the output's dtype by the rounding types) written as value i of `out`.
KERNEL inline void store_value(array& out, size_t i, float v) {
  if (out.dtype() == float32) {
    out.data<float>()[i] = v;
  } else if (out.dtype() == bfloat16) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    out.data<uint16_t>()[i] = uint16_t(u >> 16);
  } else {
    out.data<uint16_t>()[i] = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
  }
}

// Half-precision results (f32 values already rounded to T) written as T, NaN as MLX's types
// write it.
KERNEL void store_half(const std::vector<float>& v, array& out) {
  for (size_t i = 0; i < v.size(); i++) {
    store_value(out, i, out.dtype() == bfloat16 ? Bf16::one(v[i]) : F16::one(v[i]));
  }
}
