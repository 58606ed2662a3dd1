//! The autoregressive method: one generation as a row (`method::Row`) whose steps the engine
//! runs alone or with other rows of its model: prefill chunks first (all prompt tokens but the
//! last, as mlx-lm does), then one token per step. Decode is pipelined: step n+1's graph is built
//! and handed to `async_eval` before token n is read back, so graph construction overlaps
//! evaluation. A row with a grammar cannot be pipelined (the next mask depends on the token
//! just sampled): it reads each token in the step that samples it, and computes the mask while
//! MLX runs the step's forward.
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use mlx_rs::transforms::async_eval;
use mlx_rs::Array;

use super::caller_cache::{CacheLease, CallerCaches};
use super::events::{FinishReason, GenerateStats};
use super::method::{MethodRun, Plan, Row, Step};
use super::placement::{Mechanism, ResolvedExecution};
use super::rows::{self, Feed, RowCaches};
use super::session::{MethodResult, Output};
use crate::cache::{LayerCache, PrefixCache};
use crate::error::{Error, Result};
use crate::model::{LanguageModel, Logits};
use crate::sample::grammar::{self, Constraint};
use crate::sample::logprobs::{PendingLogprobs, TokenLogprobs, TopLogprob};
use crate::sample::{GenerateOptions, Sampler};

/// mlx-lm clears MLX's buffer cache every 256 decode steps.
const CLEAR_CACHE_EVERY: u32 = 256;

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

/// What a generation fed the step in flight.
enum Fed {
    Nothing,
    /// `n` prompt tokens.
    Prompt(usize),
    /// One token, whose logits are sampled at this sampling step.
    Token(u64),
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

impl Caches {
    /// Puts the caches it holds for `prompt` in `caches`; returns the prompt tokens they hold.
    pub(super) fn open(&self, prompt: &[u32], caches: &mut RowCaches) -> Result<Option<usize>> {
        let found = match self {
            Caches::Fresh => None,
            Caches::Prefix(p) => p.cache.borrow_mut().take(prompt, &p.namespace, p.session.as_deref()).map(|hit| (hit.caches, hit.tokens)),
            Caches::Caller(lease, store) => lease.take(store).map(|c| {
                let held = c.first().map_or(0, LayerCache::offset);
                (c, held)
            }),
        };
        let Some((layers, held)) = found else { return Ok(None) };
        // The caller's cache was checked against the prompt when the request was opened.
        if held >= prompt.len() {
            return Err(Error::Internal(format!("a cache of {held} positions for a prompt of {}", prompt.len())));
        }
        caches.replace(layers);
        Ok(Some(held))
    }

    /// Hands the caches on when the row is closed: to their caller (always, holding the prompt
    /// and every token forwarded), or to the prefix cache (when it `ended` whole), keyed by the
    /// first tokens of `sequence` (prompt, then output).
    pub(super) fn close(self, caches: &mut RowCaches, sequence: impl Iterator<Item = u32>, ended: bool) -> Result<()> {
        if matches!(self, Caches::Fresh) || (matches!(self, Caches::Prefix(_)) && !ended) {
            return Ok(());
        }
        match (self, caches.take()) {
            (Caches::Caller(lease, _), Err(e)) => {
                lease.lose();
                Err(e)
            }
            (Caches::Caller(lease, store), Ok(layers)) => {
                lease.give_back(&store, layers);
                Ok(())
            }
            (Caches::Prefix(p), layers) => {
                let layers = layers?;
                let n = layers.first().map_or(0, LayerCache::offset);
                let tokens: Vec<u32> = sequence.take(n).collect();
                if tokens.len() == n {
                    p.cache.borrow_mut().put(tokens, layers, &p.namespace, p.session.as_deref());
                }
                Ok(())
            }
            (Caches::Fresh, _) => Ok(()),
        }
    }

