//! mlx-bun native: an LLM inference engine on MLX, exposed to Node and Bun through napi-rs.
pub mod cache;
#[cfg(feature = "runtime")]
pub mod cli;
#[cfg(feature = "runtime")]
pub mod engine;
pub mod error;
pub mod eval;
#[cfg(feature = "runtime")]
pub mod fit;
pub mod gguf;
#[cfg(feature = "runtime")]
pub mod hub;
pub mod mlx;
pub mod model;
// Not in unit tests: napi-derive registers nothing there, so every binding would be unused.
#[cfg(all(feature = "node", not(test)))]
pub mod napi;
#[cfg(feature = "runtime")]
pub mod progress;
#[cfg(feature = "runtime")]
pub mod pull;
#[cfg(feature = "runtime")]
pub mod sample;
#[cfg(feature = "runtime")]
pub mod server;
pub mod tokenizer;
