//! Work that needs the engine thread between units without owning a decode row (mlx-bun 0.5's
//! `ExecutionTasks`): model loads, logits, conversions. The scheduler runs one per iteration. A
//! long task runs in steps (`enqueue_steps`): one step per turn, then back to the end of the
//! queue, so sessions and other tasks run between its steps. A task is cancelled by dropping its
//! receiver: while pending (or between steps) it is then removed; a step, once started, runs to
//! its end.
use std::collections::VecDeque;

use tokio::sync::oneshot;

use crate::error::{catch_panic, Error, Result};

trait Pending {
    /// Runs the task, or its next step; what is left of it, if anything, goes back in the queue.
    fn run(self: Box<Self>) -> Option<Box<dyn Pending>>;
    fn cancelled(&self) -> bool;
    fn reject(self: Box<Self>, error: Error);
}

struct Task<T, F> {
    work: F,
    reply: oneshot::Sender<Result<T>>,
}

impl<T, F: FnOnce() -> Result<T>> Pending for Task<T, F> {
    fn run(self: Box<Self>) -> Option<Box<dyn Pending>> {
        // A panic fails this task alone (`INTERNAL_ERROR`); the thread goes on with the next.
        let _ = self.reply.send(catch_panic(self.work));
        None
    }

    fn cancelled(&self) -> bool {
        self.reply.is_closed()
    }

    fn reject(self: Box<Self>, error: Error) {
        let _ = self.reply.send(Err(error));
    }
}

/// A task of several steps: `step` returns `Ok(None)` while work is left.
struct Steps<T, F> {
    step: F,
    reply: oneshot::Sender<Result<T>>,
}

impl<T: 'static, F: FnMut() -> Result<Option<T>> + 'static> Pending for Steps<T, F> {
    fn run(mut self: Box<Self>) -> Option<Box<dyn Pending>> {
        let step = &mut self.step;
        match catch_panic(|| step()) {
            Ok(None) => Some(self),
            Ok(Some(done)) => {
                let _ = self.reply.send(Ok(done));
                None
            }
            Err(e) => {
                let _ = self.reply.send(Err(e));
                None
            }
        }
    }

    fn cancelled(&self) -> bool {
        self.reply.is_closed()
    }

    fn reject(self: Box<Self>, error: Error) {
        let _ = self.reply.send(Err(error));
    }
}

#[derive(Default)]
pub struct ExecutionTasks {
    pending: VecDeque<Box<dyn Pending>>,
}

