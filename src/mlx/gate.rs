//! The exit gate. Node runs MLX's static destructors at `process.exit()` while the engine thread
//! may still be inside MLX, which crashed about a quarter of such exits. Every piece of engine MLX
//! work holds the gate; closing it waits for the current step, then for the evaluations that step
//! left running on MLX's streams (decode is pipelined), and keeps MLX untouched for the rest of the
//! process. Closing is idempotent: a second lock attempt would hang the exit.
//!
//! The wait is bounded: a prefill stops at its next layer once the gate is closed, but one layer
//! (or a step that is not layered, such as a model load) can take seconds on a CPU, and an exit
//! must not hang that long. Past the bound, an exit on glibc ends the process with `_exit(status)`, which
//! skips the static destructors that would race the running step; elsewhere the exit goes on.
//!
//! The gate also makes `fork()` safe (Node's `child_process`). OpenBLAS's fork handler stops its
//! worker threads; if MLX's worker is inside a threaded BLAS call at that moment, the call waits
//! for them forever and the engine hangs. So before a fork the engine drains its streams and
//! waits outside MLX until the fork is done: between steps, or between the parts of a long step.
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, Once, OnceLock, TryLockError};
use std::time::{Duration, Instant};

static CLOSED: AtomicBool = AtomicBool::new(false);
static GATE: Mutex<()> = Mutex::new(());
static ATEXIT: Once = Once::new();
/// Set while evaluations the engine started may still be running on MLX's worker.
static IN_FLIGHT: AtomicBool = AtomicBool::new(false);
static QUIESCED: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());
/// Set from just before a fork until just after it.
static FORKING: AtomicBool = AtomicBool::new(false);
/// Set while the engine waits inside a long step, outside MLX, for a fork to end.
static PAUSED: AtomicBool = AtomicBool::new(false);
/// Signalled when the engine has drained its streams or paused for a fork, and when the fork is done.
static FORK: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
/// Set once the closer holds the gate.
static HELD: AtomicBool = AtomicBool::new(false);
/// Until when closing waits for the engine, fixed by the first close.
static DEADLINE: OnceLock<Instant> = OnceLock::new();
/// How long an exit waits for in-flight MLX work (one decode step takes milliseconds, one layer
/// of a long prefill chunk up to seconds on a CPU).
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(3);

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

/// Closes the gate for good: waits, until the first close's deadline, for the engine's current
/// step and the MLX work it left in flight, keeping the lock. Returns whether MLX is now idle.
pub fn close() -> bool {
    let deadline = *DEADLINE.get_or_init(|| Instant::now() + QUIESCE_TIMEOUT);
    CLOSED.store(true, Ordering::Release);
    let (lock, cv) = &QUIESCED;
    let mut quiesced = lock.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        // The engine parks (and sets QUIESCED) at its first gate entry after the close.
        if *quiesced {
            return true;
        }
        if !HELD.load(Ordering::Acquire) {
            match GATE.try_lock() {
                Ok(g) => take(g),
                Err(TryLockError::Poisoned(e)) => take(e.into_inner()),
                Err(TryLockError::WouldBlock) => {}
            }
        }
        if HELD.load(Ordering::Acquire) && !IN_FLIGHT.load(Ordering::Acquire) {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        // Polls the lock: the engine signals QUIESCED, but not the end of its step.
        let wait = (deadline - now).min(Duration::from_millis(2));
        quiesced = cv.wait_timeout(quiesced, wait).unwrap_or_else(|e| e.into_inner()).0;
    }
}

fn take(guard: MutexGuard<'static, ()>) {
    std::mem::forget(guard);
    HELD.store(true, Ordering::Release);
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

/// For the engine between the parts of a long step (a prefill's layers): when a fork is about to
/// happen, waits for its own MLX work (`sync`) and lets the fork go ahead while it keeps the
/// gate, so a spawn waits for one part instead of the whole step.
pub fn pause_point(sync: impl Fn()) {
    if !FORKING.load(Ordering::Acquire) {
        return;
    }
    sync();
    let (lock, cv) = &FORK;
    let held = lock.lock().unwrap_or_else(|e| e.into_inner());
    PAUSED.store(true, Ordering::Release);
    cv.notify_all();
    drop(cv.wait_while(held, |_| FORKING.load(Ordering::Acquire)));
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
    let Some(mut guard) = gate_or_pause() else {
        // The engine holds the gate, paused outside MLX until the fork is done.
        return;
    };
    if IN_FLIGHT.load(Ordering::Acquire) {
        // The engine drains its streams at its next `enter`, which needs the gate.
        drop(guard);
        let (lock, cv) = &FORK;
        let held = lock.lock().unwrap_or_else(|e| e.into_inner());
        drop(cv.wait_timeout_while(held, QUIESCE_TIMEOUT, |_| IN_FLIGHT.load(Ordering::Acquire)));
        guard = GATE.lock().unwrap_or_else(|e| e.into_inner());
    }
    FORK_HOLD.with(|h| *h.borrow_mut() = Some(guard));
}

/// The gate once the engine is between steps, or `None` once it has paused inside a long one.
fn gate_or_pause() -> Option<MutexGuard<'static, ()>> {
    let (lock, cv) = &FORK;
    let mut held = lock.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        match GATE.try_lock() {
            Ok(g) => return Some(g),
            Err(TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(TryLockError::WouldBlock) if PAUSED.load(Ordering::Acquire) => return None,
            Err(TryLockError::WouldBlock) => {}
        }
        // The engine signals a pause, but not the end of a step: the lock is polled.
        held = cv.wait_timeout(held, Duration::from_millis(2)).unwrap_or_else(|e| e.into_inner()).0;
    }
}

/// `pthread_atfork` parent and child: release the gate and let the engine go on.
extern "C" fn after_fork() {
    FORK_HOLD.with(|h| h.borrow_mut().take());
    // Cleared here, not by the engine, so that a next fork never sees a stale pause.
    PAUSED.store(false, Ordering::Release);
    FORKING.store(false, Ordering::Release);
    let (lock, cv) = &FORK;
    let _held = lock.lock().unwrap_or_else(|e| e.into_inner());
    cv.notify_all();
}

pub fn is_closed() -> bool {
    CLOSED.load(Ordering::Acquire)
}

/// On glibc the exit handler learns the exit status, so an exit that cannot wait for MLX any
/// longer ends the process at once with that status.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" fn close_at_exit(status: libc::c_int, _: *mut libc::c_void) {
    if !close() {
        // SAFETY: `_exit` ends the process without running destructors, which is the point.
        unsafe { libc::_exit(status) }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
extern "C" fn close_at_exit() {
    close();
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe fn register_exit_handler() {
    extern "C" {
        fn on_exit(f: extern "C" fn(libc::c_int, *mut libc::c_void), arg: *mut libc::c_void) -> libc::c_int;
    }
    on_exit(close_at_exit, std::ptr::null_mut());
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
unsafe fn register_exit_handler() {
    libc::atexit(close_at_exit);
}

/// Registers `close` as an exit handler, and the fork handlers. Call it from the engine thread
/// after MLX has been used once, so the exit handler runs before the destructors of MLX's lazily
/// created statics, and the fork handlers before OpenBLAS's.
pub fn close_at_process_exit() {
    ATEXIT.call_once(|| unsafe {
        register_exit_handler();
        libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork));
    });
}
