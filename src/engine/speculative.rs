//! Rows that verify proposals. Each step feeds the row's last token and the tokens proposed to
//! follow it, samples a token after each of them with the request's sampler, and keeps the
//! proposals up to the first one the model disagrees with, plus its own token there (mlx-lm's
//! `speculative_generate_step`). Greedy output is the model's greedy output; sampled output draws
//! each position with the key of its index, as a plain generation does.
//!
//! Logprobs, when asked for, are those of each kept position.
//!
//! Proposals come, in priority order, from the request's fill session (`fill`: strict rows, then
//! the echo index; asserted spans are kept whole) and from a draft model (k forwards of the small
//! model, chained lazily into the verify step's graph).
//!
//! A row with a grammar samples each position under the grammar's mask given the proposals
//! before it, consuming the kept ones, so its output is what grammar-constrained decoding gives
//! without proposals (the draft itself proposes unconstrained: a proposal the grammar forbids is
//! simply never kept).
//!
//! The caches are trimmed back to the kept tokens after each step, so the row keeps its own
//! caches (`Row::stackable` is false): in a batch its step shares the graph with the other rows,
//! which then attend row by row.
use std::rc::Rc;
use std::time::Instant;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};

use super::events::{FinishReason, GenerateStats};
use super::fill::{FillConfig, FillPlan, FillSession, Policy, Proposal};
use super::generate::Caches;
use super::method::{MethodRun, Plan, Row, Step};
use super::rows::{self, Feed, RowCaches};
use super::session::{MethodResult, Output};
use crate::cache::{CacheView, LayerCache};
use crate::error::{Error, Result};
use crate::model::{LanguageModel, Logits, StepContext, Tokens};
use crate::sample::grammar::{self, Constraint};
use crate::sample::logprobs::PendingLogprobs;
use crate::sample::{GenerateOptions, Sampler};

/// mlx-lm's `generate --num-draft-tokens` default.
pub const DEFAULT_DRAFT_TOKENS: usize = 3;
/// The most proposals per step: each is a draft forward chained into one graph.
pub const MAX_DRAFT_TOKENS: usize = 64;

/// The draft samples with its own key stream, so its draws never repeat the target's.
const DRAFT_SEED: u64 = 0x5be0_cd19_137e_2179;

/// A draft model's side of a row.
pub struct Drafter {
    model: Rc<dyn LanguageModel>,
    caches: Vec<LayerCache>,
    sampler: Sampler,
    k: usize,
    /// Tokens its caches lack (ending with the row's last token), forwarded before it proposes.
    input: Vec<u32>,
}

impl Drafter {
    pub fn new(model: Rc<dyn LanguageModel>, k: usize, opts: &GenerateOptions, prompt: &[u32]) -> Result<Self> {
        let mut draft_opts = opts.sampling.clone();
        draft_opts.seed ^= DRAFT_SEED;
        let last = *prompt.last().ok_or_else(|| Error::InvalidPrompt("the prompt is empty".into()))?;
        Ok(Drafter { caches: model.new_cache(), sampler: Sampler::new(draft_opts, prompt)?, model, k, input: vec![last] })
    }

    /// Its forward of `tokens` [1, n] over its caches; its last logits if `logits`.
    fn forward(&mut self, tokens: Array, logits: Logits) -> Result<Option<Array>> {
        let mut layers: Vec<&mut [LayerCache]> = vec![self.caches.as_mut_slice()];
        let ctx = StepContext { logits, check: None };
        self.model.forward(&Tokens::uniform(tokens), CacheView::Rows(&mut layers), &ctx)
    }

    /// `k` proposals [k] (lazy): it forwards what it lacks, then each token it samples.
    fn propose(&mut self, k: usize, generated: u32) -> Result<Array> {
        let first = std::mem::take(&mut self.input);
        let mut input = Array::from_slice(&first, &[1, first.len() as i32]);
        let mut drafts = Vec::with_capacity(k);
        for i in 0..k {
            let logits = self.forward(input, Logits::Last)?.ok_or_else(|| Error::Internal("a draft step returned no logits".into()))?;
            let (token, _) = self.sampler.sample(&logits.reshape(&[1, -1])?, u64::from(generated) + i as u64)?;
            let token = token.reshape(&[1, 1])?;
            input = token.clone();
            drafts.push(token);
        }
        Ok(ops::concatenate(&drafts, 1)?.reshape(&[-1])?)
    }
}

