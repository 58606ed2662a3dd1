//! Models on disk for JavaScript: the `Registry` index and `downloadModel` (src/hub).
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use napi::bindgen_prelude::{Either, FnArgs, PromiseRaw};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::{Env, Status};
use napi_derive::napi;
use serde_json::Value;

use super::js_error;
use super::tools::blocking;
use crate::error::Error;
use crate::hub::download::{download_model, DownloadOptions, FileProgress};
use crate::hub::registry::{default_index, Filter, Registry};
use crate::hub::hub_dir;
use crate::pull;

/// `new Registry(options)` (index.js turns mlx-bun's `new Registry(dbPath)` into `{ dbPath }`).
#[napi(object)]
pub struct RegistryOptions {
    /// The index file; `":memory:"` keeps none (default `$MLX_BUN_HOME/registry.json`).
    pub db_path: Option<String>,
    /// The hub cache `scan()` reads by default (default `$HF_HUB_CACHE`, else `$HF_HOME/hub`).
    pub hub_dir: Option<String>,
    /// Instead of `$MLX_BUN_HOME`: its `models/` folder is scanned too.
    pub home: Option<String>,
}

#[napi(object)]
pub struct ListFilter {
    pub vision: Option<bool>,
    pub max_bytes: Option<f64>,
    pub query: Option<String>,
}

/// `resolve()`'s answer when several repositories match (index.js throws `AMBIGUOUS_MODEL`).
#[napi(object)]
pub struct Ambiguous {
    pub message: String,
    pub candidates: Vec<String>,
}

#[napi]
pub struct NativeRegistry {
    inner: Arc<Registry>,
}

fn to_filter(f: Option<ListFilter>) -> napi::Result<Filter> {
    let Some(f) = f else { return Ok(Filter::default()) };
    if let Some(max) = f.max_bytes.filter(|m| m.is_nan() || *m < 0.0) {
        return Err(js_error(Error::option("maxBytes", format!("must be a number of bytes >= 0, got {max}"))));
    }
    Ok(Filter { vision: f.vision, max_bytes: f.max_bytes, query: f.query })
}

fn records<T: serde::Serialize>(v: T) -> napi::Result<Value> {
    serde_json::to_value(v).map_err(|e| js_error(Error::Internal(e.to_string())))
}

#[napi]
impl NativeRegistry {
    /// Reads the index file if there is one (small); scanning is `scan()`'s work.
    #[napi(constructor, catch_unwind)]
    pub fn new(options: RegistryOptions) -> Self {
        let home = options.home.map_or_else(pull::home, PathBuf::from);
        let index = match options.db_path.as_deref() {
            Some(":memory:") => None,
            Some(p) => Some(PathBuf::from(p)),
            None => Some(default_index(&home)),
        };
        let hub = options.hub_dir.map_or_else(hub_dir, PathBuf::from);
        NativeRegistry { inner: Arc::new(Registry::open(index, hub, home)) }
    }

    /// Rescans off the JS thread; resolves with the number of models found.
    #[napi(catch_unwind)]
    pub fn scan<'env>(&self, env: &'env Env, hub_dir: Option<String>) -> napi::Result<PromiseRaw<'env, u32>> {
        let inner = self.inner.clone();
        env.spawn_future(blocking(move || inner.scan(hub_dir.as_deref().map(Path::new)).map(|n| n as u32)))
    }

    #[napi(catch_unwind)]
    pub fn list(&self, filter: Option<ListFilter>) -> napi::Result<Value> {
        records(self.inner.list(&to_filter(filter)?))
    }

    #[napi(catch_unwind)]
    pub fn list_canonical(&self, filter: Option<ListFilter>) -> napi::Result<Value> {
        records(self.inner.list_canonical(&to_filter(filter)?))
    }

    #[napi(catch_unwind)]
    pub fn resolve(&self, query: String) -> napi::Result<Either<Value, Ambiguous>> {
        match self.inner.resolve(&query) {
            Ok(m) => records(m).map(Either::A),
            Err(Error::AmbiguousModel { query, candidates }) => {
                let message = Error::AmbiguousModel { query, candidates: candidates.clone() }.to_string();
                Ok(Either::B(Ambiguous { message, candidates }))
            }
            Err(e) => Err(js_error(e)),
        }
    }
}

#[napi(object)]
pub struct DownloadOptionsJs {
    pub revision: Option<String>,
    pub cache_dir: Option<String>,
    pub endpoint: Option<String>,
    /// Absent: `$HF_TOKEN` or the saved login; `""` (index.js's `null`): no token.
    pub token: Option<String>,
    pub all_files: Option<bool>,
}

/// `onProgress(file, received, total)`; returns `false` once the caller's callback has thrown.
type ProgressFn = ThreadsafeFunction<FnArgs<(String, f64, f64)>, bool, FnArgs<(String, f64, f64)>, Status, false>;

/// Downloads off the JS thread; resolves with the snapshot folder. Progress reaches JavaScript
/// through a non-blocking queue, so a busy JS thread never slows the download; a callback that
/// threw stops it at the next report.
#[napi]
pub async fn download_model_native(repo_id: String, options: DownloadOptionsJs, on_progress: Option<ProgressFn>) -> napi::Result<String> {
    let defaults = DownloadOptions::default();
    let opts = DownloadOptions {
        revision: options.revision.unwrap_or(defaults.revision),
        cache_dir: options.cache_dir.map_or(defaults.cache_dir, PathBuf::from),
        endpoint: options.endpoint.unwrap_or(defaults.endpoint),
        token: match options.token {
            None => defaults.token,
            Some(t) => Some(t).filter(|t| !t.is_empty()),
        },
        all_files: options.all_files.unwrap_or(false),
    };
    blocking(move || {
        let stop = Arc::new(AtomicBool::new(false));
        let mut report = |p: &FileProgress| {
            if let Some(f) = &on_progress {
                let stop = stop.clone();
                f.call_with_return_value((p.file.to_owned(), p.received as f64, p.total as f64).into(), ThreadsafeFunctionCallMode::NonBlocking, move |kept_going, _| {
                    if !matches!(kept_going, Ok(true)) {
                        stop.store(true, Ordering::Relaxed);
                    }
                    Ok(())
                });
            }
            !stop.load(Ordering::Relaxed)
        };
        download_model(&repo_id, &opts, &mut report).map(|p| p.display().to_string())
    })
    .await
}
