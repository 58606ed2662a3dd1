//! The policy against a fake group and a fake clock: each loop rule of `driveExecutionGroup`.
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use super::*;

type Log = Rc<RefCell<Vec<String>>>;

struct FakeClock(Rc<Cell<f64>>);

impl Clock for FakeClock {
    fn now(&self) -> f64 {
        self.0.get()
    }
}

/// Rows are prompt lengths while queued or preparing, remaining decode steps while active.
struct FakeGroup {
    log: Log,
    time: Rc<Cell<f64>>,
    queue: VecDeque<usize>,
    preparing: Vec<usize>,
    active: Vec<u32>,
    tasks: VecDeque<&'static str>,
    max_active: usize,
    held: bool,
    closed: bool,
    /// Longest prompt `can_burst` accepts.
    burst_limit: usize,
    max_preparation_tokens: usize,
    max_iteration_tokens: usize,
    /// Prompt tokens one `advance_preparation` processes per row.
    chunk: usize,
    mixed: bool,
    publishes_on_preparation: bool,
    published: bool,
    /// Decode steps a newly active row runs.
    steps: u32,
    step_ms: f64,
    stalled: bool,
    fail_advance: bool,
    fail_preparation: bool,
}

impl FakeGroup {
    fn new() -> (Self, FakeClock) {
        let time = Rc::new(Cell::new(1_000.0));
        let group = FakeGroup {
            log: Rc::default(),
            time: time.clone(),
            queue: VecDeque::new(),
            preparing: Vec::new(),
            active: Vec::new(),
            tasks: VecDeque::new(),
            max_active: 8,
            held: false,
            closed: false,
            burst_limit: 16,
            max_preparation_tokens: 64,
            max_iteration_tokens: 64,
            chunk: 1_000,
            mixed: false,
            publishes_on_preparation: false,
            published: false,
            steps: 100,
            step_ms: 5.0,
            stalled: false,
            fail_advance: false,
            fail_preparation: false,
        };
        (group, FakeClock(time))
    }

    fn note(&self, s: impl Into<String>) {
        self.log.borrow_mut().push(s.into());
    }

    fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.borrow_mut())
    }

    fn prepare(&mut self, budget: usize) {
        let mut left = budget;
        for row in &mut self.preparing {
            let n = (*row).min(self.chunk).min(left);
            *row -= n;
            left -= n;
        }
        let before = self.preparing.len();
        self.preparing.retain(|&r| r > 0);
        for _ in self.preparing.len()..before {
            self.active.push(self.steps);
        }
        self.published = self.publishes_on_preparation && self.preparing.len() < before;
    }

    fn decode(&mut self) {
        self.time.set(self.time.get() + self.step_ms);
        for r in &mut self.active {
            *r -= 1;
        }
        self.active.retain(|&r| r > 0);
    }
}

