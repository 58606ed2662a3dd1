//! The continuous scheduling policy: mlx-bun 0.5's `driveExecutionGroup`, apart from mechanism.
//! A group (the sessions of one engine) says what it holds; this policy decides what runs next:
//! one pending task, admissions (a burst of short ones together), preparation (prompt prefill),
//! mixed preparation within a token budget, or one decode step of every running row.
//!
//! mlx-bun's loop (TypeScript) is `async` and yields to the event loop; the engine thread has no event loop,
//! so the loop is a step machine: [`Scheduler::tick`] runs it up to its next yield and returns,
//! and the thread's own loop (commands, other groups, idle timers) is what a yield hands back to.
use super::resources::{dispose_all, Release};
use crate::error::{Error, Result};

/// The single-row responsiveness budget: one active row keeps the thread up to this long.
const SINGLE_ROW_BUDGET_MS: f64 = 25.0;

/// Running rows' token demand and the least preparation that must progress alongside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MixedPreparation {
    pub running_tokens: usize,
    pub minimum_preparation_tokens: usize,
}

/// What a group of rows sharing one execution looks like to the policy (mlx-bun's
/// `ExecutionGroup`). `active` rows decode, `preparing` ones are being admitted (prefill),
/// `queued` ones wait for admission.
pub trait ExecutionGroup {
    fn active(&self) -> usize;
    fn queued(&self) -> usize;
    fn preparing(&self) -> bool;
    fn max_active(&self) -> usize;
    /// An exclusive mutation of the model is draining the group: admit nothing.
    fn admission_held(&self) -> bool;
    fn closed(&self) -> bool;
    fn pending_tasks(&self) -> usize;
    fn preparing_rows(&self) -> usize;
    /// Another row may start preparing while one is.
    fn can_prepare_more(&self) -> bool;
    fn preparing_tokens(&self) -> usize;
    fn next_preparation_tokens(&self) -> usize;
    fn max_preparation_tokens(&self) -> usize;
    /// The last preparation published output its consumer should see before more work runs.
    fn preparation_published_output(&self) -> bool;
    /// `Some` when preparation and running rows can advance together in one unit.
    fn mixed_preparation(&self) -> Option<MixedPreparation>;
    fn max_iteration_tokens(&self) -> usize;

    fn prune_cancelled(&mut self);
    fn admit_next(&mut self) -> bool;
    /// The next queued row is short enough to prepare together with the current ones.
    fn can_burst(&self) -> bool;
    fn advance_task(&mut self);
    fn advance_preparation(&mut self) -> Result<()>;
    fn advance_mixed(&mut self, budget: usize) -> Result<()>;
    /// One decode unit of the running rows. `Ok(false)`: none could advance (their consumers
    /// are behind), which ends the single-row budget early: only a yield lets them catch up.
    fn advance(&mut self) -> Result<bool>;
    fn fail_active(&mut self, error: Error);
    fn fail_all(&mut self, error: Error);
    /// Held while the group has work; released when it goes idle.
    fn reserve_residency(&mut self) -> Release<'static>;
    fn acquire_execution(&mut self) -> Option<Release<'static>>;
}

pub trait Clock {
    /// Milliseconds on a monotonic clock.
    fn now(&self) -> f64;
}

/// Where a [`Scheduler::tick`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tick {
    /// The policy yielded: run the tick again after other work.
    Yield,
    /// Nothing to do until new work arrives; the group's leases are released.
    Idle,
    /// The group is closed; the leases are released and every row has been failed.
    Closed,
}

pub struct Scheduler {
    residency: Option<Release<'static>>,
    execution: Option<Release<'static>>,
    last_yield: f64,
    /// A lone admission yields once prepared, before its first decode step.
    yield_after_preparation: bool,
    closed: bool,
}

impl Scheduler {
    pub fn new(yield_after_preparation: bool) -> Self {
        Scheduler {
            residency: None,
            execution: None,
            last_yield: 0.0,
            yield_after_preparation,
            closed: false,
        }
    }

    /// Runs the policy until it yields, goes idle or closes.
    pub fn tick(&mut self, group: &mut dyn ExecutionGroup, clock: &dyn Clock) -> Tick {
        if self.closed {
            return Tick::Closed;
        }
        match self.run(group, clock) {
            Ok(Some(tick)) => return tick,
            Ok(None) => self.shut_down(group, Error::Protocol("scheduler closed".into())),
            Err(error) => self.shut_down(group, error),
        }
        Tick::Closed
    }

