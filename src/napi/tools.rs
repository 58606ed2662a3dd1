//! The CLI, model download and conversion, for JavaScript.
use napi_derive::napi;

use super::js_error;
use crate::model::convert::ConvertOptions;
use crate::model::weights::DType;
use crate::error::{catch_panic, Error};
use crate::pull;

/// Runs the `mlx-bun` command line in this process; resolves with its exit code.
#[napi]
pub async fn run_cli(args: Vec<String>) -> napi::Result<i32> {
    blocking(move || Ok(crate::cli::run(args))).await
}

/// Runs blocking work (downloads, waits on the engine) off the JS thread and tokio's workers.
/// It never touches MLX itself: that stays on the engine thread. A panic in it rejects with
/// `INTERNAL_ERROR`.
pub(super) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> crate::error::Result<T> + Send + 'static) -> napi::Result<T> {
    tokio::task::spawn_blocking(|| catch_panic(work))
        .await
        .map_err(|e| js_error(Error::Internal(e.to_string())))?
        .map_err(js_error)
}

#[napi(object)]
pub struct PullOptions {
    /// Instead of `$MLX_BUN_HOME` (default `~/.cache/mlx-bun`).
    pub home: Option<String>,
    /// Draw a progress bar on stderr.
    pub progress: Option<bool>,
}

fn home(h: Option<String>) -> std::path::PathBuf {
    h.map_or_else(pull::home, std::path::PathBuf::from)
}

/// Downloads the default model if needed; resolves with its path.
#[napi]
pub async fn pull_default_model(options: Option<PullOptions>) -> napi::Result<String> {
    let o = options.unwrap_or(PullOptions { home: None, progress: None });
    let home = home(o.home);
    blocking(move || pull::pull_default(&home, o.progress.unwrap_or(false)).map(|p| p.display().to_string())).await
}

#[napi(catch_unwind)]
pub fn default_model_path(home_dir: Option<String>) -> String {
    pull::default_model_path(&home(home_dir)).display().to_string()
}

#[napi(object)]
pub struct ConvertOptionsJs {
    /// `'f32' | 'f16' | 'bf16'`
    pub dtype: Option<String>,
    pub q_bits: Option<i32>,
    pub q_group_size: Option<i32>,
}

/// Writes the model at `path` as an HF/MLX folder at `out`.
#[napi]
pub async fn convert(path: String, out: String, options: Option<ConvertOptionsJs>) -> napi::Result<String> {
    let o = options.unwrap_or(ConvertOptionsJs { dtype: None, q_bits: None, q_group_size: None });
    let dtype = match o.dtype.as_deref() {
        None => None,
        Some("f32") => Some(DType::F32),
        Some("f16") => Some(DType::F16),
        Some("bf16") => Some(DType::BF16),
        Some(other) => return Err(js_error(Error::option("dtype", format!("must be f32, f16 or bf16; got {other}")))),
    };
    let opts = ConvertOptions { dtype, q_bits: o.q_bits, q_group_size: o.q_group_size };
    blocking(move || crate::cli::convert_model(std::path::Path::new(&path), std::path::Path::new(&out), opts, false).map(|_| out)).await
}
