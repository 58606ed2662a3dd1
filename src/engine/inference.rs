//! `InferenceEngine`, the engine JavaScript holds: sessions over one model (or a scripted method)
//! under its admission limits, and `close()`, which cancels every session. The sessions
//! themselves are stepped by the engine thread.
use std::sync::atomic::{AtomicUsize, AtomicU64, Ordering};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

pub use super::admission::{Admission, EngineOptions, EngineStats, PrefixCacheStats, DEFAULT_PREFIX_CACHE_BYTES};
use super::caller_cache::{CacheLease, CacheState};
use super::models::ModelId;
use super::placement::{capabilities, ExecutionCapabilities};
pub use super::request::{MethodSpec, PrefixKey, Source};
use super::session::{CancelReason, DeliveryLimits, OutputMode, Session, SessionHooks, SessionState};
use super::thread::EngineThread;
use crate::error::{Error, Result};
use crate::sample::validate_prompt;

/// Sessions alive (not yet terminal) in the whole process.
static LIVE: AtomicUsize = AtomicUsize::new(0);
static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

pub fn live_sessions() -> usize {
    LIVE.load(Ordering::Acquire)
}

/// Every session opened and not yet seen ended, for `live_session_states`; pruned as sessions
/// open, so it stays near the live count.
static OPENED: Mutex<Vec<Weak<Session>>> = Mutex::new(Vec::new());

/// The sessions not yet terminal, each described (`Session::describe`), and how many more the
/// live count holds that nothing references any more (dropped before they ended).
pub fn live_session_states() -> (Vec<serde_json::Value>, usize) {
    let opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    let states: Vec<serde_json::Value> = opened
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|s| s.state() != SessionState::Terminal)
        .map(|s| s.describe())
        .collect();
    let lost = live_sessions().saturating_sub(states.len());
    (states, lost)
}

pub struct InferenceEngine {
    pub source: Source,
    pub admission: Arc<Admission>,
    sessions: Mutex<Vec<Weak<Session>>>,
}

impl InferenceEngine {
    pub fn new(source: Source, options: EngineOptions) -> Arc<Self> {
        Arc::new(InferenceEngine { source, admission: Admission::new(options), sessions: Mutex::new(Vec::new()) })
    }

    pub fn options(&self) -> &EngineOptions {
        &self.admission.options
    }

    pub fn is_closed(&self) -> bool {
        self.admission.is_closed()
    }

    pub fn stats(&self) -> EngineStats {
        self.admission.stats()
    }

    /// What this engine can do, as `resolveExecution` takes it: a model's rows batch
    /// continuously; a scripted method's sessions step alone.
    pub fn capabilities(&self) -> ExecutionCapabilities {
        match self.source {
            Source::Model { checkpoints, .. } => capabilities(true, checkpoints),
            Source::Script(_) => capabilities(false, false),
        }
    }

    /// Opens a session for a validated request. Stream sessions start on their first read.
    /// `cancelled`: the caller's abort signal had already fired, so nothing may run.
    pub fn open(self: &Arc<Self>, spec: MethodSpec, mode: OutputMode, cancelled: bool) -> Result<Arc<Session>> {
        if self.is_closed() {
            return Err(Error::EngineClosed);
        }
        if let (MethodSpec::Generate { prompt, opts, draft, .. }, Source::Model { vocab_size, .. }) = (&spec, &self.source) {
            validate_prompt(prompt, *vocab_size)?;
            opts.validate(*vocab_size)?;
            if let Some(d) = draft {
                d.check(*vocab_size)?;
            }
        }
        self.admission.admit_session()?;
        let o = self.options();
        let limits = DeliveryLimits {
            idle_timeout: o.idle_timeout,
            max_queued_events: o.max_queued_events,
            max_queued_tokens: o.max_queued_tokens,
            max_top_logprobs: o.max_top_logprobs,
        };
        LIVE.fetch_add(1, Ordering::AcqRel);
        let id = format!("s{}", NEXT_SESSION.fetch_add(1, Ordering::Relaxed));
        let hooks: Arc<dyn SessionHooks> = Arc::new(Hooks(self.clone()));
        let session = Arc::new(Session::new(id, mode, limits, hooks));
        {
            let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
            if opened.len() >= 64 + 2 * live_sessions() {
                opened.retain(|w| w.upgrade().is_some_and(|s| s.state() != SessionState::Terminal));
            }
            opened.push(Arc::downgrade(&session));
        }
        {
            let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            sessions.retain(|s| s.strong_count() > 0);
            sessions.push(Arc::downgrade(&session));
        }
        if cancelled {
            session.cancel(CancelReason::Requested);
        }
        self.admission.arriving_one();
        EngineThread::get().open(self.admission.clone(), session.clone(), spec);
        Ok(session)
    }

