//! The autoregressive method: one generation as a step machine the engine thread advances a unit
//! at a time: prefill chunks first (all prompt tokens but the last, as mlx-lm does), then decode
//! steps.
//! Decode is pipelined: step n+1's graph is built and handed to `async_eval` before token n is
//! read back, so graph construction overlaps evaluation.
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::async_eval;
use mlx_rs::{ops, Array};

use super::events::{FinishReason, GenerateStats};
use super::method::{MethodRun, Plan, Step};
use super::session::{MethodResult, Output};
use super::caller_cache::{CacheLease, CallerCaches};
use crate::cache::{BatchKvCache, CacheView, LayerCache, PrefixCache};
use crate::error::{Error, Result};
use crate::mlx::{backend, gate};
use crate::model::{LanguageModel, Logits, StepContext, Tokens};
use crate::sample::logprobs::PendingLogprobs;
use crate::sample::{GenerateOptions, Sampler};

/// mlx-lm clears MLX's buffer cache every 256 decode steps.
const CLEAR_CACHE_EVERY: u32 = 256;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The token a queued step samples (lazy until read), with its logprobs.
struct Sampled {
    token: Array,
    logprobs: Option<PendingLogprobs>,
}

impl Sampled {
    fn arrays(&self) -> Vec<&Array> {
        let mut v = vec![&self.token];
        if let Some(lp) = &self.logprobs {
            v.extend(lp.arrays());
        }
        v
    }
}

/// Where a generation's caches come from and go when it ends.
pub enum Caches {
    /// New ones, dropped at the end.
    Fresh,
    /// The engine's prefix cache: the longest prefix it holds, then back to it.
    Prefix(PrefixUse),
    /// A caller's own cache (`model.makeCache()`): taken, then given back appended to.
    Caller(CacheLease, CallerCaches),
}

/// A generation's use of the engine's prefix cache.
pub struct PrefixUse {
    pub cache: Rc<RefCell<PrefixCache>>,
    pub namespace: String,
    pub session: Option<String>,
}

pub struct Generation {
    id: u64,
    model: Rc<dyn LanguageModel>,
    caches: Vec<LayerCache>,
    /// The stacked cache that holds this generation's KV (its own `caches` are then empty)
    /// since it last decoded in a batch.
    stack: Option<Rc<RefCell<BatchKvCache>>>,
    prompt: Vec<u32>,
    prefilled: usize,
    /// Prompt tokens already in the caches it started from.
    cached: usize,
    source: Caches,
    /// Every token read back, EOS included: with the prompt, what the caches hold.
    output: Vec<u32>,
    /// Finished (stop or length) rather than failed: the caches are whole.
    ended: bool,
    opts: GenerateOptions,
    eos: Vec<u32>,
    sampler: Sampler,
    pending: Option<Sampled>,
    generated: u32,
    continuous: bool,
    started: Instant,
    first_token: Option<Instant>,
}

impl Generation {
    /// The plan of a generation: at most `maxTokens` tokens; the run is built when it starts.
    /// `continuous`: its decode steps may be batched with other generations of the model.
    /// `caches`: where its caches come from, and go when it ends.
    pub fn plan(model: Rc<dyn LanguageModel>, prompt: Vec<u32>, opts: GenerateOptions, continuous: bool, caches: Caches) -> Plan<Box<Generation>> {
        Plan {
            output_token_limit: f64::from(opts.max_tokens),
            start: Box::new(move || {
                let mut g = Generation::new(model, prompt, opts)?;
                g.continuous = continuous;
                g.start_from(caches)?;
                Ok(Box::new(g))
            }),
        }
    }

    fn start_from(&mut self, source: Caches) -> Result<()> {
        let found = match &source {
            Caches::Fresh => None,
            Caches::Prefix(p) => p.cache.borrow_mut().take(&self.prompt, &p.namespace, p.session.as_deref()).map(|hit| (hit.caches, hit.tokens)),
            Caches::Caller(lease, store) => lease.take(store).map(|c| {
                let held = c.first().map_or(0, LayerCache::offset);
                (c, held)
            }),
        };
        self.source = source;
        if let Some((caches, held)) = found {
            // The caller's cache was checked against the prompt when the request was opened.
            if held >= self.prompt.len() {
                return Err(Error::Internal(format!("a cache of {held} positions for a prompt of {}", self.prompt.len())));
            }
            self.caches = caches;
            self.prefilled = held;
            self.cached = held;
        }
        Ok(())
    }