/// What the row fed the step in flight.
enum Fed {
    Nothing,
    Prompt(usize),
    /// The last token and `k` draft proposals (0: the last token alone).
    Draft(usize),
    /// The last token and a fill proposal.
    Fill(Proposal),
}

pub struct Speculative {
    model: Rc<dyn LanguageModel>,
    caches: RowCaches,
    source: Caches,
    prompt: Vec<u32>,
    prefilled: usize,
    /// Prompt tokens already in the caches it started from.
    cached: usize,
    /// Every token kept, EOS included: with the prompt, what the caches hold.
    output: Vec<u32>,
    ended: bool,
    opts: GenerateOptions,
    eos: Vec<u32>,
    sampler: Sampler,
    draft: Option<Drafter>,
    fill: Option<FillSession>,
    /// The request's grammar, and the step's logits [count, V] its positions sample from once
    /// their masks are known (`overlap`).
    constraint: Option<Constraint>,
    constrained_logits: Option<Array>,
    /// The last token kept, which the row forwards next.
    last: u32,
    fed: Fed,
    /// The step's draft proposals [k] and the model's tokens [count] (lazy until `publish`).
    proposed: Option<Array>,
    verified: Option<Array>,
    /// The logprobs at each position of the step, when the request wants them.
    logprobs: Vec<PendingLogprobs>,
    stopping: bool,
    continuous: bool,
    generated: u32,
    drafted: u32,
    accepted: u32,
    started: Instant,
    first_token: Option<Instant>,
}

impl Speculative {
    /// A row with a draft model (`draft`: the model and its proposals per step), a fill session
    /// (`fill`), or both. Its caches come from `caches` (a row with a draft starts fresh: the
    /// draft's caches would not follow a cached prefix).
    pub fn plan(
        model: Rc<dyn LanguageModel>,
        draft: Option<(Rc<dyn LanguageModel>, usize)>,
        fill: Option<(FillConfig, FillPlan)>,
        prompt: Vec<u32>,
        opts: GenerateOptions,
        continuous: bool,
        caches: Caches,
    ) -> Plan {
        Plan {
            output_token_limit: f64::from(opts.max_tokens),
            start: Box::new(move || {
                let eos = opts.eos_token_ids.clone().unwrap_or_else(|| model.config().eos_token_ids.clone());
                let last = *prompt.last().ok_or_else(|| Error::InvalidPrompt("the prompt is empty".into()))?;
                let draft = draft.map(|(m, k)| Drafter::new(m, k, &opts, &prompt)).transpose()?;
                let fill = fill
                    .map(|(config, plan)| FillSession::new(&config, plan, &eos, &prompt))
                    .transpose()?;
                let constraint = match &opts.grammar {
                    Some(spec) => Some(Constraint::for_model(&model.config().model_path(), model.config().vocab_size, spec)?),
                    None => None,
                };
                let mut row = Speculative {
                    caches: RowCaches::fresh(model.as_ref(), &opts)?,
                    source: Caches::Fresh,
                    sampler: Sampler::new(opts.sampling.clone(), &prompt)?,
                    model,
                    prompt,
                    prefilled: 0,
                    cached: 0,
                    output: Vec::new(),
                    ended: false,
                    opts,
                    eos,
                    draft,
                    fill,
                    constraint,
                    constrained_logits: None,
                    last,
                    fed: Fed::Nothing,
                    proposed: None,
                    verified: None,
                    logprobs: Vec::new(),
                    stopping: false,
                    continuous,
                    generated: 0,
                    drafted: 0,
                    accepted: 0,
                    started: Instant::now(),
                    first_token: None,
                };
                if row.draft.is_none() {
                    if let Some(held) = caches.open(&row.prompt, &mut row.caches)? {
                        row.prefilled = held;
                        row.cached = held;
                    }
                    row.source = caches;
                }
                Ok(Box::new(row) as Box<dyn MethodRun>)
            }),
        }
    }

    fn done(&mut self, finish_reason: FinishReason) -> Step {
        self.ended = true;
        Step::Done(MethodResult { finish_reason, metrics: self.stats() })
    }

