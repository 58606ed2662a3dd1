//! The sessions of one engine as the scheduler sees them ([`ExecutionGroup`]), and the mechanism
//! behind each unit the policy picks: admission takes a lease, preparation creates runs and
//! prefills prompts (rows of one model in one batched forward), a decode unit steps every
//! running row (rows of one model in one batched forward), tasks run the thread's non-row work.
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::driver::{model_key, Driver, Phase};
use super::admission::Admission;
use super::method::Row;
use super::rows;
use super::resources::Release;
use super::scheduler::{ExecutionGroup, MixedPreparation};
use super::session::{CancelReason, Output};
use super::models::{when_loaded, ModelId, Models};
use super::tasks::ExecutionTasks;
use super::caller_cache::CallerCaches;
use super::memory::{MemoryBudget, Verdict};
use crate::cache::PrefixCache;
use crate::error::{Error, Result};

/// The shortest common prompt prefix that rows preparing together prefill once: shorter ones
/// (a chat template's first tokens) are not worth a snapshot. A default system prompt is: eight
/// chat clients arriving together on SmolLM2 (its 28-token default system prompt in ~45-token
/// prompts) got their first token after 1.15-1.38 s sharing it, 1.95-2.33 s not.
const MIN_SHARED_PREFIX: usize = 16;

/// Prompt tokens `b` can take from `a`'s caches: their common prefix, leaving each row at least
/// its last prompt token to forward.
fn shared_prefix(a: &dyn Row, b: &dyn Row) -> usize {
    let (Some((pa, _)), Some((pb, _))) = (a.shared_prompt(), b.shared_prompt()) else { return 0 };
    if model_key(a) != model_key(b) {
        return 0;
    }
    let common = pa.iter().zip(pb).take_while(|(x, y)| x == y).count();
    common.min(pa.len() - 1).min(pb.len() - 1)
}

/// How much of its shared prompt a row's caches hold.
fn prefilled(row: &dyn Row) -> usize {
    row.shared_prompt().map_or(0, |(_, n)| n)
}

/// How long a batch waits for rows of its last step whose consumers have not yet taken their
/// tokens, so that the batch steps whole instead of in fragments. A row that misses a step is
/// not waited for again until it has stepped with the batch once more.
const CONSUMER_HOLD: Duration = Duration::from_millis(10);

static BATCHED_STEPS: AtomicU64 = AtomicU64::new(0);
static BATCHED_ROWS: AtomicU64 = AtomicU64::new(0);
static BATCHED_PREFILLS: AtomicU64 = AtomicU64::new(0);
static PREFILL_ROWS: AtomicU64 = AtomicU64::new(0);

/// Units that advanced several sessions in one graph since the process started (for tests and
/// benchmarks).
#[derive(Debug, Clone, Copy)]
pub struct BatchCounts {
    pub decode_steps: u64,
    pub decode_rows: u64,
    pub prefill_steps: u64,
    pub prefill_rows: u64,
}

pub fn batch_counts() -> BatchCounts {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    BatchCounts {
        decode_steps: get(&BATCHED_STEPS),
        decode_rows: get(&BATCHED_ROWS),
        prefill_steps: get(&BATCHED_PREFILLS),
        prefill_rows: get(&PREFILL_ROWS),
    }
}

pub struct Group {
    /// `None`: the thread's own group, which only runs tasks.
    pub engine: Option<Arc<Admission>>,
    models: Models,
    /// In the order they were opened: admission is FIFO.
    pub drivers: Vec<Driver>,
    pub tasks: ExecutionTasks,
    /// Whether the last tick ran anything (the thread sleeps when no group did).
    pub worked: bool,
    /// Batched decode steps so far (see `Driver::batched_at`).
    batch_seq: u64,
    /// Until when batches wait for their rows' consumers (see CONSUMER_HOLD).
    hold_until: Option<Instant>,
    /// Caches of this engine's finished generations, for later prompts that start the same way.
    pub prefix: Rc<RefCell<PrefixCache>>,
    /// The layers of caller-owned caches (`model.makeCache()`).
    caller_caches: CallerCaches,
    /// The engine's memory budget over its model, once a session has needed it.
    memory: Option<MemoryBudget>,
}

