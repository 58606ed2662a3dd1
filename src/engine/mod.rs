//! The engine: the thread that owns MLX work, sessions (bounded delivery and lifecycle), the
//! methods they run, and the execution placement policy. Dependencies run one way: the facade
//! (`inference`) → the thread (`thread`) → its groups and scheduler (`group`, `scheduler`) → each
//! session's driver (`driver`) → methods (`generate`, `speculative`) → rows and their step executor (`rows`,
//! `method`) → models and caches; `admission`,
//! `request`, `models`, `placement`, `session`, `events` and `caller_cache` are shared below them.
mod admission;
mod caller_cache;
mod driver;
pub mod events;
pub mod fill;
mod generate;
mod group;
pub mod holds;
mod memory;
pub mod inference;
pub mod method;
mod models;
pub mod placement;
mod prompt_tasks;
mod request;
mod resources;
mod rows;
mod scheduler;
pub mod speculative;
pub mod session;
mod tasks;
mod thread;

pub use events::{FinishReason, GenerateStats};
pub use group::batch_counts;
pub use inference::{EngineOptions, InferenceEngine, MethodSpec, Source};
pub use request::Draft;
pub use models::ModelId;
pub use prompt_tasks::l2_normalised;
pub use thread::{EngineThread, WeightsSource};
