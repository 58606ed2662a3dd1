//! Rows and steps. A request that steps a model is a row: each step it proposes what it feeds
//! (n prompt tokens to prefill, one token to decode, and so on) and which logits it needs back;
//! one step executor forwards every row of a model in one graph and hands each row its logits.
//! Methods know nothing of batching, and the executor nothing of methods (`method::Row`).
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::async_eval;
use mlx_rs::{ops, Array};

use super::method::{Row, Step};
use super::session::Output;
use crate::cache::{BatchKvCache, CacheView, KvPolicy, LayerCache};
use crate::error::{Error, Result};
use crate::mlx::{backend, gate};
use crate::model::{LanguageModel, Logits, StepContext, Tokens};
use crate::sample::GenerateOptions;

static NEXT_ROW: AtomicU64 = AtomicU64::new(1);

/// What a row feeds one step.
pub struct Feed {
    /// Its new tokens, [1, n] (lazy: a token sampled by the step before may not be read yet).
    pub tokens: Array,
    pub count: usize,
    pub logits: Logits,
}

/// A row's layer caches: its own, or its row of a stacked batch cache (its own are then empty)
/// since it last stepped in a batch.
pub struct RowCaches {
    id: u64,
    own: Vec<LayerCache>,
    stack: Option<Rc<RefCell<BatchKvCache>>>,
    /// The request's KV quantization: its caches are converted after the step that makes them
    /// due, and, quantized or not, never stacked (the stacked cache holds plain keys).
    kv: Option<KvPolicy>,
    /// Positions held when its prompt's prefill began, where its own prefill chunks start.
    prefill_from: Option<usize>,
}

impl RowCaches {
    pub fn new(own: Vec<LayerCache>, kv: Option<KvPolicy>) -> Self {
        RowCaches { id: NEXT_ROW.fetch_add(1, Ordering::Relaxed), own, stack: None, kv, prefill_from: None }
    }

    /// A model's fresh caches for a request with these options.
    pub fn fresh(model: &dyn LanguageModel, opts: &GenerateOptions) -> Result<Self> {
        let own = model.new_cache();
        let kv = opts.kv.policy(own.len(), model.config().head_dim)?;
        Ok(RowCaches::new(own, kv))
    }

    fn stackable(&self) -> bool {
        self.kv.is_none()
    }

    /// After a step that fed it `count` tokens: quantizes the layers that are due. mlx-lm
    /// converts caches after each of its model calls: every prefill chunk of `chunk` prompt
    /// tokens, the prompt's last, and every decode step. A batch's budget may split a chunk; the
    /// caches are then converted only where the request's own chunk would have ended, so that a
    /// row's numbers do not depend on the rows beside it.
    fn quantize_after(&mut self, count: usize, prefill: bool, prompt_done: bool, chunk: usize) -> Result<()> {
        let Some(policy) = &self.kv else { return Ok(()) };
        let held = self.own.first().map_or(0, LayerCache::offset);
        let from = *self.prefill_from.get_or_insert(held.saturating_sub(count));
        if !prefill || prompt_done || (held - from) % chunk.max(1) == 0 {
            policy.quantize_due(&mut self.own)?;
        }
        Ok(())
    }

    /// Its own caches, taken back from a stack first.
    fn own(&mut self) -> Result<&mut Vec<LayerCache>> {
        if let Some(stack) = self.stack.take() {
            self.own = stack.borrow_mut().take(self.id)?;
        }
        Ok(&mut self.own)
    }

    /// Positions held.
    pub fn positions(&self) -> usize {
        match &self.stack {
            Some(s) => s.try_borrow().ok().and_then(|s| s.len_of(self.id)).unwrap_or(0),
            None => self.own.first().map_or(0, LayerCache::offset),
        }
    }

    /// Caches holding the first `n` positions: a snapshot of its own (cheap: the arrays are
    /// shared until either side writes) with the rest trimmed, or a copy of its stacked row;
    /// `None` when the rest cannot be trimmed (a rotating cache that has wrapped).
    pub fn prefix(&self, n: usize) -> Result<Option<Vec<LayerCache>>> {
        if let Some(stack) = &self.stack {
            return stack.borrow_mut().row_prefix(self.id, n);
        }
        let held = self.positions();
        if held < n || (held > n && !self.own.iter().all(LayerCache::is_trimmable)) {
            return Ok(None);
        }
        let mut caches = self.own.clone();
        for c in &mut caches {
            c.trim(held - n);
        }
        Ok(Some(caches))
    }

