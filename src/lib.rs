//! mlx-bun native: an LLM inference engine on MLX, exposed to Node and Bun through napi-rs.
pub mod cache;
pub mod engine;
pub mod error;
pub mod mlx;
pub mod model;
pub mod sample;
