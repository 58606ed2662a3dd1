//! Thin helpers over mlx-rs: the exit gate, host-memory conversions, backend facts, idle
//! memory, kept compiled functions, our own kernels, OpenBLAS's idle spin, ops in fewer nodes.
//! No model logic here.
pub mod backend;
pub mod blas;
pub mod compiled;
pub mod gate;
pub mod host;
pub mod kernels;
pub mod memory;
pub mod ops;
