//! A request as the engine thread receives it: tokenized and validated, naming its model.
use super::fill::FillPlan;
use super::caller_cache::CacheLease;
use super::method::Script;
use super::models::ModelId;
use super::speculative::MAX_DRAFT_TOKENS;
use crate::error::{Error, Result};
use crate::sample::GenerateOptions;

/// What the engine's sessions run.
#[derive(Debug, Clone)]
pub enum Source {
    /// `checkpoints`: the model's caches are restored from checkpoints (`restores_checkpoints`).
    Model { id: ModelId, vocab_size: usize, checkpoints: bool },
    Script(Script),
}

/// Which prefix-cache entries a request may start from: those of its namespace, its own
/// session's continuation first.
#[derive(Debug, Clone, Default)]
pub struct PrefixKey {
    pub namespace: String,
    pub session: Option<String>,
}

/// Speculative decoding's draft: a model with the target's vocabulary, and how many tokens it
/// proposes per step.
#[derive(Debug, Clone, Copy)]
pub struct Draft {
    pub model: ModelId,
    pub tokens: usize,
    /// The draft's vocabulary size (its logits' width), checked against the target's.
    pub vocab_size: usize,
}

impl Draft {
    /// A draft must share the target's vocabulary.
    pub fn check(&self, vocab_size: usize) -> Result<()> {
        if self.vocab_size != vocab_size {
            return Err(Error::option("draftModel", format!("its vocabulary ({}) is not the model's ({vocab_size})", self.vocab_size)));
        }
        if self.tokens == 0 || self.tokens > MAX_DRAFT_TOKENS {
            return Err(Error::option("numDraftTokens", format!("must be an integer from 1 to {MAX_DRAFT_TOKENS}, got {}", self.tokens)));
        }
        Ok(())
    }
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
        /// A draft model for speculative decoding.
        draft: Option<Draft>,
        /// Strict fill rows from its chat template and tools (used when placed with fill).
        fill: FillPlan,
    },
    Script(Script),
}