    /// Dropped without closing (after a panic in a step the row took part in): a caller's cache
    /// loses its layers and starts empty.
    pub(super) fn abandon(self) {
        if let Caches::Caller(lease, _) = self {
            lease.lose();
        }
    }
}

enum Checkpoint {
    Off,
    Wanted,
    Taken(Vec<LayerCache>),
}

pub struct Generation {
    model: Rc<dyn LanguageModel>,
    caches: RowCaches,
    prompt: Vec<u32>,
    prefilled: usize,
    /// Prompt tokens already in the caches it started from.
    cached: usize,
    source: Caches,
    /// Every token read back, EOS included: with the prompt, what the caches hold.
    output: Vec<u32>,
    /// Finished (stop or length) rather than failed: the caches are whole.
    ended: bool,
    /// Placement's `checkpoint`: its caches cannot be trimmed, so a snapshot of them at the end
    /// of the prompt (all of it but the last token, which the first decode step forwards) goes
    /// to the prefix cache beside the final entry: a later prompt that shares the prompt but not
    /// the output (a regenerated reply, an edited turn) starts from there.
    checkpoint: Checkpoint,
    opts: GenerateOptions,
    eos: Vec<u32>,
    sampler: Sampler,
    /// The token the step in flight samples, read back after the next step is queued.
    pending: Option<Sampled>,
    /// The token the step before sampled, published by this step.
    current: Option<Sampled>,
    fed: Fed,
    /// Its output was stopped: the step ends it.
    stopping: bool,
    generated: u32,
    continuous: bool,
    /// The request's grammar, when it has one.
    constraint: Option<Constrained>,
    started: Instant,
    first_token: Option<Instant>,
}

/// A grammar row's state between its steps.
struct Constrained {
    grammar: Constraint,
    /// Feed forced tokens (the only continuation the grammar allows) with the sampled token in
    /// one step, instead of one step each (placement's `grammarJump`).
    jump: bool,
    /// The tokens the next step feeds: read back already, and consumed by the grammar.
    next: Vec<u32>,
    /// The step's logits, until the mask is applied.
    logits: Option<Array>,
}

impl Generation {
    /// The plan of a generation: at most `maxTokens` tokens; the run is built when it starts.
    /// `placed`: where placement put it (its decode steps may be batched with other generations
    /// of the model when continuous). `caches`: where its caches come from, and go when it ends.
    pub fn plan(model: Rc<dyn LanguageModel>, prompt: Vec<u32>, opts: GenerateOptions, placed: &ResolvedExecution, caches: Caches) -> Plan {
        let continuous = placed.mechanism == Mechanism::Continuous;
        let jump = placed.grammar_jump;
        let checkpoint = placed.checkpoint && matches!(caches, Caches::Prefix(_));
        Plan {
            output_token_limit: f64::from(opts.max_tokens),
            start: Box::new(move || {
                let mut g = Generation::new(model, prompt, opts)?;
                g.continuous = continuous;
                if checkpoint {
                    g.checkpoint = Checkpoint::Wanted;
                }
                if let Some(c) = &mut g.constraint {
                    c.jump = jump;
                }
                g.start_from(caches)?;
                Ok(Box::new(g) as Box<dyn MethodRun>)
            }),
        }
    }

    fn start_from(&mut self, source: Caches) -> Result<()> {
        if let Some(held) = source.open(&self.prompt, &mut self.caches)? {
            self.prefilled = held;
            self.cached = held;
        }
        self.source = source;
        self.take_checkpoint();
        Ok(())
    }

    /// Snapshots the caches once they hold the whole prompt but its last token (see `checkpoint`).
    /// A snapshot that cannot be had (a failed copy out of a stack) only means no checkpoint.
    fn take_checkpoint(&mut self) {
        if matches!(self.checkpoint, Checkpoint::Wanted) && self.prefilled + 1 == self.prompt.len() {
            if let Ok(Some(caches)) = self.caches.prefix(self.prefilled) {
                self.checkpoint = Checkpoint::Taken(caches);
            }
        }
    }

