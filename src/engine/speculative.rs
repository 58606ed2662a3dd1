//! Speculative decoding with a draft model, as mlx-lm's `speculative_generate_step`: each step the
//! draft proposes k tokens (k forwards of the small model, chained lazily in one graph), the
//! target forwards its last token and the k proposals at once, samples a token after each of
//! them with the request's sampler, and keeps the proposals up to the first one it disagrees
//! with, plus its own token there. Greedy output is the target's greedy output; sampled output
//! draws each position with the key of its index, as a plain generation does.
//!
//! Both models' caches are trimmed back to the kept tokens after each step, so the row keeps its
//! own caches (`Row::stackable` is false): in a batch its step shares the graph with the other
//! rows, which then attend row by row.
use std::rc::Rc;
use std::time::Instant;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};

use super::events::{FinishReason, GenerateStats};
use super::method::{MethodRun, Plan, Row, Step};
use super::rows::{self, Feed, RowCaches};
use super::session::{MethodResult, Output};
use crate::cache::{CacheView, LayerCache};
use crate::error::{Error, Result};
use crate::model::{LanguageModel, Logits, StepContext, Tokens};
use crate::sample::{GenerateOptions, Sampler};

/// mlx-lm's `generate --num-draft-tokens` default.
pub const DEFAULT_DRAFT_TOKENS: usize = 3;
/// The most proposals per step: each is a draft forward chained into one graph.
pub const MAX_DRAFT_TOKENS: usize = 64;

/// The draft samples with its own key stream, so its draws never repeat the target's.
const DRAFT_SEED: u64 = 0x5be0_cd19_137e_2179;

enum Fed {
    Nothing,
    Prompt(usize),
    /// The target's last token and `k` proposals.
    Verify { k: usize },
}

pub struct Speculative {
    model: Rc<dyn LanguageModel>,
    draft: Rc<dyn LanguageModel>,
    caches: RowCaches,
    draft_caches: Vec<LayerCache>,
    prompt: Vec<u32>,
    prefilled: usize,
    opts: GenerateOptions,
    eos: Vec<u32>,
    sampler: Sampler,
    draft_sampler: Sampler,
    k: usize,
    /// The last token kept, which the target forwards next.
    last: u32,
    /// Tokens the draft's caches lack, which it forwards before proposing.
    draft_input: Vec<u32>,
    fed: Fed,
    /// The step's proposals [k] and the target's tokens [k + 1] (lazy until `publish`).
    proposed: Option<Array>,
    verified: Option<Array>,
    stopping: bool,
    continuous: bool,
    generated: u32,
    drafted: u32,
    accepted: u32,
    started: Instant,
    first_token: Option<Instant>,
}

impl Speculative {
    pub fn plan(model: Rc<dyn LanguageModel>, draft: Rc<dyn LanguageModel>, prompt: Vec<u32>, opts: GenerateOptions, k: usize, continuous: bool) -> Plan {
        Plan {
            output_token_limit: f64::from(opts.max_tokens),
            start: Box::new(move || {
                let eos = opts.eos_token_ids.clone().unwrap_or_else(|| model.config().eos_token_ids.clone());
                let sampler = Sampler::new(opts.sampling.clone(), &prompt)?;
                let mut draft_opts = opts.sampling.clone();
                draft_opts.seed ^= DRAFT_SEED;
                let draft_sampler = Sampler::new(draft_opts, &prompt)?;
                let last = *prompt.last().ok_or_else(|| Error::InvalidPrompt("the prompt is empty".into()))?;
                Ok(Box::new(Speculative {
                    caches: RowCaches::new(model.new_cache()),
                    draft_caches: draft.new_cache(),
                    model,
                    draft,
                    prompt,
                    prefilled: 0,
                    opts,
                    eos,
                    sampler,
                    draft_sampler,
                    k,
                    last,
                    draft_input: vec![last],
                    fed: Fed::Nothing,
                    proposed: None,
                    verified: None,
                    stopping: false,
                    continuous,
                    generated: 0,
                    drafted: 0,
                    accepted: 0,
                    started: Instant::now(),
                    first_token: None,
                }) as Box<dyn MethodRun>)
            }),
        }
    }

    /// The draft's forward of `tokens` [1, n] over its caches; its last logits if `logits`.
    fn draft_forward(&mut self, tokens: Array, logits: Logits) -> Result<Option<Array>> {
        let mut layers: Vec<&mut [LayerCache]> = vec![self.draft_caches.as_mut_slice()];
        let ctx = StepContext { logits, check: None };
        self.draft.forward(&Tokens::uniform(tokens), CacheView::Rows(&mut layers), &ctx)
    }

    /// `k` proposals [k] (lazy): the draft forwards what it lacks, then each token it samples.
    fn propose_drafts(&mut self, k: usize) -> Result<Array> {
        let first = std::mem::take(&mut self.draft_input);
        let mut input = Array::from_slice(&first, &[1, first.len() as i32]);
        let mut drafts = Vec::with_capacity(k);
        for i in 0..k {
            let logits = self.draft_forward(input, Logits::Last)?.ok_or_else(|| Error::Internal("a draft step returned no logits".into()))?;
            let (token, _) = self.draft_sampler.sample(&logits.reshape(&[1, -1])?, u64::from(self.generated) + i as u64)?;
            let token = token.reshape(&[1, 1])?;
            input = token.clone();
            drafts.push(token);
        }
        Ok(ops::concatenate(&drafts, 1)?.reshape(&[-1])?)
    }

