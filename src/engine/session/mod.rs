//! A generation session (mlx-bun's `EngineSession`): lifecycle and bounded delivery only — no
//! graph, cache or sampler. The engine thread produces: it steps the session's method a unit at a
//! time through [`Output`] and never waits on a consumer (a session whose queue is full is simply
//! not stepped). Consumers (JavaScript through napi, or the CLI) take every ready event at once
//! and acknowledge each as they use it, so the queue bounds also cover events a consumer holds.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::Notify;

use super::events::{FinishReason, GenerateStats};
use crate::error::{Error, Result};
use crate::sample::logprobs::TokenLogprobs;

mod output;
pub use output::Output;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelReason {
    Requested,
    ConsumerClosed,
    ConsumerIdle,
    EngineClosed,
}

impl CancelReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CancelReason::Requested => "requested",
            CancelReason::ConsumerClosed => "consumer_closed",
            CancelReason::ConsumerIdle => "consumer_idle",
            CancelReason::EngineClosed => "engine_closed",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "requested" => CancelReason::Requested,
            "consumer_closed" => CancelReason::ConsumerClosed,
            "consumer_idle" => CancelReason::ConsumerIdle,
            "engine_closed" => CancelReason::EngineClosed,
            _ => return Err(Error::option("reason", format!("'{s}' is not a cancel reason"))),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionState {
    Created,
    Preparing,
    Running,
    Settling,
    Terminal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    /// Events through `next_batch`; starts on the first read; idle consumers are cancelled.
    Stream,
    /// Tokens into a buffer (within the engine's maxCollectTokens budget), returned with the outcome.
    Collect,
    /// Like a stream read by the binding, which hands each batch to a user callback.
    Callback,
}

impl OutputMode {
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "stream" => OutputMode::Stream,
            "collect" => OutputMode::Collect,
            "callback" => OutputMode::Callback,
            _ => return Err(Error::option("output", format!("must be 'stream', 'collect' or 'callback', got '{s}'"))),
        })
    }
}