    /// Drops its last `n` positions (tokens a step forwarded that the row did not keep).
    pub fn trim(&mut self, n: usize) -> Result<()> {
        for c in self.own()? {
            if c.trim(n) != n {
                return Err(Error::Internal(format!("a cache could not forget its last {n} positions")));
            }
        }
        Ok(())
    }

    /// Whether a step of `n` more positions could be trimmed back afterwards.
    pub fn rewindable(&mut self, n: usize) -> Result<bool> {
        Ok(self.own()?.iter().all(|c| c.trimmable_after(n)))
    }

    /// Replaces the layers (a row that starts from another's prefix).
    pub fn replace(&mut self, layers: Vec<LayerCache>) {
        if let Some(stack) = self.stack.take() {
            stack.borrow_mut().forget(self.id);
        }
        self.own = layers;
    }

    /// Every layer, copied out of a stack if stacked: the row has ended and its caches go on.
    pub fn take(&mut self) -> Result<Vec<LayerCache>> {
        match self.stack.take() {
            Some(stack) => stack.borrow_mut().take_ended(self.id),
            None => Ok(std::mem::take(&mut self.own)),
        }
    }
}

impl Drop for RowCaches {
    fn drop(&mut self) {
        if let Some(Ok(mut stack)) = self.stack.as_ref().map(|s| s.try_borrow_mut()) {
            stack.forget(self.id);
        }
    }
}

