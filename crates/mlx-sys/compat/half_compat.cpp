// mlx-c's f16/bf16 item/data accessors exist only where the compiler has __fp16 (ARM); mlx-rs
// calls them everywhere. These pass the 16-bit patterns through as uint16_t.
#include <cstdint>
#include <cstring>
#include <exception>

#include "mlx/c/array.h"
#include "mlx/c/error.h"
#include "mlx/c/private/mlx.h"

template <typename T>
static int item_bits(uint16_t* res, const mlx_array arr) {
  try {
    T v = mlx_array_get_(arr).item<T>();
    std::memcpy(res, &v, sizeof(uint16_t));
    return 0;
  } catch (std::exception& e) {
    mlx_error(e.what());
    return 1;
  }
}

template <typename T>
static const uint16_t* data_bits(const mlx_array arr) {
  try {
    return reinterpret_cast<const uint16_t*>(mlx_array_get_(arr).data<T>());
  } catch (std::exception& e) {
    mlx_error(e.what());
    return nullptr;
  }
}

extern "C" int mlx_array_item_float16(uint16_t* res, const mlx_array arr) {
  return item_bits<mlx::core::float16_t>(res, arr);
}
extern "C" int mlx_array_item_bfloat16(uint16_t* res, const mlx_array arr) {
  return item_bits<mlx::core::bfloat16_t>(res, arr);
}
extern "C" const uint16_t* mlx_array_data_float16(const mlx_array arr) {
  return data_bits<mlx::core::float16_t>(arr);
}
extern "C" const uint16_t* mlx_array_data_bfloat16(const mlx_array arr) {
  return data_bits<mlx::core::bfloat16_t>(arr);
}