/// Delivery bounds of one session (from the engine's options).
#[derive(Debug, Clone, Copy)]
pub struct DeliveryLimits {
    /// `None`: never cancel an idle consumer.
    pub idle_timeout: Option<Duration>,
    pub max_queued_events: usize,
    pub max_queued_tokens: usize,
    pub max_top_logprobs: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum SessionEvent {
    Committed { sequence: u64, token_ids: Vec<u32>, logprobs: Option<Vec<TokenLogprobs>> },
    Progress { completed: f64, total: Option<f64> },
}

impl SessionEvent {
    fn tokens(&self) -> usize {
        match self {
            SessionEvent::Committed { token_ids, .. } => token_ids.len(),
            SessionEvent::Progress { .. } => 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MethodResult {
    pub finish_reason: FinishReason,
    pub metrics: GenerateStats,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// `execution_failed` or `cleanup_failed`.
    pub code: &'static str,
    pub message: String,
    pub cleanup_error: Option<String>,
    /// The typed code of the error behind the failure.
    pub cause: Option<&'static str>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    Completed(MethodResult),
    Cancelled(CancelReason),
    Failed(Failure),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: Status,
    pub committed_tokens: u64,
    /// Collect mode: exactly the committed tokens.
    pub output: Option<Vec<u32>>,
    /// The run's timings, whatever the status (absent if it never ran).
    pub metrics: Option<GenerateStats>,
}

impl Outcome {
    /// The method's result, or the reason there is none as an error.
    pub fn into_result(self) -> Result<MethodResult> {
        match self.status {
            Status::Completed(r) => Ok(r),
            Status::Cancelled(r) => Err(Error::Cancelled(r.as_str())),
            Status::Failed(f) => Err(Error::Protocol(format!("{}: {}", f.code, f.message))),
        }
    }
}

/// What the engine thread should do with a session next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Not started, or waiting for its consumer to make room.
    Waiting,
    Runnable,
    /// Cancelled or its consumer failed: settle now.
    Settle,
    Terminal,
}

struct Inner {
    state: SessionState,
    started: bool,
    reader_claimed: bool,
    reading: bool,
    cancelled: Option<CancelReason>,
    /// Queued events not yet handed to the consumer.
    ready: VecDeque<SessionEvent>,
    /// Token counts of events handed out and not yet acknowledged.
    handed: VecDeque<usize>,
    /// Tokens in `ready` and `handed`.
    queued_tokens: usize,
    /// Publications waiting for queue space; the method is not stepped while any wait.
    outbox: VecDeque<SessionEvent>,
    outbox_tokens: usize,
    /// The producer was blocked; wake the engine once the consumer has freed half the queue,
    /// so a fast producer and a slower consumer do not hand over one event at a time.
    producer_waiting: bool,
    /// The method has returned; the engine waits for its last publications to be delivered.
    finishing: bool,
    committed: u64,
    sequence: u64,
    limit: u64,
    buffer: Option<Vec<u32>>,
    output_stopped: bool,
    /// The consumer has all it wants (`finish_output`): later commits are discarded.
    output_finished: bool,
    consumer_error: Option<String>,
    idle_deadline: Option<Instant>,
    outcome: Option<Outcome>,
}

impl Inner {
    /// Drops what the producer has committed but not yet queued.
    fn clear_outbox(&mut self) {
        self.outbox.clear();
        self.outbox_tokens = 0;
    }

    fn queue_len(&self) -> usize {
        self.ready.len() + self.handed.len()
    }
}

pub struct Session {
    pub id: String,
    pub mode: OutputMode,
    limits: DeliveryLimits,
    inner: Mutex<Inner>,
    /// Wakes consumers: events queued, or the session ended.
    changed: Notify,
    hooks: Arc<dyn SessionHooks>,
}

/// What a session tells its engine.
pub trait SessionHooks: Send + Sync {
    /// The engine thread has work: the session started, was unblocked or cancelled.
    fn wake(&self);
    /// The session became terminal (exactly once).
    fn terminal(&self);
}

impl Session {
    pub fn new(id: String, mode: OutputMode, limits: DeliveryLimits, hooks: Arc<dyn SessionHooks>) -> Self {
        let session = Session {
            id,
            mode,
            limits,
            inner: Mutex::new(Inner {
                state: SessionState::Created,
                started: false,
                reader_claimed: false,
                reading: false,
                cancelled: None,
                ready: VecDeque::new(),
                handed: VecDeque::new(),
                queued_tokens: 0,
                outbox: VecDeque::new(),
                outbox_tokens: 0,
                producer_waiting: false,
                finishing: false,
                committed: 0,
                sequence: 0,
                limit: 0,
                buffer: None,
                output_stopped: false,
                output_finished: false,
                consumer_error: None,
                idle_deadline: None,
                outcome: None,
            }),
            changed: Notify::new(),
            hooks,
        };
        {
            let mut s = session.lock();
            if mode == OutputMode::Stream {
                session.arm_idle(&mut s);
            } else {
                s.started = true;
            }
        }
        session
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn arm_idle(&self, s: &mut Inner) {
        s.idle_deadline = self.limits.idle_timeout.and_then(|t| Instant::now().checked_add(t));
    }

    pub fn state(&self) -> SessionState {
        self.lock().state
    }

    pub fn committed(&self) -> u64 {
        self.lock().committed
    }

    /// Where a session that has not ended stands, for `testing.liveSessionStates` (a soak that
    /// finds sessions never ending needs to see which step they wait on).
    pub fn describe(&self) -> serde_json::Value {
        let s = self.lock();
        serde_json::json!({
            "id": self.id, "mode": format!("{:?}", self.mode), "state": s.state, "started": s.started,
            "readerClaimed": s.reader_claimed, "reading": s.reading,
            "cancelled": s.cancelled.map(CancelReason::as_str), "ready": s.ready.len(),
            "handed": s.handed.len(), "outbox": s.outbox.len(), "producerWaiting": s.producer_waiting,
            "finishing": s.finishing, "committed": s.committed, "outputStopped": s.output_stopped,
            "outputFinished": s.output_finished,
        })
    }

    // ---- consumer side ----

    /// Claims the one event consumer of a stream session.
    pub fn claim_reader(&self) -> Result<()> {
        if self.mode != OutputMode::Stream {
            return Err(Error::NotAStream);
        }
        let mut s = self.lock();
        if std::mem::replace(&mut s.reader_claimed, true) {
            return Err(Error::AlreadyConsumed);
        }
        Ok(())
    }

    /// Every event ready, waiting for at least one; `None` once the session has ended and its
    /// queue is drained. Starts a stream session; the idle timer is stopped while this waits.
    pub async fn next_batch(&self) -> Result<Option<Vec<SessionEvent>>> {
        {
            let mut s = self.lock();
            if std::mem::replace(&mut s.reading, true) {
                return Err(Error::ConcurrentNext);
            }
            s.idle_deadline = None;
            if !s.started && s.state != SessionState::Terminal {
                s.started = true;
                drop(s);
                self.hooks.wake();
            }
        }
        let _reading = Reading(self);
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.lock();
                if !s.ready.is_empty() {
                    let events: Vec<SessionEvent> = s.ready.drain(..).collect();
                    s.handed.extend(events.iter().map(SessionEvent::tokens));
                    if s.state != SessionState::Terminal && self.mode == OutputMode::Stream {
                        self.arm_idle(&mut s);
                    }
                    return Ok(Some(events));
                }
                if s.state == SessionState::Terminal {
                    return Ok(None);
                }
            }
            notified.await;
        }
    }

    /// The consumer used `n` of the events it was handed: frees their queue space and, for a
    /// stream, restarts the idle timer.
    pub fn consumed(&self, n: usize) {
        let mut s = self.lock();
        for _ in 0..n {
            let Some(tokens) = s.handed.pop_front() else { break };
            s.queued_tokens -= tokens;
        }
        if s.state == SessionState::Terminal {
            return;
        }
        if self.mode == OutputMode::Stream {
            self.arm_idle(&mut s);
        }
        let was_blocked = !s.outbox.is_empty();
        self.flush(&mut s);
        let low = s.outbox.is_empty()
            && s.queue_len() <= self.limits.max_queued_events / 2
            && s.queued_tokens <= self.limits.max_queued_tokens / 2;
        let resume = s.producer_waiting && low;
        if resume {
            s.producer_waiting = false;
        }
        let delivered = (s.finishing && s.outbox.is_empty()) || (self.mode == OutputMode::Callback && s.queue_len() == 0);
        drop(s);
        if was_blocked {
            self.changed.notify_waiters();
        }
        if resume || delivered {
            self.hooks.wake();
        }
    }

    /// Drops queued events and stops the session; a session that never started ends here.
    pub fn cancel(&self, reason: CancelReason) {
        let mut s = self.lock();
        if s.state == SessionState::Terminal {
            return;
        }
        s.cancelled.get_or_insert(reason);
        s.ready.clear();
        s.handed.clear();
        s.queued_tokens = 0;
        s.clear_outbox();
        s.idle_deadline = None;
        if !s.started {
            let reason = s.cancelled.unwrap_or(reason);
            self.finish_locked(&mut s, Status::Cancelled(reason), None);
        }
        drop(s);
        self.changed.notify_waiters();
        self.hooks.wake();
    }

    /// Callback mode: the consumer's callback returned `false`. Tokens it has not been given are
    /// not committed; the method is told to stop at its next step.
    pub fn stop_output(&self) {
        let mut s = self.lock();
        if s.state == SessionState::Terminal {
            return;
        }
        s.output_stopped = true;
        let undelivered: usize = s.ready.drain(..).map(|e| e.tokens()).sum();
        s.queued_tokens -= undelivered;
        s.committed -= undelivered as u64;
        s.clear_outbox();
        s.producer_waiting = false;
        drop(s);
        self.hooks.wake();
    }

    /// The consumer has all it wants (the server matched a stop string): queued events are
    /// dropped, whatever the method commits from now on is discarded, and the method ends at its
    /// next step with `stop`, so its caches go back to the prefix cache. A cancel would end it
    /// too, but a cancelled row may be between layers and never hands its caches on. Unlike
    /// `stop_output`, which a callback calls while the method waits for it, this may come from
    /// another thread in the middle of a step: a commit racing it is not the method's error.
    pub fn finish_output(&self) {
        let mut s = self.lock();
        if s.state == SessionState::Terminal || s.cancelled.is_some() {
            return;
        }
        s.output_finished = true;
        let undelivered: usize = s.ready.drain(..).map(|e| e.tokens()).sum();
        s.committed -= undelivered as u64;
        s.handed.clear();
        s.queued_tokens = 0;
        s.clear_outbox();
        s.producer_waiting = false;
        s.idle_deadline = None;
        drop(s);
        self.changed.notify_waiters();
        self.hooks.wake();
    }

    /// Callback mode: the consumer's callback threw; the session fails with its message.
    pub fn fail_output(&self, message: String) {
        let mut s = self.lock();
        if s.state == SessionState::Terminal {
            return;
        }
        s.consumer_error.get_or_insert(message);
        s.output_stopped = true;
        drop(s);
        self.hooks.wake();
    }

    /// Resolves with the outcome once the session is terminal.
    pub async fn outcome(&self) -> Outcome {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(o) = &self.lock().outcome {
                return o.clone();
            }
            notified.await;
        }
    }

