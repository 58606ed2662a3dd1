//! Facts about the device MLX computes on, the engine thread's second CPU stream, and waiting
//! for both.
use std::cell::OnceCell;
use std::sync::OnceLock;

use mlx_rs::{Device, DeviceType, Stream};

/// Whether MLX's default device is its CPU backend (Linux builds; Macs default to Metal).
pub fn is_cpu() -> bool {
    static CPU: OnceLock<bool> = OnceLock::new();
    *CPU.get_or_init(|| Device::try_default().and_then(|d| d.get_type()).map_or(false, |t| matches!(t, DeviceType::Cpu)))
}

thread_local! {
    static SECOND: OnceCell<Stream> = const { OnceCell::new() };
}

/// Builds the ops of `f` on this thread's second CPU stream. MLX evaluates each stream on its
/// own worker thread, so work split between the default stream and this one runs on two cores,
/// where MLX's own CPU kernels (bf16/f16 and quantized matmul) use one.
pub fn on_second_stream<T>(f: impl FnOnce() -> T) -> T {
    SECOND.with(|s| mlx_rs::with_stream(s.get_or_init(|| Stream::new_with_device(&Device::cpu())), f))
}

/// Blocks until everything queued on this thread's MLX streams has been evaluated.
pub fn synchronize() {
    // SAFETY: plain calls into mlx-c for streams of the calling thread.
    unsafe { mlx_sys::mlx_synchronize_default() };
    SECOND.with(|s| {
        if let Some(s) = s.get() {
            unsafe { mlx_sys::mlx_synchronize(s.as_ptr()) };
        }
    });
}

/// What MLX computes on in this process, as `ensureNativeRuntime` reports it.
pub struct Runtime {
    /// `cpu`, `metal` or `cuda`: the backend of MLX's default device.
    pub backend: &'static str,
    /// The device's name as MLX reports it (a GPU's model, or the CPU).
    pub device: String,
    /// The version of the libmlx that was loaded (the runtime shipped beside the addon).
    pub version: String,
}

/// Asks the loaded libmlx what it runs on. Call it on the engine thread, like all MLX work.
pub fn runtime() -> Runtime {
    use std::ffi::CStr;
    // SAFETY: mlx-c calls whose out-parameters are initialised here and objects freed here; the
    // strings are copied before their owners are freed.
    unsafe {
        let text = |p: *const std::os::raw::c_char| if p.is_null() { None } else { Some(CStr::from_ptr(p).to_string_lossy().into_owned()) };
        let mut s = mlx_sys::mlx_string_new();
        let version = (mlx_sys::mlx_version(&mut s) == 0).then(|| text(mlx_sys::mlx_string_data(s))).flatten();
        mlx_sys::mlx_string_free(s);

        let mut dev = mlx_sys::mlx_device_new();
        let mut device = None;
        if mlx_sys::mlx_get_default_device(&mut dev) == 0 {
            let mut info = mlx_sys::mlx_device_info_new();
            let mut name = std::ptr::null();
            if mlx_sys::mlx_device_info_get(&mut info, dev) == 0 && mlx_sys::mlx_device_info_get_string(&mut name, info, c"device_name".as_ptr()) == 0 {
                device = text(name);
            }
            mlx_sys::mlx_device_info_free(info);
        }
        mlx_sys::mlx_device_free(dev);

        let available = |f: unsafe extern "C" fn(*mut bool) -> std::os::raw::c_int| {
            let mut yes = false;
            f(&mut yes) == 0 && yes
        };
        let backend = if is_cpu() {
            "cpu"
        } else if available(mlx_sys::mlx_metal_is_available) {
            "metal"
        } else if available(mlx_sys::mlx_cuda_is_available) {
            "cuda"
        } else {
            "gpu"
        };
        Runtime { backend, device: device.unwrap_or_else(|| backend.to_owned()), version: version.unwrap_or_else(|| "unknown".to_owned()) }
    }
}
