//! The engine: the thread that owns MLX work, the generation step machine it runs, and the
//! execution placement policy.
pub mod events;
mod generate;
pub mod plan;
mod thread;

pub use events::{Event, FinishReason, GenerateStats};
pub use thread::{Engine, GenerationHandle, ModelId};