impl Group {
    /// `prefix`: the engine's prefix cache (one that is never enabled for the thread's group).
    pub fn new(engine: Option<Arc<Admission>>, models: Models, prefix: Rc<RefCell<PrefixCache>>, caller_caches: CallerCaches) -> Self {
        Group {
            prefix,
            caller_caches,
            engine,
            models,
            drivers: Vec::new(),
            tasks: ExecutionTasks::default(),
            worked: false,
            batch_seq: 0,
            hold_until: None,
            memory: None,
        }
    }

    /// The bytes queued driver `i`'s context needs and those the running sessions hold, under
    /// the engine's memory budget; `None` without a budget (or before its model has loaded).
    fn memory_need(&mut self, i: usize) -> Result<Option<(f64, f64)>> {
        let Some(budget) = self.engine.as_ref().and_then(|e| e.options.memory_budget_bytes) else { return Ok(None) };
        let Some((model, tokens, kv, chunk)) = self.drivers[i].context() else { return Ok(None) };
        if self.memory.is_none() {
            let Some(model) = when_loaded(&self.models, model)? else { return Ok(None) };
            self.memory = Some(MemoryBudget::of(budget, model.config())?);
        }
        let need = self.memory.as_ref().expect("set above").need(tokens, kv, chunk);
        Ok(Some((need, self.reserved_bytes())))
    }

    fn reserved_bytes(&self) -> f64 {
        self.drivers.iter().filter(|d| matches!(d.phase(), Phase::Preparing | Phase::Active)).map(|d| d.reserved_bytes).sum()
    }

    /// The first queued session waits for running ones to free memory: nothing can be admitted
    /// before it (sessions are admitted in order).
    fn waits_for_memory(&self) -> bool {
        let (Some(memory), Some(d)) = (&self.memory, self.drivers.iter().find(|d| d.phase() == Phase::Queued)) else { return false };
        let Some((_, tokens, kv, chunk)) = d.context() else { return false };
        memory.waits(memory.need(tokens, kv, chunk), self.reserved_bytes())
    }

    /// Active rows that can decode now: one token each in the next decode step.
    fn running(&self) -> usize {
        self.drivers.iter().filter(|d| d.phase() == Phase::Active && d.runnable()).count()
    }

    fn count(&self, phase: Phase) -> usize {
        self.drivers.iter().filter(|d| d.phase() == phase).count()
    }

    /// Gives one unit of its own work to each driver `pick` selects (by index); returns how many.
    fn step_each(&mut self, pick: impl Fn(usize, &Driver) -> bool) -> usize {
        let models = self.models.clone();
        let model = move |id: ModelId| when_loaded(&models, id);
        let mut stepped = 0;
        for (i, d) in self.drivers.iter_mut().enumerate() {
            if pick(i, d) {
                d.step(&model, &self.prefix, &self.caller_caches);
                stepped += 1;
            }
        }
        stepped
    }

    /// Rows preparing together whose prompts start the same way prefill the shared part once:
    /// the first of them (the leader) prefills up to the end of it, then each other row starts
    /// from a snapshot of the leader's caches. Returns, per driver, whether it waits for its
    /// leader this time and the chunk cap a leader keeps to stop at the shared boundary.
    fn share_prefixes(&mut self) -> (Vec<bool>, Vec<Option<usize>>) {
        let n = self.drivers.len();
        let (mut waits, mut caps) = (vec![false; n], vec![None::<usize>; n]);
        // Leaders: any earlier session's row, preparing or decoding (drivers are in the order
        // sessions opened).
        fn sharing(d: &Driver) -> Option<&dyn Row> {
            d.row().filter(|r| r.shared_prompt().is_some())
        }
        for f in 0..n {
            let d = &self.drivers[f];
            let Some(follower) = sharing(d).filter(|_| d.phase() == Phase::Preparing && d.runnable()) else {
                continue;
            };
            let best = (0..f)
                .filter(|&l| !waits[l])
                .filter_map(|l| sharing(&self.drivers[l]).map(|g| (l, shared_prefix(g, follower))))
                .filter(|&(_, s)| s >= MIN_SHARED_PREFIX && s > prefilled(follower))
                .max_by_key(|&(_, s)| s);
            let Some((l, s)) = best else { continue };
            let leader = sharing(&self.drivers[l]).expect("found above");
            if prefilled(leader) < s {
                // Not there yet: the follower waits, the leader stops at the shared boundary.
                waits[f] = true;
                let cap = s - prefilled(leader);
                caps[l] = Some(caps[l].map_or(cap, |c| c.min(cap)));
                continue;
            }
            // A failed copy leaves the follower to prefill on its own.
            let snapshot = self.drivers[l].row_mut().expect("found above").caches().prefix(s);
            if let Ok(Some(caches)) = snapshot {
                self.prefix.borrow().record_shared(s);
                self.drivers[f].row_mut().expect("found above").adopt_prefix(caches, s);
            }
        }
        (waits, caps)
    }

