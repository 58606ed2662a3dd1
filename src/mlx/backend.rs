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
