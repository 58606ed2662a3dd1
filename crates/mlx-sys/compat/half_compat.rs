// The f16/bf16 accessors that mlx-c declares only on ARM, with the Rust types bindgen emits there
// (`__fp16` as a u16 newtype, `__bf16` as u16). Implemented in half_compat.cpp.
#[repr(transparent)]
#[derive(Debug, Default, Copy, Clone, Hash, PartialEq, Eq)]
pub struct __BindgenFloat16(pub u16);
pub type float16_t = __BindgenFloat16;
pub type bfloat16_t = u16;
extern "C" {
    pub fn mlx_array_item_float16(res: *mut float16_t, arr: mlx_array) -> ::std::os::raw::c_int;
    pub fn mlx_array_item_bfloat16(res: *mut bfloat16_t, arr: mlx_array) -> ::std::os::raw::c_int;
    pub fn mlx_array_data_float16(arr: mlx_array) -> *const float16_t;
    pub fn mlx_array_data_bfloat16(arr: mlx_array) -> *const bfloat16_t;
}
