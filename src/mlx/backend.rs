//! Facts about the device MLX computes on, for load-time choices, and waiting for it.
use mlx_rs::{Device, DeviceType};

/// Whether MLX's default device is its CPU backend (Linux builds; Macs default to Metal).
pub fn is_cpu() -> bool {
    Device::try_default().and_then(|d| d.get_type()).map_or(false, |t| matches!(t, DeviceType::Cpu))
}

/// Blocks until everything queued on this thread's MLX stream has been evaluated.
pub fn synchronize() {
    // SAFETY: plain call into mlx-c for the calling thread's default stream.
    unsafe { mlx_sys::mlx_synchronize_default() };
}
