//! The engine: the thread that owns MLX work, and the generation step machine it runs.
pub mod events;
mod generate;
mod thread;

pub use events::{Event, FinishReason, GenerateStats};
pub use thread::{Engine, GenerationHandle, ModelId};