    /// Reads a stream session to its end on the calling thread (for Rust callers such as the
    /// CLI), handing each event to `f`; an error from `f` closes the session.
    pub fn read_blocking(&self, mut f: impl FnMut(&SessionEvent) -> Result<()>) -> Result<Outcome> {
        self.claim_reader()?;
        let rt = tokio::runtime::Builder::new_current_thread().build().map_err(|e| Error::Mlx(e.to_string()))?;
        rt.block_on(async {
            while let Some(batch) = self.next_batch().await? {
                for event in &batch {
                    if let Err(e) = f(event) {
                        self.cancel(CancelReason::ConsumerClosed);
                        return Err(e);
                    }
                    self.consumed(1);
                }
            }
            Ok(self.outcome().await)
        })
    }

    // ---- engine side ----

    pub fn readiness(&self) -> Readiness {
        let s = self.lock();
        if s.state == SessionState::Terminal {
            Readiness::Terminal
        } else if s.cancelled.is_some() || s.consumer_error.is_some() {
            Readiness::Settle
        } else if !s.started || !s.outbox.is_empty() || s.producer_waiting {
            Readiness::Waiting
        } else {
            Readiness::Runnable
        }
    }

    /// Whether every publication has reached the consumer as far as the mode requires: queued
    /// for a stream, handled by the callback for callback mode (whose calls the method awaits).
    pub fn delivered(&self) -> bool {
        let s = self.lock();
        s.outbox.is_empty() && (self.mode != OutputMode::Callback || s.queue_len() == 0)
    }

