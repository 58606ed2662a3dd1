//! Generation options with mlx-bun's names and defaults, validated before any work starts.
use std::collections::BTreeMap;

use super::grammar::GrammarSpec;
use crate::cache::KvQuantOptions;
use crate::error::{Error, Result};

pub const MAX_TOP_LOGPROBS: u32 = 20;

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingOptions {
    /// 0 = greedy (argmax).
    pub temperature: f32,
    /// Nucleus sampling mass in [0, 1]; 0 (mlx-bun's default) and 1 keep everything.
    pub top_p: f32,
    /// 0 = off.
    pub top_k: u32,
    /// 0 = off.
    pub min_p: f32,
    pub min_tokens_to_keep: u32,
    /// 0 or 1 = off.
    pub repetition_penalty: f32,
    /// How many recent tokens the penalty looks at; 0 = the whole history.
    pub repetition_context_size: u32,
    pub presence_penalty: f32,
    pub presence_context_size: u32,
    pub frequency_penalty: f32,
    pub frequency_context_size: u32,
    pub logit_bias: BTreeMap<u32, f32>,
    pub seed: u64,
}

impl Default for SamplingOptions {
    fn default() -> Self {
        SamplingOptions {
            temperature: 0.0,
            top_p: 0.0,
            top_k: 0,
            min_p: 0.0,
            min_tokens_to_keep: 1,
            repetition_penalty: 0.0,
            repetition_context_size: 20,
            presence_penalty: 0.0,
            presence_context_size: 20,
            frequency_penalty: 0.0,
            frequency_context_size: 20,
            logit_bias: BTreeMap::new(),
            seed: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    pub max_tokens: u32,
    pub prefill_chunk_size: u32,
    /// Stop tokens; `None` uses the model's.
    pub eos_token_ids: Option<Vec<u32>>,
    pub sampling: SamplingOptions,
    pub logprobs: bool,
    /// Alternatives reported per token (implies `logprobs`).
    pub top_logprobs: u32,
    /// The output must follow this grammar (`sample::grammar`).
    pub grammar: Option<GrammarSpec>,
    /// Quantized KV caches (`kvBits`, `kvGroupSize`, `quantizedKvStart`, `kvConfig`).
    pub kv: KvQuantOptions,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 512,
            prefill_chunk_size: 2048,
            eos_token_ids: None,
            sampling: SamplingOptions::default(),
            logprobs: false,
            top_logprobs: 0,
            grammar: None,
            kv: KvQuantOptions::default(),
        }
    }
}

fn finite(name: &'static str, v: f32) -> Result<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(Error::option(name, format!("must be a finite number, got {v}")))
    }
}

impl GenerateOptions {
    /// Checks every option against the model's vocabulary; the first problem wins.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        let s = &self.sampling;
        if self.max_tokens == 0 {
            return Err(Error::option("maxTokens", "must be a positive integer"));
        }
        if self.prefill_chunk_size == 0 {
            return Err(Error::option("prefillChunkSize", "must be a positive integer"));
        }
        finite("temperature", s.temperature)?;
        if s.temperature < 0.0 {
            return Err(Error::option("temperature", format!("must be >= 0, got {}", s.temperature)));
        }
        if !(0.0..=1.0).contains(&s.top_p) {
            return Err(Error::option("topP", format!("must be in [0, 1] (0 = off), got {}", s.top_p)));
        }
        if !(0.0..=1.0).contains(&s.min_p) {
            return Err(Error::option("minP", format!("must be in [0, 1], got {}", s.min_p)));
        }
        if s.min_tokens_to_keep == 0 || s.min_tokens_to_keep as usize > vocab_size {
            return Err(Error::option("minTokensToKeep", format!("must be between 1 and the vocabulary size ({vocab_size}), got {}", s.min_tokens_to_keep)));
        }
        finite("repetitionPenalty", s.repetition_penalty)?;
        if s.repetition_penalty < 0.0 {
            return Err(Error::option("repetitionPenalty", format!("must be >= 0, got {}", s.repetition_penalty)));
        }
        finite("presencePenalty", s.presence_penalty)?;
        finite("frequencyPenalty", s.frequency_penalty)?;
        for (&id, &bias) in &s.logit_bias {
            if id as usize >= vocab_size {
                return Err(Error::option("logitBias", format!("token id {id} is outside the vocabulary ({vocab_size})")));
            }
            finite("logitBias", bias)?;
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(Error::option("topLogprobs", format!("must be at most {MAX_TOP_LOGPROBS}, got {}", self.top_logprobs)));
        }
        if let Some(g) = &self.grammar {
            g.check()?;
        }
        self.kv.validate()
    }

    pub fn wants_logprobs(&self) -> bool {
        self.logprobs || self.top_logprobs > 0
    }
}

/// Prompt checks shared by every entry point.
pub fn validate_prompt(prompt: &[u32], vocab_size: usize) -> Result<()> {
    if prompt.is_empty() {
        return Err(Error::InvalidPrompt("the prompt is empty".into()));
    }
    if let Some((i, id)) = prompt.iter().enumerate().find(|(_, &id)| id as usize >= vocab_size) {
        return Err(Error::InvalidPrompt(format!(
            "prompt token {i} has id {id}, outside the vocabulary (size {vocab_size})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_named() {
        let ok = GenerateOptions::default();
        ok.validate(100).unwrap();
        let bad = |f: &dyn Fn(&mut GenerateOptions)| {
            let mut o = GenerateOptions::default();
            f(&mut o);
            o.validate(100).unwrap_err().to_string()
        };
        assert!(bad(&|o| o.sampling.temperature = -0.1).starts_with("temperature"));
        assert!(bad(&|o| o.sampling.temperature = f32::NAN).starts_with("temperature"));
        assert!(bad(&|o| o.sampling.top_p = -0.1).starts_with("topP"));
        assert!(bad(&|o| o.sampling.top_p = 1.5).starts_with("topP"));
        assert!(bad(&|o| o.sampling.min_tokens_to_keep = 101).starts_with("minTokensToKeep"));
        let mut keep_all = GenerateOptions::default();
        keep_all.sampling.min_tokens_to_keep = 100;
        keep_all.validate(100).unwrap();
        assert!(bad(&|o| o.max_tokens = 0).starts_with("maxTokens"));
        assert!(bad(&|o| o.sampling.min_p = 2.0).starts_with("minP"));
        assert!(bad(&|o| { o.sampling.logit_bias.insert(100, 1.0); }).starts_with("logitBias"));
        assert!(bad(&|o| o.top_logprobs = 21).starts_with("topLogprobs"));
    }

    #[test]
    fn prompt_checks() {
        assert_eq!(validate_prompt(&[], 10).unwrap_err().code(), "INVALID_PROMPT");
        assert!(validate_prompt(&[1, 10], 10).unwrap_err().to_string().contains("id 10"));
        validate_prompt(&[0, 9], 10).unwrap();
    }
}
