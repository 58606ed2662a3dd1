//! Who outside the engine still holds a session: the caller's handle (a JavaScript object) and
//! the promises it is waiting on (a caller may keep only `session.result`). A session nobody
//! holds any more is closed (`consumer_closed`), so its run and its KV cache are released even
//! when JavaScript drops it unread or a worker thread is terminated mid-generation.
use std::sync::{Arc, Mutex, MutexGuard};

use super::session::{CancelReason, Session};

/// The caller's handle's hold on a session. Dropping it (the object was collected) closes the
/// session once no promise of it is pending.
pub struct SessionHold {
    session: Arc<Session>,
    by: Arc<Mutex<HeldBy>>,
}

/// Both counts change under one lock: as two atomics, a promise settling on a tokio thread while
/// the object is collected on the JavaScript thread could each read the other's old value, and
/// neither would close the session (x86 lets a store wait in its buffer past a later load).
#[derive(Default)]
struct HeldBy {
    pending: usize,
    dropped: bool,
}

fn lock(by: &Mutex<HeldBy>) -> MutexGuard<'_, HeldBy> {
    by.lock().unwrap_or_else(|e| e.into_inner())
}

impl SessionHold {
    pub fn new(session: Arc<Session>) -> Self {
        SessionHold { session, by: Arc::default() }
    }

    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// A promise is being made. Its hold ends when the returned value drops: when the promise's
    /// future ends, or at once if the promise could not be made (in a worker being terminated,
    /// creating a promise fails; a count raised for it and never lowered kept such sessions
    /// open forever).
    pub fn promise(&self) -> PromiseHold {
        lock(&self.by).pending += 1;
        PromiseHold { session: self.session.clone(), by: self.by.clone() }
    }
}

impl Drop for SessionHold {
    fn drop(&mut self) {
        let unheld = {
            let mut by = lock(&self.by);
            by.dropped = true;
            by.pending == 0
        };
        if unheld {
            self.session.cancel(CancelReason::ConsumerClosed);
        }
    }
}

/// One pending promise's hold on its session (see `SessionHold::promise`).
pub struct PromiseHold {
    session: Arc<Session>,
    by: Arc<Mutex<HeldBy>>,
}

impl Drop for PromiseHold {
    fn drop(&mut self) {
        let unheld = {
            let mut by = lock(&self.by);
            by.pending -= 1;
            by.pending == 0 && by.dropped
        };
        if unheld {
            self.session.cancel(CancelReason::ConsumerClosed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::session::{DeliveryLimits, NoHooks, OutputMode, SessionState};

    /// A session that has not started, so a cancel ends it at once.
    fn session() -> Arc<Session> {
        let limits = DeliveryLimits { idle_timeout: None, max_queued_events: 8, max_queued_tokens: 64, max_top_logprobs: 0 };
        Arc::new(Session::new("s".into(), OutputMode::Stream, limits, Arc::new(NoHooks)))
    }

    fn ended(s: &Session) -> bool {
        s.state() == SessionState::Terminal
    }

    #[test]
    fn a_dropped_handle_closes_its_session_once_its_promises_settle() {
        let s = session();
        let hold = SessionHold::new(s.clone());
        let (a, b) = (hold.promise(), hold.promise());
        drop(hold);
        assert!(!ended(&s), "promises still pending hold it");
        drop(a);
        assert!(!ended(&s));
        drop(b);
        assert!(ended(&s));
        drop(SessionHold::new(session()));
    }

    #[test]
    fn a_promise_that_could_not_be_made_does_not_hold_the_session() {
        // The soak's leak: a worker terminated while a binding made a promise. The hold for it
        // is dropped with the future the promise never ran.
        let s = session();
        let hold = SessionHold::new(s.clone());
        drop(hold.promise());
        assert!(!ended(&s), "the handle still holds it");
        drop(hold);
        assert!(ended(&s));
    }

    #[test]
    fn handle_and_last_promise_dropped_on_two_threads_always_close_it() {
        for _ in 0..2000 {
            let s = session();
            let hold = SessionHold::new(s.clone());
            let promise = hold.promise();
            let t = std::thread::spawn(move || drop(promise));
            drop(hold);
            t.join().unwrap();
            assert!(ended(&s));
        }
    }
}
