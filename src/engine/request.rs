//! A request as the engine thread receives it: tokenized and validated, naming its model.
use super::caller_cache::CacheLease;
use super::method::Script;
use super::models::ModelId;
use crate::sample::GenerateOptions;

/// What the engine's sessions run.
#[derive(Debug, Clone)]
pub enum Source {
    Model { id: ModelId, vocab_size: usize },
    Script(Script),
}

/// Which prefix-cache entries a request may start from: those of its namespace, its own
/// session's continuation first.
#[derive(Debug, Clone, Default)]
pub struct PrefixKey {
    pub namespace: String,
    pub session: Option<String>,
}

/// One request, already tokenized and validated.
pub enum MethodSpec {
    Generate {
        model: ModelId,
        prompt: Vec<u32>,
        opts: GenerateOptions,
        prefix: PrefixKey,
        /// A caller-owned cache (`model.makeCache()`), leased for this request.
        cache: Option<CacheLease>,
    },
    Script(Script),
}