    /// Hands the caches on when the generation is closed: to their caller (always, holding the
    /// prompt and every token forwarded), or to the prefix cache (when it ended whole).
    fn return_caches(&mut self) -> Result<()> {
        let source = std::mem::replace(&mut self.source, Caches::Fresh);
        if matches!(source, Caches::Fresh) || (matches!(source, Caches::Prefix(_)) && !self.ended) {
            return Ok(());
        }
        let caches = match self.stack.take() {
            Some(stack) => stack.borrow_mut().take_ended(self.id),
            None => Ok(std::mem::take(&mut self.caches)),
        };
        match (source, caches) {
            (Caches::Caller(lease, _), Err(e)) => {
                lease.lose();
                Err(e)
            }
            (Caches::Caller(lease, store), Ok(caches)) => {
                lease.give_back(&store, caches);
                Ok(())
            }
            (Caches::Prefix(p), caches) => {
                let caches = caches?;
                let n = caches.first().map_or(0, LayerCache::offset);
                let tokens: Vec<u32> = self.prompt.iter().chain(&self.output).copied().take(n).collect();
                if tokens.len() == n {
                    p.cache.borrow_mut().put(tokens, caches, &p.namespace, p.session.as_deref());
                }
                Ok(())
            }
            (Caches::Fresh, _) => Ok(()),
        }
    }

    pub fn new(
        model: Rc<dyn LanguageModel>,
        prompt: Vec<u32>,
        opts: GenerateOptions,
    ) -> Result<Self> {
        let eos = opts
            .eos_token_ids
            .clone()
            .unwrap_or_else(|| model.config().eos_token_ids.clone());
        let sampler = Sampler::new(opts.sampling.clone(), &prompt)?;
        Ok(Generation {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            caches: model.new_cache(),
            stack: None,
            model,
            prompt,
            prefilled: 0,
            cached: 0,
            source: Caches::Fresh,
            output: Vec::new(),
            ended: false,
            opts,
            eos,
            sampler,
            pending: None,
            generated: 0,
            continuous: false,
            started: Instant::now(),
            first_token: None,
        })
    }

    fn done(&mut self, finish_reason: FinishReason) -> Step {
        self.ended = true;
        Step::Done(MethodResult {
            finish_reason,
            metrics: self.stats(),
        })
    }

    fn advance(&mut self, out: &mut Output<'_>) -> Result<Step> {
        if out.stopped() {
            return Ok(self.done(FinishReason::Stop));
        }
        if self.prefill_left() > 0 {
            return self.prefill(out, self.prefill_chunk_size());
        }
        self.unstack()?;
        let current = self.pending.take();
        // Queue the next step before reading this one, unless this is the last token allowed.
        if let Some((input, step)) = self.next_input(current.as_ref())? {
            let logits = self
                .model
                .forward(&Tokens::uniform(input), CacheView::Rows(&mut [&mut self.caches]), &StepContext::LAST)?
                .ok_or_else(|| Error::Internal("a decode step returned no logits".into()))?
                .reshape(&[1, -1])?;
            let next = self.sample(&logits, step)?;
            async_eval(next.arrays())?;
            self.pending = Some(next);
        }
        self.deliver(current, out)
    }

    /// One prefill chunk of at most `max` prompt tokens.
    pub fn prefill(&mut self, out: &mut Output<'_>, max: usize) -> Result<Step> {
        if out.stopped() {
            return Ok(self.done(FinishReason::Stop));
        }
        let n = self.prefill_left().min(max.max(1));
        let chunk = &self.prompt[self.prefilled..self.prefilled + n];
        let check = || {
            between_parts()?;
            out.check_cancelled()
        };
        let ctx = StepContext { logits: Logits::None, check: Some(&check) };
        self.model.forward(&Tokens::one(chunk), CacheView::Rows(&mut [&mut self.caches]), &ctx)?;
        mlx_rs::memory::clear_cache()?;
        self.prefilled += n;
        out.progress(self.prefilled as f64, Some(self.prompt.len() as f64))?;
        Ok(Step::Continue)
    }

    /// Prompt tokens still to prefill: all but the last, which the first decode step forwards.
    pub fn prefill_left(&self) -> usize {
        (self.prompt.len() - 1).saturating_sub(self.prefilled)
    }

    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// Prompt tokens in the caches so far.
    pub fn prefilled(&self) -> usize {
        self.prefilled
    }

    /// Whether this generation may share prompt prefixes with others running with it (its
    /// placement uses the prefix cache).
    pub fn shares_prefixes(&self) -> bool {
        matches!(self.source, Caches::Prefix(_))
    }

