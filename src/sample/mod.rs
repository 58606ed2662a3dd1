//! Sampling: options and their validation, the MLX sampler chain, and logprob reporting.
pub mod grammar;
pub mod logprobs;
pub mod options;
pub mod sampler;

pub use options::{validate_prompt, GenerateOptions, SamplingOptions};
pub use sampler::Sampler;