impl ExecutionGroup for FakeGroup {
    fn active(&self) -> usize {
        self.active.len()
    }
    fn queued(&self) -> usize {
        self.queue.len()
    }
    fn preparing(&self) -> bool {
        !self.preparing.is_empty()
    }
    fn max_active(&self) -> usize {
        self.max_active
    }
    fn admission_held(&self) -> bool {
        self.held
    }
    fn closed(&self) -> bool {
        self.closed
    }
    fn pending_tasks(&self) -> usize {
        self.tasks.len()
    }
    fn preparing_rows(&self) -> usize {
        self.preparing.len()
    }
    fn can_prepare_more(&self) -> bool {
        true
    }
    fn preparing_tokens(&self) -> usize {
        self.preparing.iter().sum()
    }
    fn next_preparation_tokens(&self) -> usize {
        self.queue.front().copied().unwrap_or(0)
    }
    fn max_preparation_tokens(&self) -> usize {
        self.max_preparation_tokens
    }
    fn preparation_published_output(&self) -> bool {
        self.published
    }
    fn mixed_preparation(&self) -> Option<MixedPreparation> {
        self.mixed.then(|| MixedPreparation {
            running_tokens: self.active.len(),
            minimum_preparation_tokens: 1,
        })
    }
    fn max_iteration_tokens(&self) -> usize {
        self.max_iteration_tokens
    }
    fn prune_cancelled(&mut self) {}
    fn admit_next(&mut self) -> bool {
        let Some(row) = self.queue.pop_front() else {
            return false;
        };
        self.note(format!("admit {row}"));
        self.preparing.push(row);
        true
    }
    fn can_burst(&self) -> bool {
        self.queue.front().is_some_and(|&n| n <= self.burst_limit)
    }
    fn advance_task(&mut self) {
        let task = self.tasks.pop_front().expect("a task is pending");
        self.note(format!("task {task}"));
    }
    fn advance_preparation(&mut self) -> Result<()> {
        self.note(format!("prepare {}", self.preparing.len()));
        if self.fail_preparation {
            return Err(Error::Mlx("prefill failed".into()));
        }
        self.prepare(usize::MAX);
        Ok(())
    }
    fn advance_mixed(&mut self, budget: usize) -> Result<()> {
        self.note(format!("mixed {budget}"));
        let running = self.active.len();
        self.decode();
        self.prepare(budget - running);
        Ok(())
    }
    fn advance(&mut self) -> Result<bool> {
        self.note(format!("decode {}", self.active.len()));
        if self.fail_advance {
            return Err(Error::Mlx("decode failed".into()));
        }
        if self.stalled {
            return Ok(false);
        }
        self.decode();
        Ok(true)
    }
    fn fail_active(&mut self, error: Error) {
        self.note(format!("fail active {} ({error})", self.active.len()));
        self.active.clear();
    }
    fn fail_all(&mut self, error: Error) {
        self.note(format!("fail all ({error})"));
        self.queue.clear();
        self.preparing.clear();
        self.active.clear();
    }
    fn reserve_residency(&mut self) -> Release<'static> {
        self.note("reserve residency");
        let log = self.log.clone();
        Box::new(move || {
            log.borrow_mut().push("release residency".into());
            Ok(())
        })
    }
    fn acquire_execution(&mut self) -> Option<Release<'static>> {
        self.note("acquire execution");
        let log = self.log.clone();
        Some(Box::new(move || {
            log.borrow_mut().push("release execution".into());
            Ok(())
        }))
    }
}

fn count(log: &[String], prefix: &str) -> usize {
    log.iter().filter(|l| l.starts_with(prefix)).count()
}

#[test]
fn an_idle_group_holds_nothing_and_releases_its_leases_when_work_ends() {
    let (mut g, clock) = FakeGroup::new();
    let mut s = Scheduler::new(false);
    assert_eq!(s.tick(&mut g, &clock), Tick::Idle);
    assert!(g.take_log().is_empty(), "no lease is taken without work");

    g.steps = 1;
    g.queue.push_back(4);
    assert_eq!(s.tick(&mut g, &clock), Tick::Yield);
    assert_eq!(
        g.take_log(),
        [
            "reserve residency",
            "acquire execution",
            "admit 4",
            "prepare 1",
            "decode 1"
        ]
    );
    assert_eq!(s.tick(&mut g, &clock), Tick::Idle);
    assert_eq!(g.take_log(), ["release execution", "release residency"]);
    // The next work takes the leases again.
    g.queue.push_back(4);
    s.tick(&mut g, &clock);
    assert_eq!(
        &g.take_log()[..2],
        ["reserve residency", "acquire execution"]
    );
}

#[test]
fn admission_is_fifo_and_bounded_by_max_active() {
    let (mut g, clock) = FakeGroup::new();
    g.max_active = 2;
    g.burst_limit = 0;
    g.queue.extend([100, 200, 300]);
    let mut s = Scheduler::new(false);
    let mut admitted = Vec::new();
    for _ in 0..10 {
        s.tick(&mut g, &clock);
        assert!(g.active.len() + g.preparing.len() <= 2);
        admitted.extend(g.take_log().into_iter().filter(|l| l.starts_with("admit")));
    }
    assert_eq!(
        admitted,
        ["admit 100", "admit 200"],
        "the third waits for a free row"
    );
    g.active.clear();
    s.tick(&mut g, &clock);
    assert_eq!(count(&g.take_log(), "admit 300"), 1);
}