    /// The model, as an identity: rows share caches only within one model.
    pub fn model_key(&self) -> *const () {
        Rc::as_ptr(&self.model) as *const ()
    }

    /// Caches holding the first `n` prompt tokens, if these are prefilled: a snapshot of this
    /// generation's own caches (cheap: the arrays are shared until either side writes) with the
    /// rest trimmed, or a copy of its row of a stacked batch; `None` when the rest cannot be
    /// trimmed (a rotating cache that has wrapped).
    pub fn prefix_snapshot(&self, n: usize) -> Result<Option<Vec<LayerCache>>> {
        if self.prefilled < n {
            return Ok(None);
        }
        if let Some(stack) = &self.stack {
            return stack.borrow_mut().row_prefix(self.id, n);
        }
        let held = self.caches.first().map_or(0, LayerCache::offset);
        if held > n && !self.caches.iter().all(LayerCache::is_trimmable) {
            return Ok(None);
        }
        let mut caches = self.caches.clone();
        for c in &mut caches {
            c.trim(held - n);
        }
        Ok(Some(caches))
    }

    /// Starts from another row's snapshot of the first `n` prompt tokens (see `prefix_snapshot`).
    pub fn adopt_prefix(&mut self, caches: Vec<LayerCache>, n: usize) {
        self.caches = caches;
        self.prefilled = n;
        self.cached = n;
    }

    /// The longest prefill chunk this request allows.
    pub fn prefill_chunk_size(&self) -> usize {
        self.opts.prefill_chunk_size as usize
    }