    /// Creates the runs of newly admitted rows, then prefills one chunk of each preparing row
    /// within `budget` prompt tokens. Continuous rows of one model prefill together, each by the
    /// same number of tokens (the least any of them has left), so no padding is needed.
    fn prepare(&mut self, budget: usize) {
        let created = self.step_each(|_, d| d.phase() == Phase::Preparing && d.runnable() && d.row().is_none()) > 0;
        let (waits, caps) = self.share_prefixes();
        let mut left = budget.max(1);
        let mut groups: Vec<(Option<*const ()>, Vec<usize>)> = Vec::new();
        for (i, d) in self.drivers.iter().enumerate() {
            let Some(row) = d.row().filter(|_| d.phase() == Phase::Preparing && d.runnable() && !waits[i]) else {
                continue;
            };
            let key = row.batchable().then(|| model_key(row));
            match key.and_then(|k| groups.iter_mut().find(|(g, _)| *g == Some(k))) {
                Some((_, rows)) => rows.push(i),
                None => groups.push((key, vec![i])),
            }
        }
        let mut prefilled = false;
        for (_, rows) in groups {
            if left == 0 {
                break;
            }
            let k = rows.len();
            let per_row = rows
                .iter()
                .map(|&i| {
                    let room = self.drivers[i].row().map_or(0, |r| r.prompt_left().min(r.chunk_limit()));
                    caps[i].map_or(room, |c| room.min(c))
                })
                .min()
                .unwrap_or(0);
            let n = per_row.min((left / k).max(1));
            left = left.saturating_sub(n * k);
            prefilled = true;
            if k > 1 {
                BATCHED_PREFILLS.fetch_add(1, Ordering::Relaxed);
                PREFILL_ROWS.fetch_add(k as u64, Ordering::Relaxed);
            }
            self.run_batch(&rows, n);
        }
        self.worked |= created || prefilled;
        self.drivers.retain(|d| !d.settled());
    }

    /// One decode unit: every running continuous row of a model in one batched step, then each
    /// other running row (serial placements, scripted methods) one step alone. Returns how many
    /// rows advanced.
    fn decode(&mut self) -> usize {
        let n = self.drivers.len();
        let keys: Vec<Option<*const ()>> = self
            .drivers
            .iter_mut()
            .map(|d| {
                if d.phase() == Phase::Active {
                    d.batch_key()
                } else {
                    None
                }
            })
            .collect();
        let seq = self.batch_seq;
        let awaited: Vec<*const ()> =
            self.drivers.iter_mut().filter(|d| seq > 0 && d.batched_at == seq).filter_map(|d| d.awaited_key()).collect();
        let now = Instant::now();
        let holding = !awaited.is_empty() && *self.hold_until.get_or_insert(now + CONSUMER_HOLD) > now;
        let mut batched = vec![false; n];
        let mut stepped = Vec::new();
        for i in 0..n {
            let Some(key) = keys[i].filter(|_| !batched[i]) else {
                continue;
            };
            let members: Vec<usize> = (i..n).filter(|&j| keys[j] == Some(key)).collect();
            let held = holding && awaited.contains(&key);
            if members.len() < 2 && !held {
                continue;
            }
            for &j in &members {
                batched[j] = true;
            }
            if !held {
                self.step_batch(&members);
                stepped.extend(members);
            }
        }
        if !holding {
            self.hold_until = None;
        }
        let rows = stepped.len();
        if rows > 0 {
            self.batch_seq += 1;
            for j in stepped {
                self.drivers[j].batched_at = self.batch_seq;
            }
        }
        let alone = self.step_each(|i, d| !batched[i] && d.phase() == Phase::Active && d.runnable());
        self.drivers.retain(|d| !d.settled());
        self.worked |= rows + alone > 0;
        rows + alone
    }

