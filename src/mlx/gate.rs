//! The exit gate. Node runs MLX's static destructors at `process.exit()` while the engine thread
//! may still be inside MLX, which crashed about a quarter of such exits. Every piece of engine MLX
//! work holds the gate; closing it waits for the current step, then for the evaluations that step
//! left running on MLX's stream (decode is pipelined), and keeps MLX untouched for the rest of the
//! process. Closing is idempotent: a second lock attempt would hang the exit.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, Once};
use std::time::Duration;

static CLOSED: AtomicBool = AtomicBool::new(false);
static GATE: Mutex<()> = Mutex::new(());
static ATEXIT: Once = Once::new();
/// Set while evaluations the engine started may still be running on MLX's worker.
static IN_FLIGHT: AtomicBool = AtomicBool::new(false);
static QUIESCED: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());
/// How long an exit waits for in-flight MLX work (one decode step takes milliseconds).
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(5);

/// Enters the gate; `None` once it is closed, after which the caller must not touch MLX again.
pub fn enter() -> Option<MutexGuard<'static, ()>> {
    if CLOSED.load(Ordering::Acquire) {
        return None;
    }
    let guard = GATE.lock().unwrap_or_else(|e| e.into_inner());
    if CLOSED.load(Ordering::Acquire) {
        // The closer holds the lock forever; this branch only runs if it lost a race with us.
        return None;
    }
    Some(guard)
}

/// Closes the gate for good: waits for the MLX work in flight, then keeps the lock.
pub fn close() {
    if CLOSED.swap(true, Ordering::AcqRel) {
        return;
    }
    std::mem::forget(GATE.lock().unwrap_or_else(|e| e.into_inner()));
    if IN_FLIGHT.load(Ordering::Acquire) {
        let (lock, cv) = &QUIESCED;
        let done = lock.lock().unwrap_or_else(|e| e.into_inner());
        let _ = cv.wait_timeout_while(done, QUIESCE_TIMEOUT, |done| !*done);
    }
}

/// The engine records whether it may have left evaluations running.
pub fn set_in_flight(v: bool) {
    IN_FLIGHT.store(v, Ordering::Release);
}

/// For the engine thread once the gate is closed: waits for its own in-flight MLX work (`sync`),
/// tells the closer, and never returns, so nothing it owns is dropped after MLX's teardown.
pub fn park_engine(sync: impl FnOnce()) -> ! {
    sync();
    let (lock, cv) = &QUIESCED;
    *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
    cv.notify_all();
    loop {
        std::thread::park();
    }
}

pub fn is_closed() -> bool {
    CLOSED.load(Ordering::Acquire)
}

extern "C" fn close_at_exit() {
    close();
}

/// Registers `close` with `atexit`. Call it from the engine thread after MLX has been used once,
/// so the handler runs before the destructors of MLX's lazily created statics.
pub fn close_at_process_exit() {
    ATEXIT.call_once(|| unsafe {
        libc::atexit(close_at_exit);
    });
}