    /// One prefill chunk of `n` prompt tokens for each of several generations of the same model,
    /// in one graph: their chunks are forwarded as a batch, each row on its own caches. A row
    /// whose output was stopped ends instead. Returns each row's result, in order.
    pub fn prefill_batch(
        rows: &mut [(&mut Generation, Output<'_>)],
        n: usize,
    ) -> Vec<Result<Step>> {
        let going: Vec<bool> = rows
            .iter()
            .map(|(g, out)| !out.stopped() && g.prefill_left() >= n)
            .collect();
        if let Err(e) = Self::forward_prefill(rows, &going, n) {
            return rows.iter().map(|_| Err(e.replicate())).collect();
        }
        rows.iter_mut()
            .zip(going)
            .map(|((g, out), going)| {
                if !going {
                    return Ok(g.done(FinishReason::Stop));
                }
                g.prefilled += n;
                out.progress(g.prefilled as f64, Some(g.prompt.len() as f64))?;
                Ok(Step::Continue)
            })
            .collect()
    }

    fn forward_prefill(
        rows: &mut [(&mut Generation, Output<'_>)],
        going: &[bool],
        n: usize,
    ) -> Result<()> {
        let (mut chosen, outs): (Vec<&mut Generation>, Vec<&Output<'_>>) = rows
            .iter_mut()
            .zip(going)
            .filter(|(_, &go)| go)
            .map(|((g, out), _)| (&mut **g, &*out))
            .unzip();
        let Some(first) = chosen.first() else {
            return Ok(());
        };
        let model = first.model.clone();
        let tokens: Vec<u32> = chosen
            .iter()
            .flat_map(|g| g.prompt[g.prefilled..g.prefilled + n].iter().copied())
            .collect();
        let ids = Array::from_slice(&tokens, &[chosen.len() as i32, n as i32]);
        let mut caches: Vec<&mut [LayerCache]> =
            chosen.iter_mut().map(|g| g.caches.as_mut_slice()).collect();
        // The step ends early only when no row wants it any more.
        let check = || {
            between_parts()?;
            if outs.iter().any(|o| o.check_cancelled().is_ok()) {
                Ok(())
            } else {
                outs[0].check_cancelled()
            }
        };
        let ctx = StepContext { logits: Logits::None, check: Some(&check) };
        model.forward(&Tokens::uniform(ids), CacheView::Rows(&mut caches), &ctx)?;
        mlx_rs::memory::clear_cache()?;
        Ok(())
    }

    /// The prompt is processed up to its last token: the next unit is one token's forward (or
    /// only reading the last token), which can run batched with other generations.
    pub fn decode_ready(&self) -> bool {
        self.prefilled + 1 >= self.prompt.len()
    }

    /// Groups batchable generations: those placed continuous, by model.
    pub fn batch_key(&self) -> Option<*const ()> {
        self.continuous
            .then(|| Rc::as_ptr(&self.model) as *const ())
    }

    /// The token to forward next and its sampling step: the last prompt token first, then each
    /// sampled token, except after the last token allowed.
    fn next_input(&mut self, current: Option<&Sampled>) -> Result<Option<(Array, u64)>> {
        match current {
            None => Ok(Some((ids(&self.prompt[self.prompt.len() - 1..]), 0))),
            Some(c) if self.generated + 1 < self.opts.max_tokens => {
                self.sampler.push(&c.token)?;
                Ok(Some((
                    c.token.reshape(&[1, 1])?,
                    u64::from(self.generated) + 1,
                )))
            }
            Some(_) => Ok(None),
        }
    }

    /// The lazy token (and logprobs) sampled from `logits` [1, V].
    fn sample(&mut self, logits: &Array, step: u64) -> Result<Sampled> {
        let (token, logprobs) = self.sampler.sample(logits, step)?;
        let token = token.reshape(&[1])?;
        let logprobs = if self.opts.wants_logprobs() {
            Some(PendingLogprobs::new(
                &logprobs,
                &token,
                self.opts.top_logprobs,
            )?)
        } else {
            None
        };
        Ok(Sampled { token, logprobs })
    }

    /// Reads the step queued before (if any) and publishes its token.
    fn deliver(&mut self, current: Option<Sampled>, out: &mut Output<'_>) -> Result<Step> {
        let total = self.prompt.len() as f64;
        let Some(current) = current else {
            out.progress(total, Some(total))?;
            return Ok(Step::Continue);
        };
        let id = current
            .token
            .try_item_exact::<u32>()
            .map_err(|e| Error::Mlx(e.to_string()))?;
        if self.first_token.is_none() {
            self.first_token = Some(Instant::now());
        }
        self.output.push(id);
        if self.eos.contains(&id) {
            return Ok(self.done(FinishReason::Stop));
        }
        let logprobs = current
            .logprobs
            .as_ref()
            .map(PendingLogprobs::read)
            .transpose()?;
        out.commit(&[id], logprobs.as_ref().map(std::slice::from_ref))?;
        self.generated += 1;
        if self.generated % CLEAR_CACHE_EVERY == 0 {
            mlx_rs::memory::clear_cache()?;
        }
        if self.generated >= self.opts.max_tokens {
            return Ok(self.done(FinishReason::Length));
        }
        Ok(Step::Continue)
    }

    /// One decode unit for several generations of the same model, in one graph: their next
    /// tokens are forwarded as a batch (each row keeps its own caches and length), each row
    /// samples with its own sampler and step, then each reads and publishes the token it had
    /// queued, exactly as `advance` does alone. Returns each row's result, in order.
    pub fn step_batch(rows: &mut [(&mut Generation, Output<'_>)]) -> Vec<Result<Step>> {
        let mut results: Vec<Option<Result<Step>>> = rows.iter().map(|_| None).collect();
        let mut currents = Vec::with_capacity(rows.len());
        let mut inputs = Vec::new();
        for (i, (g, out)) in rows.iter_mut().enumerate() {
            let current = g.pending.take();
            if out.stopped() {
                results[i] = Some(Ok(g.done(FinishReason::Stop)));
            } else {
                match g.next_input(current.as_ref()) {
                    Ok(Some((input, step))) => inputs.push((i, input, step)),
                    Ok(None) => {}
                    Err(e) => results[i] = Some(Err(e)),
                }
            }
            currents.push(current);
        }
        if let Err(e) = Self::forward_batch(rows, &inputs) {
            return rows.iter().map(|_| Err(e.replicate())).collect();
        }
        rows.iter_mut()
            .zip(currents)
            .zip(results)
            .map(|(((g, out), current), result)| result.unwrap_or_else(|| g.deliver(current, out)))
            .collect()
    }

    /// Forwards `inputs` (row index, token [1, 1], sampling step) as one batch and queues each
    /// row's next step.
    fn forward_batch(
        rows: &mut [(&mut Generation, Output<'_>)],
        inputs: &[(usize, Array, u64)],
    ) -> Result<()> {
        let Some(&(first, ..)) = inputs.first() else {
            return Ok(());
        };
        let model = rows[first].0.model.clone();
        let batch = ops::concatenate(&inputs.iter().map(|(_, t, _)| t).collect::<Vec<_>>(), 0)?;
        let tokens = Tokens::uniform(batch);
        let logits = if model.stackable() {
            let stack = Self::stack(rows, inputs)?;
            let mut stack = stack.borrow_mut();
            model.forward(&tokens, CacheView::Stacked(&mut stack), &StepContext::LAST)?
        } else {
            let mut caches: Vec<&mut [LayerCache]> = Vec::with_capacity(inputs.len());
            let mut chosen = inputs.iter().map(|(i, ..)| *i).peekable();
            for (i, (g, _)) in rows.iter_mut().enumerate() {
                if chosen.peek() == Some(&i) {
                    chosen.next();
                    caches.push(&mut g.caches);
                }
            }
            model.forward(&tokens, CacheView::Rows(&mut caches), &StepContext::LAST)?
        };
        let logits = logits.ok_or_else(|| Error::Internal("a decode step returned no logits".into()))?;
        let mut arrays = Vec::new();
        for (row, (i, _, step)) in inputs.iter().enumerate() {
            let g = &mut rows[*i].0;
            let next = g.sample(&logits.index(row as i32).reshape(&[1, -1])?, *step)?;
            arrays.extend(next.arrays().into_iter().cloned());
            g.pending = Some(next);
        }
        async_eval(&arrays)?;
        Ok(())
    }

    /// The stacked cache for `inputs`' rows (the one the first of them is in, or a new one),
    /// arranged in their order. A row in another stack leaves it first.
    fn stack(
        rows: &mut [(&mut Generation, Output<'_>)],
        inputs: &[(usize, Array, u64)],
    ) -> Result<Rc<RefCell<BatchKvCache>>> {
        let stack: Rc<RefCell<BatchKvCache>> = inputs
            .iter()
            .find_map(|(i, ..)| rows[*i].0.stack.clone())
            .unwrap_or_default();
        let mut order = Vec::with_capacity(inputs.len());
        for (i, ..) in inputs {
            let g = &mut *rows[*i].0;
            if g.stack.as_ref().is_some_and(|s| !Rc::ptr_eq(s, &stack)) {
                g.unstack()?;
            }
            let own = g.stack.is_none().then(|| std::mem::take(&mut g.caches));
            g.stack = Some(stack.clone());
            order.push((g.id, own));
        }
        stack.borrow_mut().arrange(order)?;
        Ok(stack)
    }

    /// Takes this generation's caches back from its stack, to step alone.
    fn unstack(&mut self) -> Result<()> {
        if let Some(stack) = self.stack.take() {
            self.caches = stack.borrow_mut().take(self.id)?;
        }
        Ok(())
    }

    fn cache_tokens(&self) -> usize {
        match &self.stack {
            Some(s) => s.try_borrow().ok().and_then(|s| s.len_of(self.id)).unwrap_or(0),
            None => self.caches.first().map_or(0, |c| c.offset()),
        }
    }

    pub fn stats(&self) -> GenerateStats {
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        let prefill = first.duration_since(self.started).as_secs_f64();
        let decode = now.duration_since(first).as_secs_f64();
        let prompt_tokens = self.prompt.len() as u32;
        GenerateStats {
            prompt_tokens,
            cached_tokens: self.cached as u32,
            generated_tokens: self.generated,
            prefill_tps: if prefill > 0.0 {
                prompt_tokens as f64 / prefill
            } else {
                0.0
            },
            decode_tps: if decode > 0.0 {
                self.generated as f64 / decode
            } else {
                0.0
            },
            prefill_ms: prefill * 1e3,
            decode_ms: decode * 1e3,
            cache_tokens: self.cache_tokens() as u32,
            peak_memory_bytes: mlx_rs::memory::peak_memory().unwrap_or(0) as u64,
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        // Dropped without closing (after a panic in a step it took part in): a caller's cache
        // loses its layers and starts empty.
        if let Caches::Caller(lease, _) = std::mem::replace(&mut self.source, Caches::Fresh) {
            lease.lose();
        }
        if let Some(Ok(mut stack)) = self.stack.as_ref().map(|s| s.try_borrow_mut()) {
            stack.forget(self.id);
        }
    }
}

impl MethodRun for Generation {
    fn step(&mut self, out: &mut Output<'_>) -> Result<Step> {
        self.advance(out)
    }

    fn metrics(&self) -> GenerateStats {
        self.stats()
    }

    fn close(mut self: Box<Self>) -> Result<()> {
        self.return_caches()
    }
}

/// Between the parts of a long step, with nothing of the step running in MLX: lets a pending
/// fork go ahead, and ends the step with `EngineClosed` once the process exits (`mlx::gate`).
fn between_parts() -> Result<()> {
    gate::pause_point(backend::synchronize);
    if gate::is_closed() {
        Err(Error::EngineClosed)
    } else {
        Ok(())
    }
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}
