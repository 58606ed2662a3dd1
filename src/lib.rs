//! mlx-bun native: an LLM inference engine on MLX, exposed to Node and Bun through napi-rs.
pub mod cache;
pub mod cli;
pub mod engine;
pub mod error;
pub mod eval;
pub mod fit;
pub mod gguf;
pub mod hub;
pub mod mlx;
pub mod model;
// Not in unit tests: napi-derive registers nothing there, so every binding would be unused.
#[cfg(all(feature = "node", not(test)))]
pub mod napi;
pub mod progress;
pub mod pull;
pub mod sample;
pub mod server;
pub mod tokenizer;