    /// Later `open` calls fail with `ENGINE_CLOSED`, from this moment on (`close` does the rest).
    pub fn mark_closed(&self) {
        self.admission.mark_closed();
    }

    /// Cancels every session with `engine_closed`; later `open` calls fail. Returns the sessions
    /// still alive, so callers can wait for their outcomes.
    pub fn close(&self) -> Vec<Arc<Session>> {
        self.mark_closed();
        let sessions: Vec<Arc<Session>> =
            self.sessions.lock().unwrap_or_else(|e| e.into_inner()).drain(..).filter_map(|w| w.upgrade()).collect();
        for s in &sessions {
            s.cancel(CancelReason::EngineClosed);
        }
        sessions
    }
}

impl Drop for InferenceEngine {
    fn drop(&mut self) {
        self.close();
    }
}

/// A session's link to its engine. It keeps the engine alive: an engine dropped by its caller
/// (collected by JavaScript while `generate()` still iterates) would otherwise close and cancel
/// the sessions still running on it.
struct Hooks(Arc<InferenceEngine>);

impl SessionHooks for Hooks {
    fn wake(&self) {
        EngineThread::get().wake();
    }

    fn terminal(&self) {
        LIVE.fetch_sub(1, Ordering::AcqRel);
        self.0.admission.session_ended();
    }
}

/// A caller-owned KV cache (`model.makeCache()`); its layers live on the engine thread
/// (`caller_cache`) and go when it is disposed or dropped.
pub struct CacheHandle(Arc<CacheState>);

impl CacheHandle {
    pub fn new(model: ModelId) -> Self {
        CacheHandle(CacheState::new(model))
    }

    /// Positions the cache holds (as of the end of its last generation).
    pub fn offset(&self) -> u64 {
        self.0.offset()
    }

    /// The cache for one generation over `prompt_len` tokens of `model` (see `CacheState::lease`).
    pub fn lease(&self, model: ModelId, prompt_len: usize) -> Result<CacheLease> {
        self.0.lease(model, prompt_len)
    }

    /// Writes the cache to `path` (a versioned file fingerprinted to its model); resolves once
    /// written. Fails while a generation uses the cache.
    pub fn save(&self, path: PathBuf) -> Result<impl Future<Output = Result<()>>> {
        let lease = self.0.lease(self.0.model, usize::MAX)?;
        Ok(finish(EngineThread::get().cache_file(lease, path, true)))
    }

    /// A new cache of `model` holding what the file at `path` saved (see `save`).
    pub fn load(model: ModelId, path: PathBuf) -> impl Future<Output = Result<CacheHandle>> {
        let handle = CacheHandle::new(model);
        let lease = handle.0.lease(model, usize::MAX);
        async move {
            finish(EngineThread::get().cache_file(lease?, path, false)).await?;
            Ok(handle)
        }
    }

    /// Frees the layers (on the engine thread); later use fails.
    pub fn dispose(&self) {
        if self.0.dispose() {
            EngineThread::get().drop_cache(self.0.id);
        }
    }
}

async fn finish(rx: tokio::sync::oneshot::Receiver<Result<()>>) -> Result<()> {
    rx.await.map_err(|_| Error::EngineDead)?
}

impl Drop for CacheHandle {
    fn drop(&mut self) {
        self.dispose();
    }
}
