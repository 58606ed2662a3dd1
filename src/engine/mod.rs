//! The engine: the thread that owns MLX work, sessions (bounded delivery and lifecycle), the
//! methods they run, and the execution placement policy.
mod driver;
pub mod events;
mod generate;
pub mod inference;
pub mod method;
pub mod plan;
mod resources;
pub mod session;
mod thread;

pub use events::{FinishReason, GenerateStats};
pub use inference::{EngineOptions, InferenceEngine, MethodSpec, Source};
pub use thread::{batch_counts, Engine, ModelId};
