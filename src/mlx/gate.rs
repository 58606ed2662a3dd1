//! The exit gate. Node runs MLX's static destructors at `process.exit()` while the engine thread
//! may still be inside MLX, which crashed about a quarter of such exits. Every piece of engine MLX
//! work holds the gate; closing it waits for the current step and then keeps MLX untouched for the
//! rest of the process. Closing is idempotent: a second lock attempt would hang the exit.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

static CLOSED: AtomicBool = AtomicBool::new(false);
static GATE: Mutex<()> = Mutex::new(());
static ATEXIT: Once = Once::new();

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
