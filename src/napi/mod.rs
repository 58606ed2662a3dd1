//! The JavaScript boundary: conversions between JS values and the Rust core, nothing else.
//! Errors cross as `"CODE: message"`; index.js turns the prefix into `err.code`.
mod convert;
mod fit;
mod hub;
mod model;
mod plan;
mod runtime;
mod server;
mod session;
mod tokenizer;
mod tools;

use std::sync::Once;

use crate::error::Error;
use crate::mlx::gate;

pub(crate) fn js_error(e: Error) -> napi::Error {
    napi::Error::from_reason(format!("{}: {e}", e.code()))
}

/// Called by index.js each time an environment loads the addon. Node runs env cleanup hooks on
/// a natural exit (and exit handlers on `process.exit()`, registered by the engine); both
/// close the exit gate so MLX is idle while its statics are destroyed. Only the main thread's
/// environment gets the hook: a worker thread's ends long before the process does, and closing
/// the gate then would stall the engine for every other thread.
#[napi_derive::napi(catch_unwind)]
pub fn install_exit_hook(env: napi::Env, is_main_thread: bool) -> napi::Result<()> {
    static HOOK: Once = Once::new();
    let mut result = Ok(());
    if is_main_thread {
        HOOK.call_once(|| {
            result = env.add_env_cleanup_hook((), |_| {
                gate::close();
            }).map(|_| ());
        });
    }
    result
}
