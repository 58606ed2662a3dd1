//! The exit gate. Node runs MLX's static destructors at `process.exit()` while the engine thread
//! may still be inside MLX, which crashed about a quarter of such exits. Every piece of engine MLX
//! work holds the gate; closing it waits for the current step, then for the evaluations that step
//! left running on MLX's stream (decode is pipelined), and keeps MLX untouched for the rest of the
//! process. Closing is idempotent: a second lock attempt would hang the exit.
//!
//! The gate also makes `fork()` safe (Node's `child_process`). OpenBLAS's fork handler stops its
//! worker threads; if MLX's worker is inside a threaded BLAS call at that moment, the call waits
//! for them forever and the engine hangs. So before a fork the engine drains its stream and
//! waits outside MLX until the fork is done.
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, Once};
use std::time::Duration;

static CLOSED: AtomicBool = AtomicBool::new(false);
static GATE: Mutex<()> = Mutex::new(());
static ATEXIT: Once = Once::new();
/// Set while evaluations the engine started may still be running on MLX's worker.
static IN_FLIGHT: AtomicBool = AtomicBool::new(false);
static QUIESCED: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());
/// Set from just before a fork until just after it.
static FORKING: AtomicBool = AtomicBool::new(false);
/// Signalled when the engine has drained its stream for a fork, and when the fork is done.
static FORK: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
/// How long an exit waits for in-flight MLX work (one decode step takes milliseconds).
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(5);

/// Enters the gate; `None` once it is closed, after which the caller must not touch MLX again.
/// `sync` waits for the caller's in-flight MLX work; it runs when a fork is about to happen.
pub fn enter(sync: impl Fn()) -> Option<MutexGuard<'static, ()>> {
    loop {
        if CLOSED.load(Ordering::Acquire) {
            return None;
        }
        let guard = GATE.lock().unwrap_or_else(|e| e.into_inner());
        if CLOSED.load(Ordering::Acquire) {
            // The closer holds the lock forever; this branch only runs if it lost a race with us.
            return None;
        }
        if !FORKING.load(Ordering::Acquire) {
            return Some(guard);
        }
        sync();
        IN_FLIGHT.store(false, Ordering::Release);
        drop(guard);
        let (lock, cv) = &FORK;
        let held = lock.lock().unwrap_or_else(|e| e.into_inner());
        cv.notify_all();
        drop(cv.wait_while(held, |_| FORKING.load(Ordering::Acquire)));
    }
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

thread_local! {
    /// The gate, held by the forking thread across `fork()`.
    static FORK_HOLD: RefCell<Option<MutexGuard<'static, ()>>> = const { RefCell::new(None) };
}

/// `pthread_atfork` prepare: once no MLX work of the engine is running, hold the gate through
/// the fork. Registered after OpenBLAS's handler, so it runs first.
extern "C" fn before_fork() {
    if CLOSED.load(Ordering::Acquire) {
        return;
    }
    FORKING.store(true, Ordering::Release);
    let mut guard = GATE.lock().unwrap_or_else(|e| e.into_inner());
    if IN_FLIGHT.load(Ordering::Acquire) {
        // The engine drains its stream at its next `enter`, which needs the gate.
        drop(guard);
        let (lock, cv) = &FORK;
        let held = lock.lock().unwrap_or_else(|e| e.into_inner());
        drop(cv.wait_timeout_while(held, QUIESCE_TIMEOUT, |_| IN_FLIGHT.load(Ordering::Acquire)));
        guard = GATE.lock().unwrap_or_else(|e| e.into_inner());
    }
    FORK_HOLD.with(|h| *h.borrow_mut() = Some(guard));
}

/// `pthread_atfork` parent and child: release the gate and let the engine go on.
extern "C" fn after_fork() {
    FORK_HOLD.with(|h| h.borrow_mut().take());
    FORKING.store(false, Ordering::Release);
    let (lock, cv) = &FORK;
    let _held = lock.lock().unwrap_or_else(|e| e.into_inner());
    cv.notify_all();
}

pub fn is_closed() -> bool {
    CLOSED.load(Ordering::Acquire)
}

extern "C" fn close_at_exit() {
    close();
}

/// Registers `close` with `atexit`, and the fork handlers. Call it from the engine thread after
/// MLX has been used once, so the exit handler runs before the destructors of MLX's lazily
/// created statics, and the fork handlers before OpenBLAS's.
pub fn close_at_process_exit() {
    ATEXIT.call_once(|| unsafe {
        libc::atexit(close_at_exit);
        libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork));
    });
}