    /// What the next step feeds after the last token: a fill proposal, else the draft's, within
    /// the output the request may still produce. Proposals that could not be rewound (a sliding
    /// window cache that would wrap) are not made: fill then asserts only, the draft proposes
    /// nothing.
    fn proposals(&mut self) -> Result<(Fed, Option<Array>)> {
        let budget = (self.opts.max_tokens - self.generated).saturating_sub(1) as usize;
        if let Some(fill) = &mut self.fill {
            let rewindable = self.caches.rewindable(1 + budget.min(fill.max_span()))?;
            if let Some(p) = fill.propose(budget, (!rewindable).then_some(Policy::Assert)) {
                return Ok((Fed::Fill(p), None));
            }
        }
        let Some(draft) = &mut self.draft else { return Ok((Fed::Draft(0), None)) };
        let k = draft.k.min(budget);
        if k == 0 || !self.caches.rewindable(1 + k)? || !draft.caches.iter().all(|c| c.trimmable_after(k)) {
            return Ok((Fed::Draft(0), None));
        }
        Ok((Fed::Draft(k), Some(draft.propose(k, self.generated)?)))
    }

    /// Reads the step's tokens, publishes the kept ones, and trims the caches to them.
    fn deliver(&mut self, out: &mut Output<'_>) -> Result<Step> {
        let read = |a: Option<Array>| -> Result<Vec<u32>> {
            let a = a.ok_or_else(|| Error::Internal("a verify step lost its tokens".into()))?;
            Ok(a.as_dtype(mlx_rs::Dtype::Uint32)?.as_slice::<u32>().to_vec())
        };
        let verified = read(self.verified.take())?;
        let fed = std::mem::replace(&mut self.fed, Fed::Nothing);
        let (proposed, policy) = match &fed {
            Fed::Draft(0) => (Vec::new(), Policy::Verify),
            Fed::Draft(_) => (read(self.proposed.take())?, Policy::Verify),
            Fed::Fill(p) => (p.ids.clone(), p.policy),
            Fed::Nothing | Fed::Prompt(_) => return Err(Error::Internal("a verify step fed no token".into())),
        };
        let m = proposed.len();
        let n = match policy {
            Policy::Assert => m,
            Policy::Verify => proposed.iter().zip(&verified).take_while(|(d, t)| d == t).count(),
        };
        // No token of its own only where the grammar ended at a kept proposal.
        let own = verified.get(n).copied();
        match (fed, &mut self.fill) {
            (Fed::Fill(p), Some(fill)) => {
                fill.commit(p, n, &verified);
                if let (Some(d), Some(own)) = (&mut self.draft, own) {
                    d.input.extend_from_slice(&proposed[..n]);
                    d.input.push(own);
                }
            }
            (Fed::Draft(k), fill) => {
                // Kept draft tokens are the model's own: they enter the fill session as sampled.
                if let Some(fill) = fill {
                    proposed[..n].iter().for_each(|&id| fill.observe(id));
                }
                self.drafted += k as u32;
                self.accepted += n as u32;
                if let (Some(d), Some(own)) = (&mut self.draft, own) {
                    // It forwarded what it lacked and its first k - 1 proposals.
                    if k == 0 {
                        d.input.push(own);
                    } else if n < k {
                        for c in &mut d.caches {
                            c.trim(k - 1 - n);
                        }
                        d.input = vec![own];
                    } else {
                        d.input = vec![proposed[k - 1], own];
                    }
                }
            }
            _ => {}
        }
        if let (Some(fill), Some(own)) = (&mut self.fill, own) {
            fill.observe(own);
        }
        if self.first_token.is_none() {
            self.first_token = Some(Instant::now());
        }
        // The model forwarded its last token and m proposals: it keeps n of them.
        self.caches.trim(m - n)?;
        self.last = own.or(proposed[..n].last().copied()).unwrap_or(self.last);
        // A kept token is the one sampled at its position (fill's asserted spans, which are not,
        // are never placed with logprobs), so that position's logprobs are its own.
        let logprobs = std::mem::take(&mut self.logprobs);
        for (j, &id) in proposed[..n].iter().chain(own.as_ref()).enumerate() {
            self.output.push(id);
            if self.eos.contains(&id) {
                return Ok(self.done(FinishReason::Stop));
            }
            let lp = logprobs.get(j).map(PendingLogprobs::read).transpose()?;
            out.commit(&[id], lp.as_ref().map(std::slice::from_ref))?;
            self.generated += 1;
            self.sampler.push(&Array::from_slice(&[id], &[1]))?;
            if self.generated >= self.opts.max_tokens {
                return Ok(self.done(FinishReason::Length));
            }
        }
        if self.constraint.as_ref().is_some_and(Constraint::finished) {
            return Ok(self.done(FinishReason::Stop));
        }
        Ok(Step::Continue)
    }

