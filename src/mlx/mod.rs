//! Thin helpers over mlx-rs: the exit gate, host-memory conversions, backend facts, idle
//! memory and our own kernels. No model logic here.
pub mod backend;
pub mod gate;
pub mod host;
pub mod kernels;
pub mod memory;
