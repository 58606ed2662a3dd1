//! Thin helpers over mlx-rs: the exit gate, host-memory conversions, backend facts, BLAS
//! threads and idle memory. No model logic here.
pub mod backend;
pub mod gate;
pub mod host;
pub mod memory;