    /// A grammar row's positions, sampled in order under the grammar: position i's mask follows
    /// the proposals before it, each kept proposal is consumed, and sampling stops at the first
    /// position that disagrees (its token is the row's own), at a stop token, or where the
    /// grammar has ended. The first mask is computed while the step's forward runs.
    fn sample_constrained(&mut self, logits: Array) -> Result<()> {
        let Some(c) = self.constraint.as_mut() else { return Ok(()) };
        let mut allowed = (!c.finished()).then(|| c.mask(&self.eos)).transpose()?;
        let proposed: Vec<u32> = match (&self.fed, &self.proposed) {
            (Fed::Fill(p), _) => p.ids.clone(),
            (Fed::Draft(k), Some(drafts)) if *k > 0 => drafts.as_dtype(mlx_rs::Dtype::Uint32)?.as_slice::<u32>().to_vec(),
            _ => Vec::new(),
        };
        let mut sampler = self.sampler.clone();
        let mut kept = Vec::with_capacity(proposed.len() + 1);
        for i in 0..=proposed.len() {
            let Some(mask) = allowed.take() else { break };
            let masked = grammar::apply(&logits.index(i as i32..i as i32 + 1), &mask)?;
            let (t, logprobs) = sampler.sample(&masked, u64::from(self.generated) + i as u64)?;
            let t = t.reshape(&[1])?;
            if self.opts.wants_logprobs() {
                self.logprobs.push(PendingLogprobs::new(&logprobs, &t, self.opts.top_logprobs)?);
            }
            let id = t.as_dtype(mlx_rs::Dtype::Uint32)?.as_slice::<u32>()[0];
            kept.push(id);
            if self.eos.contains(&id) {
                break;
            }
            c.consume(id)?;
            if proposed.get(i) != Some(&id) {
                break;
            }
            sampler.push(&t)?;
            allowed = (!c.finished()).then(|| c.mask(&self.eos)).transpose()?;
        }
        self.verified = Some(Array::from_slice(&kept, &[kept.len() as i32]));
        Ok(())
    }

    pub fn stats(&self) -> GenerateStats {
        let positions = self.caches.positions() as u32;
        GenerateStats {
            cached_tokens: self.cached as u32,
            draft_tokens: self.drafted,
            accepted_draft_tokens: self.accepted,
            fill: self.fill.as_ref().map(|f| f.stats.clone()),
            ..GenerateStats::measured(self.started, self.first_token, self.prompt.len() as u32, self.generated, positions)
        }
    }
}

impl Drop for Speculative {
    fn drop(&mut self) {
        std::mem::replace(&mut self.source, Caches::Fresh).abandon();
    }
}

impl Row for Speculative {
    fn model(&self) -> &Rc<dyn LanguageModel> {
        &self.model
    }

    fn caches(&mut self) -> &mut RowCaches {
        &mut self.caches
    }

    fn batchable(&self) -> bool {
        self.continuous
    }

    fn stackable(&self) -> bool {
        false
    }

    fn prompt_left(&self) -> usize {
        (self.prompt.len() - 1).saturating_sub(self.prefilled)
    }

    fn chunk_limit(&self) -> usize {
        self.opts.prefill_chunk_size as usize
    }

    /// A row with a draft prefills its own prompt: the draft's caches would not follow another
    /// row's prefix.
    fn shared_prompt(&self) -> Option<(&[u32], usize)> {
        (self.draft.is_none() && matches!(self.source, Caches::Prefix(_))).then_some((&self.prompt, self.prefilled))
    }

    fn adopt_prefix(&mut self, caches: Vec<LayerCache>, n: usize) {
        self.caches.replace(caches);
        self.prefilled = n;
        self.cached = n;
    }