#[test]
fn held_admission_admits_nothing_and_idles_without_rows() {
    let (mut g, clock) = FakeGroup::new();
    g.held = true;
    g.queue.push_back(4);
    g.tasks.push_back("t");
    let mut s = Scheduler::new(false);
    assert_eq!(s.tick(&mut g, &clock), Tick::Idle);
    assert!(g.take_log().is_empty());
    // With a running row, it decodes but neither admits nor runs the task.
    g.active.push(10);
    assert_eq!(s.tick(&mut g, &clock), Tick::Yield);
    let log = g.take_log();
    assert_eq!(count(&log, "admit"), 0);
    assert_eq!(count(&log, "task"), 0);
    assert_eq!(count(&log, "decode"), 1);
}

#[test]
fn short_admissions_burst_within_the_row_limit_and_token_budget() {
    let (mut g, clock) = FakeGroup::new();
    g.max_preparation_tokens = 20;
    g.queue.extend([8, 8, 8, 8]);
    let mut s = Scheduler::new(false);
    s.tick(&mut g, &clock);
    let log = g.take_log();
    // 8 + 8 fit the budget of 20; a third would not.
    assert_eq!(&log[2..5], ["admit 8", "admit 8", "prepare 2"]);

    let (mut g, clock) = FakeGroup::new();
    g.max_active = 3;
    g.active.push(10);
    g.queue.extend([4, 4, 4]);
    let mut s = Scheduler::new(false);
    s.tick(&mut g, &clock);
    // One running row: the burst stops once active + preparing rows reach max_active.
    assert_eq!(count(&g.take_log(), "admit"), 2);
}

#[test]
fn a_long_prompt_does_not_burst_and_interleaves_with_decode() {
    let (mut g, clock) = FakeGroup::new();
    g.chunk = 100;
    g.queue.extend([300, 4]);
    g.active.push(10);
    let mut s = Scheduler::new(false);
    s.tick(&mut g, &clock);
    let log = g.take_log();
    assert_eq!(
        &log[2..],
        ["admit 300", "prepare 1", "decode 1"],
        "preparation and decode alternate, no burst"
    );
    s.tick(&mut g, &clock);
    assert_eq!(g.take_log(), ["prepare 1", "decode 1"]);
}

#[test]
fn mixed_preparation_reserves_running_rows_first() {
    let (mut g, clock) = FakeGroup::new();
    g.mixed = true;
    g.max_iteration_tokens = 64;
    g.active.extend([10, 10, 10]);
    g.queue.push_back(200);
    g.burst_limit = 0;
    let mut s = Scheduler::new(false);
    assert_eq!(s.tick(&mut g, &clock), Tick::Yield);
    assert_eq!(&g.take_log()[2..], ["admit 200", "mixed 64"]);
    // The prompt got 64 - 3 tokens.
    assert_eq!(g.preparing, [200 - 61]);

    // A budget below one token per row still moves preparation by the minimum.
    g.max_iteration_tokens = 2;
    s.tick(&mut g, &clock);
    assert_eq!(g.take_log(), ["mixed 4"]);
    assert_eq!(g.preparing, [200 - 61 - 1]);
}

#[test]
fn preparation_that_published_output_yields_before_decode() {
    let (mut g, clock) = FakeGroup::new();
    g.publishes_on_preparation = true;
    g.queue.push_back(4);
    g.active.push(10);
    let mut s = Scheduler::new(false);
    assert_eq!(s.tick(&mut g, &clock), Tick::Yield);
    assert_eq!(&g.take_log()[2..], ["admit 4", "prepare 1"]);
    assert_eq!(s.tick(&mut g, &clock), Tick::Yield);
    assert_eq!(g.take_log(), ["decode 2"]);
}

#[test]
fn a_lone_admission_yields_after_preparation_only_when_asked() {
    for (yield_after, expected) in [
        (true, vec!["admit 4", "prepare 1"]),
        (false, vec!["admit 4", "prepare 1", "decode 1"]),
    ] {
        let (mut g, clock) = FakeGroup::new();
        g.step_ms = 100.0;
        g.queue.push_back(4);
        let mut s = Scheduler::new(yield_after);
        assert_eq!(s.tick(&mut g, &clock), Tick::Yield);
        assert_eq!(
            g.take_log()[2..],
            expected,
            "yield_after_preparation = {yield_after}"
        );
    }
}

