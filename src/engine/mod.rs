//! The engine: the thread that owns MLX work, sessions (bounded delivery and lifecycle), the
//! methods they run, and the execution placement policy.
pub mod caller_cache;
mod driver;
pub mod events;
mod generate;
mod group;
pub mod inference;
pub mod method;
pub mod plan;
mod resources;
mod scheduler;
pub mod session;
mod tasks;
mod thread;

pub use events::{FinishReason, GenerateStats};
pub use inference::{EngineOptions, InferenceEngine, MethodSpec, Source};
pub use group::batch_counts;
pub use thread::{Engine, ModelId, WeightsSource};