    /// The method has returned and its outcome waits for delivery; the consumer wakes the
    /// engine as soon as that is done.
    pub fn mark_finishing(&self) {
        self.lock().finishing = true;
    }

    pub fn is_started(&self) -> bool {
        self.lock().started
    }

    /// When the idle timer fires, if it runs.
    pub fn idle_deadline(&self) -> Option<Instant> {
        self.lock().idle_deadline
    }

    /// Cancels the session as `consumer_idle` if its idle timer has run out.
    pub fn check_idle(&self, now: Instant) {
        if self.lock().idle_deadline.is_some_and(|d| d <= now) {
            self.cancel(CancelReason::ConsumerIdle);
        }
    }

    pub fn set_state(&self, state: SessionState) {
        self.lock().state = state;
    }

    pub fn cancelled(&self) -> Option<CancelReason> {
        self.lock().cancelled
    }

    /// Fixes the output limit; collect mode gets its buffer, which grows as tokens arrive: the
    /// limit is a caller's number (up to `maxTokens`), never an allocation size.
    pub fn begin_output(&self, limit: u64) {
        let mut s = self.lock();
        s.limit = limit;
        if self.mode == OutputMode::Collect {
            s.buffer = Some(Vec::new());
        }
        s.state = SessionState::Running;
    }