    /// The loop body of `driveExecutionGroup`; `Ok(None)` when the group closed.
    fn run(&mut self, group: &mut dyn ExecutionGroup, clock: &dyn Clock) -> Result<Option<Tick>> {
        while !group.closed() {
            group.prune_cancelled();
            let mut held = group.admission_held();
            if group.active() == 0
                && !group.preparing()
                && (held || (group.queued() == 0 && group.pending_tasks() == 0))
            {
                self.release()?;
                return Ok(Some(Tick::Idle));
            }
            if self.residency.is_none() {
                self.residency = Some(group.reserve_residency());
            }
            if self.execution.is_none() {
                self.execution = group.acquire_execution();
            }
            if group.closed() {
                break;
            }

            // One task per iteration; an exclusive mutation keeps its drain priority.
            if !held && group.pending_tasks() > 0 {
                group.advance_task();
                if group.closed() {
                    break;
                }
                group.prune_cancelled();
                held = group.admission_held();
            }

            if !group.preparing()
                && !held
                && group.queued() > 0
                && group.active() < group.max_active()
            {
                group.admit_next();
            }
            while group.preparing()
                && group.can_prepare_more()
                && !held
                && group.queued() > 0
                && group.active() + group.preparing_rows() < group.max_active()
                && group.can_burst()
                && group
                    .preparing_tokens()
                    .saturating_add(group.next_preparation_tokens())
                    <= group.max_preparation_tokens()
            {
                if !group.admit_next() {
                    break;
                }
            }
            let mixed = if group.preparing() && group.active() > 0 {
                group.mixed_preparation()
            } else {
                None
            };
            if let Some(mixed) = mixed {
                // Running rows' demand is reserved first; prompt work fills the rest. A budget
                // smaller than one token per row still progresses.
                let budget = group
                    .max_iteration_tokens()
                    .max(mixed.running_tokens + mixed.minimum_preparation_tokens);
                group.advance_mixed(budget)?;
                return Ok(Some(self.yield_now(clock)));
            }
            if group.preparing() {
                let active_before = group.active();
                group.advance_preparation()?;
                // Output published while preparing reaches its consumer before the next unit;
                // queued short admissions still form a group across yields.
                if group.preparation_published_output()
                    || (self.yield_after_preparation
                        && active_before == 0
                        && !group.preparing()
                        && group.active() == 1
                        && group.queued() == 0)
                {
                    return Ok(Some(self.yield_now(clock)));
                }
            }

            // Finish short admissions before decode; long preparation interleaves with running
            // rows because the group still reports preparing.
            if !group.preparing()
                && !held
                && group.queued() > 0
                && group.active() < group.max_active()
                && group.can_burst()
            {
                continue;
            }
            let mut progressed = false;
            if group.active() > 0 {
                match group.advance() {
                    Ok(p) => progressed = p,
                    Err(e) => group.fail_active(e),
                }
            }
            if progressed
                && group.active() == 1
                && group.queued() == 0
                && !group.preparing()
                && !group.admission_held()
                && clock.now() - self.last_yield < SINGLE_ROW_BUDGET_MS
            {
                continue;
            }
            return Ok(Some(self.yield_now(clock)));
        }
        Ok(None)
    }

    fn yield_now(&mut self, clock: &dyn Clock) -> Tick {
        self.last_yield = clock.now();
        Tick::Yield
    }

    /// Releases the execution lease, then residency; both are attempted.
    fn release(&mut self) -> Result<()> {
        let releases: Vec<Release<'static>> = [self.execution.take(), self.residency.take()]
            .into_iter()
            .flatten()
            .collect();
        dispose_all(releases)
    }

    /// Releases the leases, then fails every row with `error` (and any release failure, so
    /// that it reaches a caller: the engine thread has nobody else to report to).
    fn shut_down(&mut self, group: &mut dyn ExecutionGroup, error: Error) {
        self.closed = true;
        let error = match self.release() {
            Ok(()) => error,
            Err(e) => Error::Aggregate(vec![error, e]),
        };
        group.fail_all(error);
    }
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
