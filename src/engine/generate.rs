//! The autoregressive method: one generation as a step machine the engine thread advances a unit
//! at a time: prefill chunks first (all prompt tokens but the last, as mlx-lm does), then decode
//! steps.
//! Decode is pipelined: step n+1's graph is built and handed to `async_eval` before token n is
//! read back, so graph construction overlaps evaluation.
use std::rc::Rc;
use std::time::Instant;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::{async_eval, eval};
use mlx_rs::Array;

use super::events::{FinishReason, GenerateStats};
use super::method::{MethodRun, Plan, Step as RunStep};
use super::session::{MethodResult, Output};
use crate::cache::LayerCache;
use crate::error::{Error, Result};
use crate::model::LanguageModel;
use crate::sample::logprobs::PendingLogprobs;
use crate::sample::{GenerateOptions, Sampler};

/// mlx-lm clears MLX's buffer cache every 256 decode steps.
const CLEAR_CACHE_EVERY: u32 = 256;

struct Step {
    token: Array,
    logprobs: Option<PendingLogprobs>,
}

pub struct Generation {
    model: Rc<dyn LanguageModel>,
    caches: Vec<LayerCache>,
    prompt: Vec<u32>,
    prefilled: usize,
    opts: GenerateOptions,
    eos: Vec<u32>,
    sampler: Sampler,
    pending: Option<Step>,
    generated: u32,
    started: Instant,
    first_token: Option<Instant>,
}

impl Generation {
    /// The plan of a generation: at most `maxTokens` tokens; the run is built when it starts.
    pub fn plan(model: Rc<dyn LanguageModel>, prompt: Vec<u32>, opts: GenerateOptions) -> Plan {
        Plan {
            output_token_limit: f64::from(opts.max_tokens),
            start: Box::new(move || Ok(Box::new(Generation::new(model, prompt, opts)?) as Box<dyn MethodRun>)),
        }
    }

    pub fn new(model: Rc<dyn LanguageModel>, prompt: Vec<u32>, opts: GenerateOptions) -> Result<Self> {
        let eos = opts.eos_token_ids.clone().unwrap_or_else(|| model.config().eos_token_ids.clone());
        let sampler = Sampler::new(opts.sampling.clone(), &prompt)?;
        Ok(Generation {
            caches: model.new_cache(),
            model,
            prompt,
            prefilled: 0,
            opts,
            eos,
            sampler,
            pending: None,
            generated: 0,
            started: Instant::now(),
            first_token: None,
        })
    }

    fn done(&self, finish_reason: FinishReason) -> RunStep {
        RunStep::Done(MethodResult { finish_reason, metrics: self.stats() })
    }

    fn advance(&mut self, out: &mut Output<'_>) -> Result<RunStep> {
        if out.stopped() {
            return Ok(self.done(FinishReason::Stop));
        }
        let total = self.prompt.len();
        let last = total - 1;
        if self.prefilled < last {
            let n = (last - self.prefilled).min(self.opts.prefill_chunk_size as usize);
            let chunk = &self.prompt[self.prefilled..self.prefilled + n];
            self.model.hidden(&ids(chunk), &mut self.caches)?;
            eval(self.caches.iter().flat_map(|c| c.state()))?;
            mlx_rs::memory::clear_cache()?;
            self.prefilled += n;
            out.progress(self.prefilled as f64, Some(total as f64))?;
            return Ok(RunStep::Continue);
        }
        let Some(current) = self.pending.take() else {
            let first = self.forward(&ids(&self.prompt[last..]), 0)?;
            self.pending = Some(first);
            out.progress(total as f64, Some(total as f64))?;
            return Ok(RunStep::Continue);
        };
        // Queue the next step before reading this one, unless this is the last token allowed.
        if self.generated + 1 < self.opts.max_tokens {
            self.sampler.push(&current.token)?;
            let next = self.forward(&current.token.reshape(&[1, 1])?, self.generated as u64 + 1)?;
            self.pending = Some(next);
        }
        let id = current.token.try_item_exact::<u32>().map_err(|e| Error::Mlx(e.to_string()))?;
        if self.first_token.is_none() {
            self.first_token = Some(Instant::now());
        }
        if self.eos.contains(&id) {
            return Ok(self.done(FinishReason::Stop));
        }
        let logprobs = current.logprobs.as_ref().map(PendingLogprobs::read).transpose()?;
        out.commit(&[id], logprobs.as_ref().map(std::slice::from_ref))?;
        self.generated += 1;
        if self.generated % CLEAR_CACHE_EVERY == 0 {
            mlx_rs::memory::clear_cache()?;
        }
        if self.generated >= self.opts.max_tokens {
            return Ok(self.done(FinishReason::Length));
        }
        Ok(RunStep::Continue)
    }

    /// Builds the graph for one decode step on `input` [1, L] and starts evaluating it.
    fn forward(&mut self, input: &Array, step: u64) -> Result<Step> {
        let hidden = self.model.hidden(input, &mut self.caches)?;
        let logits = self.model.logits(&hidden.index((.., -1.., ..)))?.reshape(&[1, -1])?;
        let (token, logprobs) = self.sampler.sample(&logits, step)?;
        let token = token.reshape(&[1])?;
        let logprobs = if self.opts.wants_logprobs() {
            Some(PendingLogprobs::new(&logprobs, &token, self.opts.top_logprobs)?)
        } else {
            None
        };
        let mut outputs = vec![&token];
        if let Some(lp) = &logprobs {
            outputs.extend(lp.arrays());
        }
        async_eval(outputs)?;
        Ok(Step { token, logprobs })
    }

    pub fn stats(&self) -> GenerateStats {
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        let prefill = first.duration_since(self.started).as_secs_f64();
        let decode = now.duration_since(first).as_secs_f64();
        let prompt_tokens = self.prompt.len() as u32;
        GenerateStats {
            prompt_tokens,
            cached_tokens: 0,
            generated_tokens: self.generated,
            prefill_tps: if prefill > 0.0 { prompt_tokens as f64 / prefill } else { 0.0 },
            decode_tps: if decode > 0.0 { self.generated as f64 / decode } else { 0.0 },
            prefill_ms: prefill * 1e3,
            decode_ms: decode * 1e3,
            cache_tokens: self.caches.first().map_or(0, |c| c.offset() as u32),
            peak_memory_bytes: mlx_rs::memory::peak_memory().unwrap_or(0) as u64,
        }
    }
}

impl MethodRun for Generation {
    fn step(&mut self, out: &mut Output<'_>) -> Result<RunStep> {
        self.advance(out)
    }

    fn metrics(&self) -> GenerateStats {
        self.stats()
    }

    fn close(self: Box<Self>) -> Result<()> {
        drop(self);
        Ok(())
    }
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}