    /// The consumer's callback failure, if any.
    pub fn consumer_error(&self) -> Option<String> {
        self.lock().consumer_error.clone()
    }

    /// Ends the session. Precedence: cancelled (unless cleanup failed) > failed > completed.
    pub fn finish(&self, run: Result<MethodResult>, cleanup: Result<()>, metrics: Option<GenerateStats>) {
        let mut s = self.lock();
        let status = match (s.cancelled, run, cleanup) {
            (Some(reason), _, Ok(())) => Status::Cancelled(reason),
            (_, run, Err(cleanup)) => {
                let cleanup_error = Some(cleanup.to_string());
                let (message, cause) = match run {
                    Err(e) => (e.to_string(), e.code()),
                    Ok(_) => (cleanup.to_string(), cleanup.code()),
                };
                Status::Failed(Failure { code: "cleanup_failed", message, cleanup_error, cause: Some(cause) })
            }
            (None, Err(e), Ok(())) => {
                Status::Failed(Failure { code: "execution_failed", message: e.to_string(), cleanup_error: None, cause: Some(e.code()) })
            }
            (None, Ok(result), Ok(())) => Status::Completed(result),
        };
        self.finish_locked(&mut s, status, metrics);
        drop(s);
        self.changed.notify_waiters();
    }

    fn finish_locked(&self, s: &mut Inner, status: Status, metrics: Option<GenerateStats>) {
        if s.state == SessionState::Terminal {
            return;
        }
        s.state = SessionState::Terminal;
        s.idle_deadline = None;
        s.clear_outbox();
        let output = s.buffer.take().map(|mut b| {
            b.truncate(s.committed as usize);
            b.shrink_to_fit();
            b
        });
        s.outcome = Some(Outcome { status, committed_tokens: s.committed, output, metrics });
        self.hooks.terminal();
    }

    /// Moves waiting publications into the queue while there is room.
    fn flush(&self, s: &mut Inner) {
        while let Some(front) = s.outbox.front() {
            let n = front.tokens();
            if s.queue_len() >= self.limits.max_queued_events || s.queued_tokens + n > self.limits.max_queued_tokens {
                break;
            }
            let mut event = s.outbox.pop_front().expect("front exists");
            s.outbox_tokens -= n;
            if let SessionEvent::Committed { sequence, .. } = &mut event {
                *sequence = s.sequence;
                s.sequence += 1;
                s.committed += n as u64;
            }
            s.queued_tokens += n;
            s.ready.push_back(event);
        }
    }

    pub fn output(&self) -> Output<'_> {
        Output { session: self }
    }
}

/// Clears the reading flag however `next_batch` ends.
struct Reading<'a>(&'a Session);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.lock().reading = false;
    }
}

/// Hooks that do nothing, for tests of sessions outside an engine.
#[cfg(test)]
pub(crate) struct NoHooks;

#[cfg(test)]
impl SessionHooks for NoHooks {
    fn wake(&self) {}
    fn terminal(&self) {}
}

#[cfg(test)]
mod tests;