    /// One decode step of `members` (indices of drivers, ascending) in one graph.
    fn step_batch(&mut self, members: &[usize]) {
        BATCHED_STEPS.fetch_add(1, Ordering::Relaxed);
        BATCHED_ROWS.fetch_add(members.len() as u64, Ordering::Relaxed);
        self.run_batch(members, 1);
    }

    /// One model step of the rows of `members` (indices of drivers, ascending), each feeding at
    /// most `max` tokens, and concludes each row with its own result.
    fn run_batch(&mut self, members: &[usize], max: usize) {
        let mut picked: Vec<&mut Driver> =
            self.drivers.iter_mut().enumerate().filter(|(j, _)| members.contains(j)).map(|(_, d)| d).collect();
        let results = {
            let mut parts: Vec<(&mut dyn Row, Output<'_>)> =
                picked.iter_mut().map(|d| d.batch_parts().expect("batch members step rows")).collect();
            let mut parts: Vec<(&mut dyn Row, &mut Output<'_>)> = parts.iter_mut().map(|(r, o)| (&mut **r, o)).collect();
            rows::step(&mut parts, max)
        };
        for (d, result) in picked.iter_mut().zip(results) {
            d.conclude(result);
        }
    }

    /// Fails the rows `pick` selects, each with its own copy of `error`. Rows that have already
    /// ended, or were cancelled, settle as such instead.
    fn fail(&mut self, pick: impl Fn(&Driver) -> bool, error: &Error) {
        for d in self.drivers.iter_mut().filter(|d| pick(d)) {
            if !d.housekeep() {
                d.settle(Err(error.replicate()));
            }
        }
        self.drivers.retain(|d| !d.settled());
    }

    /// When the nearest idle timer of these sessions, or the wait for consumers, runs out.
    pub fn idle_deadline(&self) -> Option<Instant> {
        self.drivers
            .iter()
            .filter_map(|d| d.session.idle_deadline())
            .chain(self.hold_until)
            .min()
    }
}

impl ExecutionGroup for Group {
    fn active(&self) -> usize {
        self.count(Phase::Active)
    }
    fn queued(&self) -> usize {
        if self.waits_for_memory() {
            return 0;
        }
        self.count(Phase::Queued) + self.engine.as_ref().map_or(0, |e| e.arriving())
    }
    fn preparing(&self) -> bool {
        self.drivers.iter().any(|d| d.phase() == Phase::Preparing)
    }
    fn max_active(&self) -> usize {
        self.engine.as_ref().map_or(0, |e| e.options.max_active)
    }
    /// Nothing mutates a model exclusively yet (no adapters, no prefix-cache rebuilds).
    fn admission_held(&self) -> bool {
        false
    }
    fn closed(&self) -> bool {
        self.engine.as_ref().is_some_and(|e| e.is_closed())
    }
    fn pending_tasks(&self) -> usize {
        self.tasks.pending()
    }
    fn preparing_rows(&self) -> usize {
        self.count(Phase::Preparing)
    }
    fn can_prepare_more(&self) -> bool {
        true
    }
    fn preparing_tokens(&self) -> usize {
        self.drivers
            .iter()
            .filter(|d| d.phase() == Phase::Preparing)
            .map(Driver::preparation_tokens)
            .sum()
    }
    fn next_preparation_tokens(&self) -> usize {
        self.drivers
            .iter()
            .find(|d| d.phase() == Phase::Queued)
            .map_or(0, Driver::preparation_tokens)
    }
    fn max_preparation_tokens(&self) -> usize {
        self.engine
            .as_ref()
            .map_or(0, |e| e.options.max_preparation_tokens)
    }
    /// Preparation publishes progress events only, and a consumer sees each as soon as it is
    /// queued: there is nothing to flush by yielding.
    fn preparation_published_output(&self) -> bool {
        false
    }
    fn mixed_preparation(&self) -> Option<MixedPreparation> {
        Some(MixedPreparation { running_tokens: self.running(), minimum_preparation_tokens: 1 })
    }
    fn max_iteration_tokens(&self) -> usize {
        self.engine
            .as_ref()
            .map_or(0, |e| e.options.max_iteration_tokens)
    }

    fn prune_cancelled(&mut self) {
        let now = Instant::now();
        for d in &self.drivers {
            d.session.check_idle(now);
            d.touch();
        }
        self.drivers.retain_mut(|d| !d.housekeep());
        self.tasks.prune();
    }
    fn admit_next(&mut self) -> bool {
        let Some(i) = self.drivers.iter().position(|d| d.phase() == Phase::Queued) else { return false };
        let verdict = self.memory_need(i).map(|need| {
            need.map(|(need, reserved)| {
                let memory = self.memory.as_ref().expect("a budget gives a need");
                let prefix = &self.prefix;
                (need, memory.admit(need, reserved, || prefix.borrow().bytes() as f64, || prefix.borrow_mut().reclaim_oldest()))
            })
        });
        let need = match verdict {
            Ok(None) => 0.0,
            Ok(Some((need, Verdict::Admit))) => need,
            Ok(Some((_, Verdict::Wait))) => return false,
            Ok(Some((_, Verdict::Refuse(e)))) | Err(e) => {
                self.drivers[i].settle(Err(e));
                self.drivers.retain(|d| !d.settled());
                return false;
            }
        };
        let admitted = self.drivers[i].admit();
        if admitted {
            self.drivers[i].reserved_bytes = need;
        }
        admitted
    }
    /// The next queued prompt fits one iteration's token budget.
    fn can_burst(&self) -> bool {
        self.count(Phase::Queued) > 0
            && self.next_preparation_tokens() <= self.max_iteration_tokens()
    }
    fn advance_task(&mut self) {
        self.tasks.advance();
        self.worked = true;
    }
    fn advance_preparation(&mut self) -> Result<()> {
        let budget = self.max_preparation_tokens();
        self.prepare(budget);
        Ok(())
    }
    /// Prompt work in what `budget` leaves after the running rows' tokens, then one decode step
    /// of every running row. Prefilling first lets a row whose prompt completes take its first
    /// decode step in the same unit, one batched step sooner than after the others' decode.
    fn advance_mixed(&mut self, budget: usize) -> Result<()> {
        let running = self.running();
        self.prepare(budget.saturating_sub(running));
        self.decode();
        Ok(())
    }
    fn advance(&mut self) -> Result<bool> {
        Ok(self.decode() > 0)
    }
    fn fail_active(&mut self, error: Error) {
        self.fail(|d| d.phase() == Phase::Active, &error);
    }
    /// A closed engine's sessions end as cancelled by `engine_closed`, whichever saw the close
    /// first (`Admission::close` cancels them one by one after setting the flag).
    fn fail_all(&mut self, error: Error) {
        if self.closed() {
            for d in &self.drivers {
                d.session.cancel(CancelReason::EngineClosed);
            }
        }
        self.fail(|_| true, &error);
        self.tasks.reject_all(|| error.replicate());
    }
    /// The memory the group's work freed (MLX's buffer cache, malloc's free pages): returned to
    /// the system when it goes idle.
    fn reserve_residency(&mut self) -> Release<'static> {
        let engine = self.engine.clone();
        if let Some(e) = &engine {
            e.set_idle(false);
        }
        Box::new(move || {
            let released = crate::mlx::memory::release_idle().map_err(|e| Error::Mlx(e.to_string()));
            if let Some(e) = engine {
                e.set_idle(true);
            }
            released
        })
    }
    /// The engine thread runs one unit at a time: holding it is the execution lease.
    fn acquire_execution(&mut self) -> Option<Release<'static>> {
        None
    }
}
