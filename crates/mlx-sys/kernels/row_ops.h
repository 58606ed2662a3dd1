// What rope_rows.h, rms_rows.h and sdpa_rows.h share: one MLX node computing its output from its
// inputs on the stream's thread, the rounding type of its dtype, and their builders' checks.
// Included at the end of affine_rows.cpp (one translation unit: it uses the rounding types,
// has_avx2 and copy_message).

#include <array>

#if defined(__x86_64__)
namespace {

// f.template operator()<R>() for the rounding type R of dtype t (f32, bf16 or f16).
template <class F>
void by_dtype(Dtype t, F&& f) {
  if (t == float32) {
    f.template operator()<F32>();
  } else if (t == bfloat16) {
    f.template operator()<Bf16>();
  } else {
    f.template operator()<F16>();
  }
}

// A node whose output (its dtype and shape set by the builder) `compute` fills from the inputs and
// up to three numbers (`params`, which also tell two such nodes apart).
class RowOp : public UnaryPrimitive {
 public:
  using Params = std::array<float, 3>;
  using Compute = void (*)(const std::vector<array>& inputs, const Params& params, array& out);
  RowOp(Stream stream, const char* name, Compute compute, Params params) : UnaryPrimitive(stream), name_(name), compute_(compute), params_(params) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    out.set_data(allocator::malloc(out.nbytes()));
    auto& encoder = cpu::get_command_encoder(stream());
    std::vector<array> weak;
    for (auto& a : inputs) {
      encoder.set_input_array(a);
      weak.push_back(array::unsafe_weak_copy(a));
    }
    encoder.set_output_array(out);
    // Nothing in `compute` throws but an allocation failure: it runs on MLX's stream thread.
    encoder.dispatch([out = array::unsafe_weak_copy(out), inputs = std::move(weak), compute = compute_, params = params_]() mutable { compute(inputs, params, out); });
  }

  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error(std::string("[") + name_ + "] runs on the CPU only");
  }

  const char* name() const override {
    return name_;
  }

  bool is_equivalent(const Primitive& other) const override {
    auto& o = static_cast<const RowOp&>(other);
    return compute_ == o.compute_ && params_ == o.params_;
  }

 private:
  const char* name_;
  Compute compute_;
  Params params_;
};

}  // namespace
#endif

// Runs `build` (which checks its operands and sets `res`) where our kernels run: 0, or 1 with the
// reason in `err`.
template <class F>
int build_row_op(const char* name, char* err, size_t err_len, F&& build) {
  try {
    if (!has_avx2()) {
      throw std::invalid_argument(std::string("[") + name + "] needs an x86_64 CPU with AVX2 and F16C (not macOS)");
    }
    build();
    return 0;
  } catch (std::exception& e) {
    copy_message(e.what(), err, err_len);
    return 1;
  }
}
