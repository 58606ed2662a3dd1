//! Thin helpers over mlx-rs: the exit gate, host-memory conversions and backend facts. No model
//! logic here.
pub mod backend;
pub mod gate;
pub mod host;
