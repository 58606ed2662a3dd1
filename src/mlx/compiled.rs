//! MLX-compiled functions kept for the life of the thread that uses them.
//!
//! Why: on MLX's CPU backend every node of a step's graph costs several microseconds to schedule
//! (a task queued to the stream's thread, a wake-up, a buffer set), whatever its size, and a
//! decode step of a 135M model has thousands of them; MLX's own CPU fallbacks of RMSNorm and RoPE
//! are ten and ~25 nodes a call. `compile` fuses each chain of elementwise operations into one
//! node. Fused kernels apply the same operations in the same order and dtypes (MLX's CPU SIMD
//! width is one lane on x86_64, and its JIT compiler gets no FMA flags), so results are unchanged
//! bit for bit, but for constants: MLX prints them into the kernel's C++ with 7 significant
//! digits, so a function whose constants are not short decimals takes them as inputs (the
//! layers' tests check RMSNorm and RoPE against MLX's `fast::` ops, the model tests against
//! mlx-lm). Each fused kernel is built with g++ on its first use on a machine (~0.8 s, then kept
//! in `$TMPDIR/mlx`); without g++ MLX runs the functions unfused.
//!
//! A function compiled with mlx-rs' `compile` is traced again for each new instance, so each is
//! kept here under a key naming it with the constants it captures, and called again from there.
//! Functions traced per shape (`shapeless: false`) are only compiled for decode steps (`compiles`):
//! those repeat the same few shapes, while prompts bring new lengths, each of which would be one
//! more trace kept for the life of the thread (and a prompt's many tokens share each node's cost).
use std::cell::RefCell;
use std::collections::HashMap;

use mlx_rs::error::Exception;
use mlx_rs::transforms::compile::compile;
use mlx_rs::Array;

/// A function of some arrays (inputs) to some arrays (outputs).
type Fun = Box<dyn for<'a> FnMut(&'a [Array]) -> Result<Vec<Array>, Exception>>;

/// The function's name and the bits of the constants it captures.
pub type Key = (&'static str, [u32; 4]);

thread_local! {
    static KEPT: RefCell<HashMap<Key, Fun>> = RefCell::new(HashMap::new());
}

/// The most rows (elements over the last axis) an input of a per-shape function is compiled for.
const MAX_ROWS: usize = 512;

/// Whether a per-shape compiled function is called for `x`: one position per sequence (its
/// second-to-last axis, [B, 1, D] or [B, heads, 1, D]), as in a decode step, and a bounded batch.
pub fn compiles(x: &Array) -> bool {
    let s = x.shape();
    let last = s.last().copied().unwrap_or(1).max(1) as usize;
    s.len() >= 2 && s[s.len() - 2] == 1 && x.size() / last <= MAX_ROWS
}

/// `f(inputs)`, compiled by MLX the first time `key` is called on this thread and kept. `f` must
/// depend on nothing but its inputs and the constants `key` names. `shapeless`: one trace for
/// every shape (only for functions whose graph does not depend on their inputs' shapes).
pub fn call<F>(key: Key, shapeless: bool, inputs: &[Array], f: F) -> Result<Vec<Array>, Exception>
where
    F: FnMut(&[Array]) -> Result<Vec<Array>, Exception> + 'static,
{
    // Taken out while it runs: tracing `f` may call other kept functions.
    let kept = KEPT.with(|k| k.borrow_mut().remove(&key));
    let mut fun: Fun = match kept {
        Some(fun) => fun,
        None => Box::new(compile(f, shapeless)),
    };
    let out = fun(inputs);
    KEPT.with(|k| k.borrow_mut().insert(key, fun));
    out
}

/// The one output of `call`.
pub fn call1<F>(key: Key, shapeless: bool, inputs: &[Array], f: F) -> Result<Array, Exception>
where
    F: FnMut(&[Array]) -> Result<Vec<Array>, Exception> + 'static,
{
    call(key, shapeless, inputs, f)?.into_iter().next().ok_or_else(|| Exception::custom(format!("compiled {} returned nothing", key.0)))
}
