//! The engine side of a session: what a method writes through while it is stepped. Borrowed
//! mutably for one step, so publications cannot overlap.
use std::sync::MutexGuard;

use super::{CancelReason, Inner, OutputMode, Session, SessionEvent, SessionState};
use crate::error::{Error, Result};
use crate::sample::logprobs::TokenLogprobs;

/// How a method publishes: borrowed mutably for one step, so a method cannot publish from inside
/// its own publication, and handed out only while the session runs.
pub struct Output<'a> {
    pub(super) session: &'a Session,
}

fn unless_cancelled(reason: Option<CancelReason>) -> Result<()> {
    match reason {
        Some(r) => Err(Error::Cancelled(r.as_str())),
        None => Ok(()),
    }
}

impl Output<'_> {
    /// The consumer asked for no more output (callback returned `false` or threw; `finish_output`).
    pub fn stopped(&self) -> bool {
        let s = self.session.lock();
        s.output_stopped || s.output_finished
    }

    /// `Cancelled` once the session is cancelled: a long step asks between its parts.
    pub fn check_cancelled(&self) -> Result<()> {
        unless_cancelled(self.session.cancelled())
    }

    fn check_live(&self, s: &Inner) -> Result<()> {
        unless_cancelled(s.cancelled)?;
        if s.state != SessionState::Running {
            return Err(Error::Protocol("publication outside method execution".into()));
        }
        Ok(())
    }

    /// Commits tokens (and their logprobs), checked in mlx-bun's order. Token ids are `u32`, so
    /// the last check (integers in [0, 2³²−1]) holds by type.
    pub fn commit(&mut self, ids: &[u32], logprobs: Option<&[TokenLogprobs]>) -> Result<()> {
        let session = self.session;
        let mut s = session.lock();
        self.check_live(&s)?;
        if s.output_finished {
            return Ok(());
        }
        if s.output_stopped {
            return Err(Error::Protocol("method published after the consumer requested a stop".into()));
        }
        if ids.len() as u64 > s.limit - (s.committed + s.outbox_tokens as u64).min(s.limit) {
            return Err(Error::Protocol("method exceeded planned output limit".into()));
        }
        if let Some(lp) = logprobs {
            if lp.len() != ids.len() {
                return Err(Error::Protocol("logprobs must align with committed tokens".into()));
            }
            if lp.iter().any(|t| t.top.len() > session.limits.max_top_logprobs) {
                return Err(Error::Protocol("top logprobs exceed session delivery capacity".into()));
            }
        }
        if session.mode == OutputMode::Collect {
            if logprobs.is_some() {
                return Err(Error::Protocol("token logprobs require stream consumption".into()));
            }
            s.buffer.get_or_insert_with(Vec::new).extend_from_slice(ids);
            s.committed += ids.len() as u64;
            return Ok(());
        }
        // Chunks of at most maxQueuedTokens; an empty commit is still one event.
        let chunk = session.limits.max_queued_tokens.max(1);
        let mut offset = 0;
        loop {
            let end = (offset + chunk).min(ids.len());
            let token_ids = ids[offset..end].to_vec();
            let logprobs = logprobs.map(|lp| lp[offset..end].to_vec());
            s.outbox_tokens += token_ids.len();
            s.outbox.push_back(SessionEvent::Committed { sequence: 0, token_ids, logprobs });
            offset = end;
            if offset >= ids.len() {
                break;
            }
        }
        self.publish(s);
        Ok(())
    }

    /// Reports prompt progress; queued in stream mode only.
    pub fn progress(&mut self, completed: f64, total: Option<f64>) -> Result<()> {
        let session = self.session;
        let mut s = session.lock();
        self.check_live(&s)?;
        if !completed.is_finite() || completed < 0.0 || total.is_some_and(|t| !t.is_finite() || t < completed) {
            return Err(Error::Protocol("invalid progress".into()));
        }
        if session.mode != OutputMode::Stream || s.output_finished {
            return Ok(());
        }
        s.outbox.push_back(SessionEvent::Progress { completed, total });
        self.publish(s);
        Ok(())
    }

    fn publish(&self, mut s: MutexGuard<'_, Inner>) {
        let session = self.session;
        session.flush(&mut s);
        if !s.outbox.is_empty() {
            s.producer_waiting = true;
            // A stream producer waiting for room keeps the idle timer running.
            if session.mode == OutputMode::Stream {
                session.arm_idle(&mut s);
            }
        }
        drop(s);
        session.changed.notify_waiters();
    }
}
