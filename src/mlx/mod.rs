//! Thin helpers over mlx-rs: the exit gate and host-memory conversions. No model logic here.
pub mod gate;
pub mod host;