    fn done(&mut self, finish_reason: FinishReason) -> Step {
        Step::Done(MethodResult { finish_reason, metrics: self.stats() })
    }

    /// Reads the step's tokens, publishes the kept ones, and trims both caches to them.
    fn deliver(&mut self, out: &mut Output<'_>, k: usize) -> Result<Step> {
        let read = |a: Option<Array>| -> Result<Vec<u32>> {
            let a = a.ok_or_else(|| Error::Internal("a verify step lost its tokens".into()))?;
            Ok(a.as_dtype(mlx_rs::Dtype::Uint32)?.as_slice::<u32>().to_vec())
        };
        let verified = read(self.verified.take())?;
        let proposed = if k > 0 { read(self.proposed.take())? } else { Vec::new() };
        let n = proposed.iter().zip(&verified).take_while(|(d, t)| d == t).count();
        self.drafted += k as u32;
        self.accepted += n as u32;
        if self.first_token.is_none() {
            self.first_token = Some(Instant::now());
        }
        for &id in &verified[..=n] {
            if self.eos.contains(&id) {
                return Ok(self.done(FinishReason::Stop));
            }
            out.commit(&[id], None)?;
            self.generated += 1;
            self.sampler.push(&Array::from_slice(&[id], &[1]))?;
            if self.generated >= self.opts.max_tokens {
                return Ok(self.done(FinishReason::Length));
            }
        }
        // The target forwarded its last token and k proposals: it keeps n of them. The draft
        // forwarded what it lacked and its first k - 1 proposals.
        self.caches.trim(k - n)?;
        if k == 0 {
            // Nothing was proposed: the draft still lacks what it lacked, and the new token.
            self.draft_input.push(verified[0]);
        } else if n < k {
            for c in &mut self.draft_caches {
                c.trim(k - 1 - n);
            }
            self.draft_input = vec![verified[n]];
        } else {
            self.draft_input = vec![proposed[k - 1], verified[k]];
        }
        self.last = verified[n];
        Ok(Step::Continue)
    }

    pub fn stats(&self) -> GenerateStats {
        let positions = self.caches.positions() as u32;
        GenerateStats {
            draft_tokens: self.drafted,
            accepted_draft_tokens: self.accepted,
            ..GenerateStats::measured(self.started, self.first_token, self.prompt.len() as u32, self.generated, positions)
        }
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

    /// Its draft's caches would not follow another row's prefix: it prefills its own.
    fn shared_prompt(&self) -> Option<(&[u32], usize)> {
        None
    }

    fn adopt_prefix(&mut self, _caches: Vec<LayerCache>, _n: usize) {
        unreachable!("a speculative row shares no prompt")
    }

    fn propose(&mut self, out: &Output<'_>, max: usize) -> Result<Option<Feed>> {
        self.fed = Fed::Nothing;
        if out.stopped() {
            self.stopping = true;
            return Ok(None);
        }
        let left = self.prompt_left();
        if left > 0 {
            // Both models prefill the same chunk: the draft's part joins the target's graph.
            let n = left.min(max.max(1));
            let chunk = &self.prompt[self.prefilled..self.prefilled + n];
            let tokens = Array::from_slice(chunk, &[1, n as i32]);
            self.draft_forward(tokens.clone(), Logits::None)?;
            self.fed = Fed::Prompt(n);
            return Ok(Some(Feed { tokens, count: n, logits: Logits::None }));
        }
        // Never propose past the last token allowed.
        let room = (self.opts.max_tokens - self.generated) as usize;
        let k = self.k.min(room.saturating_sub(1));
        let last = Array::from_slice(&[self.last], &[1, 1]);
        let tokens = if k > 0 {
            let proposed = self.propose_drafts(k)?;
            let tokens = ops::concatenate(&[last, proposed.reshape(&[1, -1])?], 1)?;
            self.proposed = Some(proposed);
            tokens
        } else {
            last
        };
        self.fed = Fed::Verify { k };
        Ok(Some(Feed { tokens, count: k + 1, logits: Logits::All }))
    }

    fn accept(&mut self, logits: Option<Array>) -> Result<Vec<Array>> {
        match (&self.fed, logits) {
            (&Fed::Prompt(n), _) => {
                self.prefilled += n;
                Ok(self.draft_caches.iter().flat_map(|c| c.state()).cloned().collect())
            }
            (&Fed::Verify { k }, Some(logits)) => {
                let logits = logits.reshape(&[(k + 1) as i32, -1])?;
                let tokens = (0..=k)
                    .map(|i| {
                        let (t, _) = self.sampler.sample(&logits.index(i as i32..i as i32 + 1), u64::from(self.generated) + i as u64)?;
                        Ok(t.reshape(&[1])?)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let verified = ops::concatenate(&tokens, 0)?;
                let mut arrays = vec![verified.clone()];
                arrays.extend(self.proposed.clone());
                self.verified = Some(verified);
                Ok(arrays)
            }
            (Fed::Verify { .. }, None) => Err(Error::Internal("a verify step returned no logits".into())),
            (Fed::Nothing, _) => Ok(Vec::new()),
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
            Fed::Verify { k } => self.deliver(out, k),
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

    fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }

    fn row(&mut self) -> Option<&mut dyn Row> {
        Some(self)
    }

    fn row_ref(&self) -> Option<&dyn Row> {
        Some(self)
    }
}