impl ExecutionTasks {
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Queues `work`; its result goes to `reply`. A caller that has already stopped waiting
    /// queues nothing.
    pub fn enqueue<T: 'static>(
        &mut self,
        work: impl FnOnce() -> Result<T> + 'static,
        reply: oneshot::Sender<Result<T>>,
    ) {
        if !reply.is_closed() {
            self.pending.push_back(Box::new(Task { work, reply }));
        }
    }

    /// Queues a task that runs one `step` per turn until a step returns its result.
    pub fn enqueue_steps<T: 'static>(
        &mut self,
        step: impl FnMut() -> Result<Option<T>> + 'static,
        reply: oneshot::Sender<Result<T>>,
    ) {
        if !reply.is_closed() {
            self.pending.push_back(Box::new(Steps { step, reply }));
        }
    }

    /// Drops the pending tasks whose callers stopped waiting.
    pub fn prune(&mut self) {
        self.pending.retain(|t| !t.cancelled());
    }

    /// Runs the oldest pending task (or its next step).
    pub fn advance(&mut self) {
        if let Some(task) = self.pending.pop_front() {
            if let Some(rest) = task.run() {
                self.pending.push_back(rest);
            }
        }
    }

    /// Fails every pending task with a copy of `error`.
    pub fn reject_all(&mut self, error: impl Fn() -> Error) {
        for task in self.pending.drain(..) {
            task.reject(error());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;

    #[test]
    fn tasks_run_one_at_a_time_in_order() {
        let ran = Rc::new(RefCell::new(Vec::new()));
        let mut tasks = ExecutionTasks::default();
        let mut replies = Vec::new();
        for name in ["a", "b"] {
            let (tx, rx) = oneshot::channel();
            let ran = ran.clone();
            tasks.enqueue(
                move || {
                    ran.borrow_mut().push(name);
                    Ok(name.len())
                },
                tx,
            );
            replies.push(rx);
        }
        assert_eq!(tasks.pending(), 2);
        tasks.advance();
        assert_eq!(*ran.borrow(), ["a"]);
        assert_eq!(replies[0].try_recv().unwrap().unwrap(), 1);
        assert!(replies[1].try_recv().is_err(), "the second has not run");
        tasks.advance();
        assert_eq!(*ran.borrow(), ["a", "b"]);
        assert_eq!(tasks.pending(), 0);
    }

    #[test]
    fn a_cancelled_task_is_removed_while_pending_and_never_runs() {
        let ran = Rc::new(RefCell::new(0));
        let mut tasks = ExecutionTasks::default();
        // Already cancelled when queued.
        let (tx, rx) = oneshot::channel::<Result<()>>();
        drop(rx);
        tasks.enqueue(|| Ok(()), tx);
        assert_eq!(tasks.pending(), 0);
        // Cancelled while pending.
        let (tx, rx) = oneshot::channel();
        let r = ran.clone();
        tasks.enqueue(move || Ok(*r.borrow_mut() += 1), tx);
        let (tx2, mut rx2) = oneshot::channel();
        tasks.enqueue(|| Ok(7), tx2);
        drop(rx);
        tasks.prune();
        assert_eq!(tasks.pending(), 1);
        tasks.advance();
        assert_eq!(*ran.borrow(), 0);
        assert_eq!(rx2.try_recv().unwrap().unwrap(), 7);
    }

    #[test]
    fn a_panicking_task_fails_alone_with_internal_error() {
        let mut tasks = ExecutionTasks::default();
        let (tx, mut rx) = oneshot::channel::<Result<u32>>();
        tasks.enqueue(|| panic!("boom in a task"), tx);
        let (tx2, mut rx2) = oneshot::channel();
        tasks.enqueue(|| Ok(7u32), tx2);
        tasks.advance();
        let e = rx.try_recv().unwrap().unwrap_err();
        assert_eq!((e.code(), e.to_string().as_str()), ("INTERNAL_ERROR", "internal error: boom in a task"));
        tasks.advance();
        assert_eq!(rx2.try_recv().unwrap().unwrap(), 7);
    }

    #[test]
    fn a_task_in_steps_lets_the_others_run_between_its_steps() {
        let ran = Rc::new(RefCell::new(Vec::new()));
        let mut tasks = ExecutionTasks::default();
        let (tx, mut long) = oneshot::channel();
        let (r, mut n) = (ran.clone(), 0);
        tasks.enqueue_steps(
            move || {
                n += 1;
                r.borrow_mut().push(format!("long {n}"));
                Ok((n == 3).then_some(n))
            },
            tx,
        );
        let (tx, mut short) = oneshot::channel();
        let r = ran.clone();
        tasks.enqueue(move || Ok(r.borrow_mut().push("short".into())), tx);
        for _ in 0..4 {
            tasks.advance();
        }
        assert_eq!(*ran.borrow(), ["long 1", "short", "long 2", "long 3"]);
        assert_eq!(long.try_recv().unwrap().unwrap(), 3);
        assert!(short.try_recv().unwrap().is_ok());
        assert_eq!(tasks.pending(), 0);
        // A caller that stops waiting between steps ends the task there.
        let (tx, rx) = oneshot::channel::<Result<()>>();
        let r = ran.clone();
        tasks.enqueue_steps(move || Ok(r.borrow_mut().push("again".into())).map(|()| None), tx);
        tasks.advance();
        drop(rx);
        tasks.prune();
        assert_eq!(tasks.pending(), 0);
        assert_eq!(ran.borrow().last().map(String::as_str), Some("again"));
    }

    #[test]
    fn reject_all_fails_every_pending_task() {
        let mut tasks = ExecutionTasks::default();
        let mut rxs = Vec::new();
        for _ in 0..3 {
            let (tx, rx) = oneshot::channel::<Result<()>>();
            tasks.enqueue(|| Ok(()), tx);
            rxs.push(rx);
        }
        tasks.reject_all(|| Error::EngineClosed);
        assert_eq!(tasks.pending(), 0);
        for mut rx in rxs {
            assert_eq!(rx.try_recv().unwrap().unwrap_err().code(), "ENGINE_CLOSED");
        }
    }
}