    /// Hands the caches on when the generation is closed (`Caches::close`), its checkpoint first.
    fn return_caches(&mut self) -> Result<()> {
        if let (Checkpoint::Taken(caches), Caches::Prefix(p)) = (std::mem::replace(&mut self.checkpoint, Checkpoint::Off), &self.source) {
            let tokens = self.prompt[..self.prompt.len() - 1].to_vec();
            p.cache.borrow_mut().put(tokens, caches, &p.namespace, p.session.as_deref());
        }
        let source = std::mem::replace(&mut self.source, Caches::Fresh);
        source.close(&mut self.caches, self.prompt.iter().chain(&self.output).copied(), self.ended)
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
        let constraint = match &opts.grammar {
            Some(spec) => {
                let grammar = Constraint::for_model(&model.config().model_path(), model.config().vocab_size, spec)?;
                let last = *prompt.last().ok_or_else(|| Error::InvalidPrompt("the prompt is empty".into()))?;
                Some(Constrained { grammar, jump: false, next: vec![last], logits: None })
            }
            None => None,
        };
        Ok(Generation {
            constraint,
            caches: RowCaches::fresh(model.as_ref(), &opts)?,
            model,
            prompt,
            prefilled: 0,
            cached: 0,
            source: Caches::Fresh,
            output: Vec::new(),
            ended: false,
            checkpoint: Checkpoint::Off,
            opts,
            eos,
            sampler,
            pending: None,
            current: None,
            fed: Fed::Nothing,
            stopping: false,
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
    fn deliver(&mut self, out: &mut Output<'_>) -> Result<Step> {
        let total = self.prompt.len() as f64;
        let Some(current) = self.current.take() else {
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

    /// A grammar row's decode step: the tokens read back last step (the last prompt token
    /// first), with the logits of the last one.
    fn propose_constrained(&mut self) -> Option<Feed> {
        let c = self.constraint.as_mut().expect("a grammar row");
        if c.next.is_empty() {
            return None;
        }
        let next = std::mem::take(&mut c.next);
        self.fed = Fed::Token(self.output.len() as u64);
        Some(Feed { tokens: ids(&next), count: next.len(), logits: Logits::Last })
    }

    /// With the step's forward running: the grammar's mask, then the token sampled under it
    /// (queued for evaluation, read back by `publish_constrained`).
    fn sample_constrained(&mut self) -> Result<()> {
        let Fed::Token(step) = self.fed else { return Ok(()) };
        let c = self.constraint.as_mut().expect("a grammar row");
        let Some(logits) = c.logits.take() else { return Ok(()) };
        let allowed = c.grammar.mask(&self.eos)?;
        let logits = grammar::apply(&logits, &allowed)?;
        let sampled = self.sample(&logits, step)?;
        self.sampler.push(&sampled.token)?;
        async_eval(sampled.arrays())?;
        self.current = Some(sampled);
        Ok(())
    }

    /// Publishes the token sampled under the grammar, feeds it to the grammar, and, where the
    /// grammar then forces what follows, publishes those tokens too and feeds them with it in
    /// the next step.
    fn publish_constrained(&mut self, out: &mut Output<'_>) -> Result<Step> {
        if let Step::Done(r) = self.deliver(out)? {
            return Ok(Step::Done(r));
        }
        let id = *self.output.last().expect("a token was delivered");
        let c = self.constraint.as_mut().expect("a grammar row");
        c.grammar.consume(id)?;
        let mut next = vec![id];
        if c.jump && !c.grammar.finished() {
            let forced = c.grammar.forced();
            let room = (self.opts.max_tokens - self.generated) as usize;
            for &f in forced.iter().take(room) {
                self.sampler.push(&Array::from_slice(&[f], &[1]))?;
                self.output.push(f);
                // Logprobs are those of the masked distribution, where a forced token is certain.
                let certain = self.opts.wants_logprobs().then(|| TokenLogprobs {
                    logprob: 0.0,
                    top: if self.opts.top_logprobs > 0 { vec![TopLogprob { id: f, logprob: 0.0 }] } else { Vec::new() },
                });
                out.commit(&[f], certain.as_ref().map(std::slice::from_ref))?;
                self.generated += 1;
            }
            next.extend(forced.iter().take(room));
        }
        let c = self.constraint.as_mut().expect("a grammar row");
        c.next = next;
        if c.grammar.finished() {
            return Ok(self.done(FinishReason::Stop));
        }
        if self.generated >= self.opts.max_tokens {
            return Ok(self.done(FinishReason::Length));
        }
        Ok(Step::Continue)
    }

    pub fn stats(&self) -> GenerateStats {
        let positions = self.caches.positions() as u32;
        GenerateStats {
            cached_tokens: self.cached as u32,
            ..GenerateStats::measured(self.started, self.first_token, self.prompt.len() as u32, self.generated, positions)
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        std::mem::replace(&mut self.source, Caches::Fresh).abandon();
    }
}

/// Prefill chunks first (all prompt tokens but the last, as mlx-lm does), then one token per
/// step: the last prompt token, then each token sampled, while the one before is read back.
impl Row for Generation {
    fn model(&self) -> &Rc<dyn LanguageModel> {
        &self.model
    }

    fn caches(&mut self) -> &mut RowCaches {
        &mut self.caches
    }

    fn batchable(&self) -> bool {
        self.continuous
    }

    /// All prompt tokens but the last, which the first decode step forwards.
    fn prompt_left(&self) -> usize {
        (self.prompt.len() - 1).saturating_sub(self.prefilled)
    }

    fn chunk_limit(&self) -> usize {
        self.opts.prefill_chunk_size as usize
    }

    fn shared_prompt(&self) -> Option<(&[u32], usize)> {
        matches!(self.source, Caches::Prefix(_)).then_some((&self.prompt, self.prefilled))
    }

    fn adopt_prefix(&mut self, caches: Vec<LayerCache>, n: usize) {
        self.caches.replace(caches);
        self.prefilled = n;
        self.cached = n;
        self.take_checkpoint();
    }

    fn propose(&mut self, out: &Output<'_>, max: usize) -> Result<Option<Feed>> {
        self.fed = Fed::Nothing;
        if out.stopped() {
            self.stopping = true;
            return Ok(None);
        }
        let left = self.prompt_left();
        if left > 0 {
            let n = left.min(max.max(1));
            self.fed = Fed::Prompt(n);
            let tokens = ids(&self.prompt[self.prefilled..self.prefilled + n]);
            return Ok(Some(Feed { tokens, count: n, logits: Logits::None }));
        }
        if self.constraint.is_some() {
            return Ok(self.propose_constrained());
        }
        // Queue the next step before reading this one, unless this is the last token allowed.
        let current = self.pending.take();
        let next = self.next_input(current.as_ref());
        self.current = current;
        Ok(next?.map(|(tokens, step)| {
            self.fed = Fed::Token(step);
            Feed { tokens, count: 1, logits: Logits::Last }
        }))
    }

    fn accept(&mut self, logits: Option<Array>) -> Result<Vec<Array>> {
        match (&self.fed, logits) {
            (Fed::Prompt(n), _) => {
                self.prefilled += n;
                self.take_checkpoint();
                Ok(Vec::new())
            }
            (Fed::Token(_), Some(logits)) if self.constraint.is_some() => {
                // Its sampling waits for the mask (`overlap`); the forward starts now.
                let c = self.constraint.as_mut().expect("a grammar row");
                c.logits = Some(logits.clone());
                Ok(vec![logits])
            }
            (&Fed::Token(step), Some(logits)) => {
                let next = self.sample(&logits, step)?;
                let arrays = next.arrays().into_iter().cloned().collect();
                self.pending = Some(next);
                Ok(arrays)
            }
            (Fed::Token(_), None) => Err(Error::Internal("a decode step returned no logits".into())),
            (Fed::Nothing, _) => Ok(Vec::new()),
        }
    }

    fn overlap(&mut self) -> Result<()> {
        if self.constraint.is_some() {
            self.sample_constrained()?;
        }
        Ok(())
    }

    fn publish(&mut self, out: &mut Output<'_>) -> Result<Step> {
        if self.stopping {
            return Ok(self.done(FinishReason::Stop));
        }
        if let Fed::Prompt(_) = self.fed {
            out.progress(self.prefilled as f64, Some(self.prompt.len() as f64))?;
            return Ok(Step::Continue);
        }
        if self.constraint.is_some() && matches!(self.fed, Fed::Token(_)) {
            return self.publish_constrained(out);
        }
        self.deliver(out)
    }
}

impl MethodRun for Generation {
    fn step(&mut self, out: &mut Output<'_>) -> Result<Step> {
        rows::step_alone(self, out)
    }

    fn metrics(&self) -> GenerateStats {
        self.stats()
    }

    fn close(mut self: Box<Self>) -> Result<()> {
        self.return_caches()
    }

    fn row(&mut self) -> Option<&mut dyn Row> {
        Some(self)
    }

    fn row_ref(&self) -> Option<&dyn Row> {
        Some(self)
    }
}

fn ids(tokens: &[u32]) -> Array {
    Array::from_slice(tokens, &[1, tokens.len() as i32])
}