    fn propose(&mut self, out: &Output<'_>, max: usize) -> Result<Option<Feed>> {
        self.fed = Fed::Nothing;
        if out.stopped() {
            self.stopping = true;
            return Ok(None);
        }
        let left = self.prompt_left();
        if left > 0 {
            // With a draft, both models prefill the same chunk: the draft's part joins the graph.
            let n = left.min(max.max(1));
            let chunk = &self.prompt[self.prefilled..self.prefilled + n];
            let tokens = Array::from_slice(chunk, &[1, n as i32]);
            if let Some(d) = &mut self.draft {
                d.forward(tokens.clone(), Logits::None)?;
            }
            self.fed = Fed::Prompt(n);
            return Ok(Some(Feed { tokens, count: n, logits: Logits::None }));
        }
        let (fed, drafts) = self.proposals()?;
        let last = Array::from_slice(&[self.last], &[1, 1]);
        let (tokens, count) = match (&fed, drafts) {
            (Fed::Fill(p), _) => {
                let mut ids = vec![self.last];
                ids.extend(&p.ids);
                (Array::from_slice(&ids, &[1, ids.len() as i32]), ids.len())
            }
            (&Fed::Draft(k), Some(drafts)) => {
                let tokens = ops::concatenate(&[last, drafts.reshape(&[1, -1])?], 1)?;
                self.proposed = Some(drafts);
                (tokens, k + 1)
            }
            _ => (last, 1),
        };
        self.fed = fed;
        Ok(Some(Feed { tokens, count, logits: Logits::All }))
    }

    fn accept(&mut self, logits: Option<Array>) -> Result<Vec<Array>> {
        let count = match &self.fed {
            Fed::Prompt(n) => {
                self.prefilled += n;
                let draft = self.draft.as_ref().map(|d| d.caches.iter().flat_map(|c| c.state()).cloned().collect());
                return Ok(draft.unwrap_or_default());
            }
            Fed::Nothing => return Ok(Vec::new()),
            Fed::Draft(k) => k + 1,
            Fed::Fill(p) => p.ids.len() + 1,
        };
        let logits = logits.ok_or_else(|| Error::Internal("a verify step returned no logits".into()))?;
        let logits = logits.reshape(&[count as i32, -1])?;
        if self.constraint.is_some() {
            // Its positions sample once their masks are known (`overlap`); the forward starts now.
            self.constrained_logits = Some(logits.clone());
            let mut arrays = vec![logits];
            arrays.extend(self.proposed.clone());
            return Ok(arrays);
        }
        // Position i samples as plain decoding would after the first i proposals: with their
        // key index, and with them in the penalties' history.
        let mut sampler = self.sampler.clone();
        let mut tokens = Vec::with_capacity(count);
        for i in 0..count {
            if i > 0 {
                let proposal = match (&self.fed, &self.proposed) {
                    (Fed::Fill(p), _) => Array::from_slice(&p.ids[i - 1..i], &[1]),
                    (_, Some(drafts)) => drafts.index(i as i32 - 1..i as i32),
                    _ => return Err(Error::Internal("a verify step lost its proposals".into())),
                };
                sampler.push(&proposal)?;
            }
            let (t, logprobs) = sampler.sample(&logits.index(i as i32..i as i32 + 1), u64::from(self.generated) + i as u64)?;
            let t = t.reshape(&[1])?;
            if self.opts.wants_logprobs() {
                self.logprobs.push(PendingLogprobs::new(&logprobs, &t, self.opts.top_logprobs)?);
            }
            tokens.push(t);
        }
        let verified = ops::concatenate(&tokens, 0)?;
        let mut arrays = vec![verified.clone()];
        arrays.extend(self.proposed.clone());
        arrays.extend(self.logprobs.iter().flat_map(|l| l.arrays()).cloned());
        self.verified = Some(verified);
        Ok(arrays)
    }

    fn overlap(&mut self) -> Result<()> {
        match self.constrained_logits.take() {
            Some(logits) => self.sample_constrained(logits),
            None => Ok(()),
        }
    }

    fn publish(&mut self, out: &mut Output<'_>) -> Result<Step> {
        if self.stopping {
            return Ok(self.done(FinishReason::Stop));
        }
        match self.fed {
            Fed::Prompt(_) => {
                out.progress(self.prefilled as f64, Some(self.prompt.len() as f64))?;
                Ok(Step::Continue)
            }
            Fed::Draft(_) | Fed::Fill(_) => self.deliver(out),
            Fed::Nothing => Ok(Step::Continue),
        }
    }
}

impl MethodRun for Speculative {
    fn step(&mut self, out: &mut Output<'_>) -> Result<Step> {
        rows::step_alone(self, out)
    }

    fn metrics(&self) -> GenerateStats {
        self.stats()
    }

    fn close(mut self: Box<Self>) -> Result<()> {
        let source = std::mem::replace(&mut self.source, Caches::Fresh);
        source.close(&mut self.caches, self.prompt.iter().chain(&self.output).copied(), self.ended)
    }

    fn row(&mut self) -> Option<&mut dyn Row> {
        Some(self)
    }

    fn row_ref(&self) -> Option<&dyn Row> {
        Some(self)
    }
}
