//! One autoregressive generation as a step machine the engine thread advances a unit at a time:
//! prefill chunks first (all prompt tokens but the last, as mlx-lm does), then decode steps.
//! Decode is pipelined: step n+1's graph is built and handed to `async_eval` before token n is
//! read back, so graph construction overlaps evaluation.
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::{async_eval, eval};
use mlx_rs::Array;
use tokio::sync::mpsc::UnboundedSender;

use super::events::{Event, FinishReason, GenerateStats};
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
    sink: UnboundedSender<Event>,
    cancel: Arc<AtomicBool>,
    started: Instant,
    first_token: Option<Instant>,
}

impl Generation {
    pub fn new(
        model: Rc<dyn LanguageModel>,
        prompt: Vec<u32>,
        opts: GenerateOptions,
        sink: UnboundedSender<Event>,
        cancel: Arc<AtomicBool>,
    ) -> Result<Self> {
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
            sink,
            cancel,
            started: Instant::now(),
            first_token: None,
        })
    }

    /// Whether the consumer is gone or asked to stop.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire) || self.sink.is_closed()
    }

    /// Runs one unit of work. Returns `Some(reason)` when the generation has finished; the
    /// terminal event has then been sent.
    pub fn advance(&mut self) -> Result<Option<FinishReason>> {
        if self.cancelled() {
            return Ok(Some(self.finish(FinishReason::Cancelled)));
        }
        let last = self.prompt.len() - 1;
        if self.prefilled < last {
            let n = (last - self.prefilled).min(self.opts.prefill_chunk_size as usize);
            let chunk = &self.prompt[self.prefilled..self.prefilled + n];
            self.model.hidden(&ids(chunk), &mut self.caches)?;
            eval(self.caches.iter().flat_map(|c| c.state()))?;
            mlx_rs::memory::clear_cache()?;
            self.prefilled += n;
            return Ok(None);
        }
        let Some(current) = self.pending.take() else {
            let first = self.forward(&ids(&self.prompt[last..]), 0)?;
            self.pending = Some(first);
            return Ok(None);
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
            return Ok(Some(self.finish(FinishReason::Stop)));
        }
        let logprobs = current.logprobs.as_ref().map(PendingLogprobs::read).transpose()?;
        self.generated += 1;
        let _ = self.sink.send(Event::Token { id, logprobs });
        if self.generated % CLEAR_CACHE_EVERY == 0 {
            mlx_rs::memory::clear_cache()?;
        }
        if self.generated >= self.opts.max_tokens {
            return Ok(Some(self.finish(FinishReason::Length)));
        }
        Ok(None)
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

    fn finish(&mut self, reason: FinishReason) -> FinishReason {
        let _ = self.sink.send(Event::Done { reason, stats: self.stats() });
        reason
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

    /// Reports a failure as the terminal event.
    pub fn fail(&mut self, error: Error) {
        let _ = self.sink.send(Event::Failed(error));
    }
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}