/// One step of `rows` (all of one model), with at most `max` tokens fed by any row: each row's
/// feed is forwarded in one graph (a prefill, which wants no logits, layer by layer, ending
/// early once no row's consumer wants it; a decode step lazily, queued before the tokens of the
/// step before are read), then each row takes its logits and publishes. A row whose output was
/// stopped ends instead. Returns each row's result, in order.
pub fn step(rows: &mut [(&mut dyn Row, &mut Output<'_>)], max: usize) -> Vec<Result<Step>> {
    let mut results: Vec<Option<Result<Step>>> = rows.iter().map(|_| None).collect();
    let mut feeds = Vec::with_capacity(rows.len());
    for ((row, out), result) in rows.iter_mut().zip(&mut results) {
        feeds.push(match row.propose(out, max) {
            Ok(feed) => feed,
            Err(e) => {
                *result = Some(Err(e));
                None
            }
        });
    }
    let logits = match forward(rows, &feeds) {
        Ok(l) => l,
        Err(e) => return rows.iter().map(|_| Err(e.replicate())).collect(),
    };
    let mut queued = Vec::new();
    for (((row, _), logits), result) in rows.iter_mut().zip(logits).zip(&mut results) {
        if result.is_none() {
            match row.accept(logits) {
                Ok(arrays) => queued.extend(arrays),
                Err(e) => *result = Some(Err(e)),
            }
        }
    }
    if let Err(e) = async_eval(&queued).map_err(Error::from) {
        return rows.iter().map(|_| Err(e.replicate())).collect();
    }
    for ((row, _), result) in rows.iter_mut().zip(&mut results) {
        if result.is_none() {
            if let Err(e) = row.overlap() {
                *result = Some(Err(e));
            }
        }
    }
    rows.iter_mut().zip(results).map(|((row, out), result)| result.unwrap_or_else(|| row.publish(out))).collect()
}

/// One step of `row` alone, feeding at most its own prefill chunk.
pub fn step_alone(row: &mut dyn Row, out: &mut Output<'_>) -> Result<Step> {
    let max = row.chunk_limit();
    let mut results = step(&mut [(row, out)], max);
    results.pop().unwrap_or_else(|| Err(Error::Internal("a step of one row returned no result".into())))
}

/// The forward of every feed, in one graph; each fed row's logits as it asked (the last column
/// [1, V], or every column of its feed [n, V]).
fn forward(rows: &mut [(&mut dyn Row, &mut Output<'_>)], feeds: &[Option<Feed>]) -> Result<Vec<Option<Array>>> {
    let fed: Vec<usize> = (0..rows.len()).filter(|&i| feeds[i].is_some()).collect();
    let mut logits: Vec<Option<Array>> = rows.iter().map(|_| None).collect();
    let Some(&first) = fed.first() else { return Ok(logits) };
    let model = rows[first].0.model().clone();
    let chosen: Vec<&Feed> = fed.iter().map(|&i| feeds[i].as_ref().expect("fed")).collect();
    let want = chosen.iter().map(|f| f.logits).max_by_key(|l| match l {
        Logits::None => 0,
        Logits::Last | Logits::LastHidden => 1,
        Logits::All => 2,
    });
    let want = want.expect("one row at least");
    let tokens = batch_tokens(&chosen)?;
    let (mut picked, outs): (Vec<_>, Vec<_>) =
        rows.iter_mut().enumerate().filter(|(i, _)| feeds[*i].is_some()).map(|(_, (r, o))| (&mut **r, &**o)).unzip();
    // A prefill ends early only when no row wants it any more.
    let check = || {
        between_parts()?;
        if outs.iter().any(|o| o.check_cancelled().is_ok()) {
            Ok(())
        } else {
            outs[0].check_cancelled()
        }
    };
    let ctx = StepContext { logits: want, check: (want == Logits::None).then_some(&check as &dyn Fn() -> Result<()>) };
    let stackable = picked.iter_mut().all(|r| r.stackable() && r.caches().stackable());
    let out = if want != Logits::None && picked.len() > 1 && model.stackable() && stackable {
        let stack = stack(&mut picked)?;
        let mut stack = stack.borrow_mut();
        model.forward(&tokens, CacheView::Stacked(&mut stack), &ctx)?
    } else {
        let mut own: Vec<&mut [LayerCache]> = Vec::with_capacity(picked.len());
        for r in picked.iter_mut() {
            own.push(r.caches().own()?.as_mut_slice());
        }
        model.forward(&tokens, CacheView::Rows(&mut own), &ctx)?
    };
    for (r, feed) in picked.iter_mut().zip(&chosen) {
        let (prefill, left, chunk) = (feed.logits == Logits::None, r.prompt_left(), r.chunk_limit());
        r.caches().quantize_after(feed.count, prefill, feed.count >= left, chunk)?;
    }
    let Some(out) = out else {
        mlx_rs::memory::clear_cache()?;
        return Ok(logits);
    };
    let columns = tokens.ids.shape()[1];
    for (k, (&i, feed)) in fed.iter().zip(&chosen).enumerate() {
        let row = out.index(k as i32);
        logits[i] = Some(match (feed.logits, want) {
            (Logits::None, _) => continue,
            (Logits::All, _) => row.index(columns - feed.count as i32..columns),
            // A last column: the whole output when every row asked for one.
            (mine, all) if mine == all => row.reshape(&[1, -1])?,
            _ => row.index(columns - 1..columns),
        });
    }
    Ok(logits)
}

/// The feeds as one input: each row's tokens right-aligned, left padded to the longest.
fn batch_tokens(feeds: &[&Feed]) -> Result<Tokens> {
    let longest = feeds.iter().map(|f| f.count).max().unwrap_or(0) as i32;
    let rows = feeds
        .iter()
        .map(|f| {
            let pad = longest - f.count as i32;
            Ok(if pad == 0 { f.tokens.clone() } else { ops::concatenate(&[ops::zeros_dtype(&[1, pad], f.tokens.dtype())?, f.tokens.clone()], 1)? })
        })
        .collect::<Result<Vec<_>>>()?;
    let ids = if rows.len() == 1 { rows.into_iter().next().expect("one") } else { ops::concatenate(&rows, 0)? };
    Ok(Tokens { ids, counts: feeds.iter().map(|f| f.count as i32).collect() })
}

/// The stacked cache for these rows (the one the first of them is in, or a new one), arranged
/// in their order. A row in another stack leaves it first.
fn stack(rows: &mut [&mut (dyn Row + '_)]) -> Result<Rc<RefCell<BatchKvCache>>> {
    let stack: Rc<RefCell<BatchKvCache>> = rows.iter_mut().find_map(|r| r.caches().stack.clone()).unwrap_or_default();
    let mut order = Vec::with_capacity(rows.len());
    for r in rows.iter_mut() {
        let c = r.caches();
        if c.stack.as_ref().is_some_and(|s| !Rc::ptr_eq(s, &stack)) {
            c.own()?;
        }
        let own = c.stack.is_none().then(|| std::mem::take(&mut c.own));
        c.stack = Some(stack.clone());
        order.push((c.id, own));
    }
    stack.borrow_mut().arrange(order)?;
    Ok(stack)
}

/// Between the parts of a long step, with nothing of the step running in MLX: lets a pending
/// fork go ahead, and ends the step with `EngineClosed` once the process exits (`mlx::gate`).
pub(super) fn between_parts() -> Result<()> {
    gate::pause_point(backend::synchronize);
    if gate::is_closed() {
        Err(Error::EngineClosed)
    } else {
        Ok(())
    }
}