#[test]
fn short_admissions_finish_preparing_before_decode() {
    let (mut g, clock) = FakeGroup::new();
    g.max_preparation_tokens = 4;
    g.queue.extend([4, 4]);
    g.active.push(10);
    let mut s = Scheduler::new(false);
    s.tick(&mut g, &clock);
    // The budget admits one at a time, but the second is admitted and prepared before decode.
    assert_eq!(
        &g.take_log()[2..],
        ["admit 4", "prepare 1", "admit 4", "prepare 1", "decode 3"]
    );
}

#[test]
fn a_single_row_keeps_the_thread_for_25_ms_then_yields() {
    let (mut g, clock) = FakeGroup::new();
    g.active.push(1_000);
    let mut s = Scheduler::new(false);
    s.tick(&mut g, &clock);
    // The first check is against the start (long ago): one step, then yield.
    assert_eq!(count(&g.take_log(), "decode"), 1);
    s.tick(&mut g, &clock);
    // 5 ms per step: steps end at +5 … +25; the fifth is no longer within 25 ms.
    assert_eq!(count(&g.take_log(), "decode"), 5);

    // Two rows yield after every step.
    g.active.push(1_000);
    s.tick(&mut g, &clock);
    assert_eq!(count(&g.take_log(), "decode"), 1);

    // A row that cannot advance (its consumer is behind) yields at once.
    g.active.truncate(1);
    g.stalled = true;
    s.tick(&mut g, &clock);
    s.tick(&mut g, &clock);
    assert_eq!(count(&g.take_log(), "decode"), 2);
}

#[test]
fn one_task_runs_per_iteration_in_order() {
    let (mut g, clock) = FakeGroup::new();
    g.tasks.extend(["a", "b", "c"]);
    let mut s = Scheduler::new(false);
    let mut ran = Vec::new();
    while s.tick(&mut g, &clock) == Tick::Yield {
        ran.push(
            g.take_log()
                .into_iter()
                .filter(|l| l.starts_with("task"))
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(ran, [vec!["task a"], vec!["task b"], vec!["task c"]]);
    assert_eq!(g.take_log(), ["release execution", "release residency"]);
    // Tasks run before admission in the same iteration.
    g.tasks.push_back("d");
    g.queue.push_back(4);
    s.tick(&mut g, &clock);
    let log = g.take_log();
    assert_eq!(&log[2..4], ["task d", "admit 4"]);
}

#[test]
fn a_failing_decode_fails_the_active_rows_and_the_group_goes_on() {
    let (mut g, clock) = FakeGroup::new();
    g.active.extend([10, 10]);
    g.step_ms = 100.0;
    g.fail_advance = true;
    let mut s = Scheduler::new(false);
    assert_eq!(s.tick(&mut g, &clock), Tick::Yield);
    assert_eq!(
        &g.take_log()[2..],
        ["decode 2", "fail active 2 (mlx: decode failed)"]
    );
    g.fail_advance = false;
    g.queue.push_back(4);
    assert_eq!(s.tick(&mut g, &clock), Tick::Yield);
    assert_eq!(g.take_log(), ["admit 4", "prepare 1", "decode 1"]);
}

#[test]
fn a_failing_preparation_fails_everything_and_closes() {
    let (mut g, clock) = FakeGroup::new();
    g.fail_preparation = true;
    g.active.push(10);
    g.queue.extend([4, 400]);
    g.burst_limit = 4;
    let mut s = Scheduler::new(false);
    assert_eq!(s.tick(&mut g, &clock), Tick::Closed);
    let log = g.take_log();
    assert_eq!(
        &log[2..],
        [
            "admit 4",
            "prepare 1",
            "release execution",
            "release residency",
            "fail all (mlx: prefill failed)"
        ]
    );
    assert!(g.queue.is_empty() && g.active.is_empty());
    assert_eq!(s.tick(&mut g, &clock), Tick::Closed);
    assert!(
        g.take_log().is_empty(),
        "a closed scheduler does nothing more"
    );
}

#[test]
fn closing_fails_every_row_and_releases_the_leases() {
    let (mut g, clock) = FakeGroup::new();
    g.active.push(10);
    let mut s = Scheduler::new(false);
    s.tick(&mut g, &clock);
    g.take_log();
    g.closed = true;
    g.queue.push_back(4);
    assert_eq!(s.tick(&mut g, &clock), Tick::Closed);
    assert_eq!(
        g.take_log(),
        [
            "release execution",
            "release residency",
            "fail all (scheduler closed)"
        ]
    );
}
