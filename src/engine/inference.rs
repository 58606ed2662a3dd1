//! `InferenceEngine`: sessions over one model (or a scripted method), with admission (at most
//! `max_active` run at once, `max_queued` more may wait), an aggregate budget for collect
//! buffers, and `close()`, which cancels every session. The sessions themselves are stepped by
//! the engine thread.
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::method::Script;
use super::plan::{
    resolve_execution, ExecutionCapabilities, ExecutionFeatures, ExecutionRequirements,
    ResolvedExecution,
};
use super::session::{CancelReason, DeliveryLimits, OutputMode, Session, SessionHooks};
use super::thread::{Engine, ModelId};
use super::caller_cache::CacheLease;
use crate::cache::PrefixStats;
use crate::error::{Error, Result};
use crate::sample::{validate_prompt, GenerateOptions};

/// Limits of an engine; mlx-bun's defaults.
#[derive(Debug, Clone, Copy)]
pub struct EngineOptions {
    /// `None`: idle consumers are never cancelled (used by `generate()`).
    pub idle_timeout: Option<Duration>,
    pub max_queued_events: usize,
    pub max_queued_tokens: usize,
    pub max_top_logprobs: usize,
    pub max_collect_tokens: u64,
    pub max_active: usize,
    pub max_queued: usize,
    /// Tokens one scheduler iteration may process when new prompts prefill alongside running
    /// rows (running rows' decode tokens come first).
    pub max_iteration_tokens: usize,
    /// Prompt tokens that prefill together when only new rows are preparing; short prompts
    /// arriving together are admitted as one burst within it.
    pub max_preparation_tokens: usize,
    /// Bytes of layer caches the engine keeps for prompts that start the same way (0: none).
    pub prefix_cache_bytes: u64,
}

/// The prefix cache's default cap, as mlx-bun's server (`promptCacheBytes`).
pub const DEFAULT_PREFIX_CACHE_BYTES: u64 = 2_000_000_000;

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            idle_timeout: Some(Duration::from_millis(30_000)),
            max_queued_events: 32,
            max_queued_tokens: 256,
            max_top_logprobs: 20,
            max_collect_tokens: 65_536,
            max_active: 8,
            max_queued: 64,
            max_iteration_tokens: 512,
            max_preparation_tokens: 2048,
            prefix_cache_bytes: DEFAULT_PREFIX_CACHE_BYTES,
        }
    }
}

impl EngineOptions {
    /// Reads mlx-bun's option names from a JSON object; each given value must be a positive
    /// safe integer. Unknown keys are left to the caller (the binding passes only these).
    pub fn from_json(v: &serde_json::Value) -> Result<Self> {
        let mut o = EngineOptions::default();
        let Some(map) = v.as_object() else {
            return if v.is_null() {
                Ok(o)
            } else {
                Err(Error::option("options", "must be an object"))
            };
        };
        let get = |name: &'static str| -> Result<Option<u64>> {
            match map.get(name) {
                None => Ok(None),
                Some(x) => match x.as_f64() {
                    Some(f) if f.fract() == 0.0 && f >= 1.0 && f <= 9_007_199_254_740_991.0 => {
                        Ok(Some(f as u64))
                    }
                    _ => Err(Error::option(
                        name,
                        format!("must be a positive safe integer, got {x}"),
                    )),
                },
            }
        };
        if let Some(ms) = get("idleTimeoutMs")? {
            o.idle_timeout = Some(Duration::from_millis(ms));
        }
        let count = |name, default: usize| -> Result<usize> {
            Ok(get(name)?.map_or(default, |n| n as usize))
        };
        o.max_queued_events = count("maxQueuedEvents", o.max_queued_events)?;
        o.max_queued_tokens = count("maxQueuedTokens", o.max_queued_tokens)?;
        o.max_top_logprobs = count("maxTopLogprobs", o.max_top_logprobs)?;
        o.max_collect_tokens = get("maxCollectTokens")?.unwrap_or(o.max_collect_tokens);
        o.max_active = count("maxActive", o.max_active)?;
        o.max_queued = count("maxQueued", o.max_queued)?;
        o.max_iteration_tokens = count("maxIterationTokens", o.max_iteration_tokens)?;
        o.max_preparation_tokens = count("maxPreparationTokens", o.max_preparation_tokens)?;
        o.prefix_cache_bytes = match map.get("prefixCacheBytes") {
            None => o.prefix_cache_bytes,
            Some(x) => match x.as_f64() {
                Some(f) if f.fract() == 0.0 && (0.0..=9_007_199_254_740_991.0).contains(&f) => f as u64,
                _ => return Err(Error::option("prefixCacheBytes", format!("must be a non-negative safe integer, got {x}"))),
            },
        };
        Ok(o)
    }
}

/// What the engine's sessions run.
#[derive(Debug, Clone)]
pub enum Source {
    Model { id: ModelId, vocab_size: usize },
    Script(Script),
}

/// Which prefix-cache entries a request may start from: those of its namespace, its own
/// session's continuation first.
#[derive(Debug, Clone, Default)]
pub struct PrefixKey {
    pub namespace: String,
    pub session: Option<String>,
}

/// One request, already tokenized and validated.
pub enum MethodSpec {
    Generate {
        model: ModelId,
        prompt: Vec<u32>,
        opts: GenerateOptions,
        prefix: PrefixKey,
        /// A caller-owned cache (`model.makeCache()`), leased for this request.
        cache: Option<CacheLease>,
    },
    Script(Script),
}

/// Where a plain autoregressive request runs, and whether it uses the prefix cache: mlx-bun
/// 0.5's placement over what this engine can do (continuous batching of autoregressive rows;
/// no paged KV, fill, grammar or media).
pub(super) fn placement(opts: &GenerateOptions) -> ResolvedExecution {
    let requirements = ExecutionRequirements {
        has_repetition_penalty: opts.sampling.repetition_penalty > 0.0
            && opts.sampling.repetition_penalty != 1.0,
        user_seed: opts.sampling.seed != 0,
        has_logits_extras: !opts.sampling.logit_bias.is_empty(),
        wants_logprobs: opts.wants_logprobs(),
        ..Default::default()
    };
    let capabilities = ExecutionCapabilities {
        continuous: true,
        ..Default::default()
    };
    resolve_execution(&requirements, &capabilities, &ExecutionFeatures::default())
}

/// Sessions alive (not yet terminal) in the whole process.
static LIVE: AtomicUsize = AtomicUsize::new(0);
static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

pub fn live_sessions() -> usize {
    LIVE.load(Ordering::Acquire)
}

pub struct InferenceEngine {
    pub options: EngineOptions,
    pub source: Source,
    closed: AtomicBool,
    live: AtomicUsize,
    running: AtomicUsize,
    reserved_collect: AtomicU64,
    sessions: Mutex<Vec<Weak<Session>>>,
    /// Sessions opened but not yet received by the engine thread: the scheduler counts them as
    /// queued, so a lone running row stops holding the thread as soon as one is opened.
    arriving: AtomicUsize,
    /// The prefix cache's counters (the cache itself lives on the engine thread).
    pub prefix_stats: Arc<PrefixStats>,
}

#[derive(Debug, Clone, Copy)]
pub struct EngineStats {
    pub live_sessions: usize,
    pub running: usize,
    pub reserved_collect_tokens: u64,
    pub prefix_cache: PrefixCacheStats,
}

#[derive(Debug, Clone, Copy)]
pub struct PrefixCacheStats {
    pub hits: u64,
    pub misses: u64,
    pub hit_tokens: u64,
    pub evictions: u64,
    pub shared_prefills: u64,
    pub shared_tokens: u64,
    pub bytes: u64,
    pub entries: u64,
}

impl InferenceEngine {
    pub fn new(source: Source, options: EngineOptions) -> Arc<Self> {
        Arc::new(InferenceEngine {
            options,
            source,
            closed: AtomicBool::new(false),
            live: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            reserved_collect: AtomicU64::new(0),
            sessions: Mutex::new(Vec::new()),
            arriving: AtomicUsize::new(0),
            prefix_stats: Arc::default(),
        })
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats {
            live_sessions: self.live.load(Ordering::Acquire),
            running: self.running.load(Ordering::Acquire),
            reserved_collect_tokens: self.reserved_collect.load(Ordering::Acquire),
            prefix_cache: {
                let p = &self.prefix_stats;
                let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
                PrefixCacheStats {
                    hits: get(&p.hits),
                    misses: get(&p.misses),
                    hit_tokens: get(&p.hit_tokens),
                    evictions: get(&p.evictions),
                    shared_prefills: get(&p.shared_prefills),
                    shared_tokens: get(&p.shared_tokens),
                    bytes: get(&p.bytes),
                    entries: get(&p.entries),
                }
            },
        }
    }

    /// Opens a session for a validated request. Stream sessions start on their first read.
    /// `cancelled`: the caller's abort signal had already fired, so nothing may run.
    pub fn open(
        self: &Arc<Self>,
        spec: MethodSpec,
        mode: OutputMode,
        cancelled: bool,
    ) -> Result<Arc<Session>> {
        if self.is_closed() {
            return Err(Error::EngineClosed);
        }
        if let (MethodSpec::Generate { prompt, opts, .. }, Source::Model { vocab_size, .. }) =
            (&spec, &self.source)
        {
            validate_prompt(prompt, *vocab_size)?;
            opts.validate(*vocab_size)?;
        }
        let capacity = self.options.max_active + self.options.max_queued;
        if self
            .live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < capacity).then_some(n + 1)
            })
            .is_err()
        {
            return Err(Error::AdmissionRejected(format!(
                "{} sessions are open (maxActive {} + maxQueued {})",
                capacity, self.options.max_active, self.options.max_queued
            )));
        }
        let limits = DeliveryLimits {
            idle_timeout: self.options.idle_timeout,
            max_queued_events: self.options.max_queued_events,
            max_queued_tokens: self.options.max_queued_tokens,
            max_top_logprobs: self.options.max_top_logprobs,
        };
        LIVE.fetch_add(1, Ordering::AcqRel);
        let id = format!("s{}", NEXT_SESSION.fetch_add(1, Ordering::Relaxed));
        let hooks: Arc<dyn SessionHooks> = Arc::new(Hooks(Arc::downgrade(self)));
        let session = Arc::new(Session::new(id, mode, limits, hooks));
        {
            let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            sessions.retain(|s| s.strong_count() > 0);
            sessions.push(Arc::downgrade(&session));
        }
        if cancelled {
            session.cancel(CancelReason::Requested);
        }
        self.arriving.fetch_add(1, Ordering::AcqRel);
        Engine::get().open(self.clone(), session.clone(), spec);
        Ok(session)
    }

    /// Later `open` calls fail with `ENGINE_CLOSED`, from this moment on (`close` does the rest).
    pub fn mark_closed(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Cancels every session with `engine_closed`; later `open` calls fail. Returns the sessions
    /// still alive, so callers can wait for their outcomes.
    pub fn close(&self) -> Vec<Arc<Session>> {
        self.mark_closed();
        let sessions: Vec<Arc<Session>> = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .filter_map(|w| w.upgrade())
            .collect();
        for s in &sessions {
            s.cancel(CancelReason::EngineClosed);
        }
        sessions
    }

    /// Sessions on their way to the engine thread.
    pub fn arriving(&self) -> usize {
        self.arriving.load(Ordering::Acquire)
    }

    /// The engine thread has received (or will never receive) a session.
    pub fn arrived(&self) {
        self.arriving.fetch_sub(1, Ordering::AcqRel);
    }

    /// An execution lease, if fewer than `max_active` sessions hold one.
    pub fn try_lease(self: &Arc<Self>) -> Option<Lease> {
        let max = self.options.max_active;
        self.running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Lease(self.clone()))
    }

    /// Reserves `tokens` of the collect budget.
    pub fn reserve_collect(self: &Arc<Self>, tokens: u64) -> Result<Reservation> {
        let max = self.options.max_collect_tokens;
        self.reserved_collect
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n + tokens <= max).then_some(n + tokens))
            .map(|_| Reservation(self.clone(), tokens))
            .map_err(|used| {
                Error::Protocol(format!(
                    "collect output of {tokens} tokens exceeds the engine's maxCollectTokens ({max}, {used} reserved)"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_default_and_reject_non_positive_integers() {
        let d = EngineOptions::from_json(&serde_json::json!({})).unwrap();
        assert_eq!(
            (
                d.max_queued_events,
                d.max_queued_tokens,
                d.max_top_logprobs,
                d.max_collect_tokens
            ),
            (32, 256, 20, 65_536)
        );
        assert_eq!(d.idle_timeout, Some(Duration::from_secs(30)));
        let o = EngineOptions::from_json(&serde_json::json!({"idleTimeoutMs": 5, "maxActive": 2}))
            .unwrap();
        assert_eq!(
            (o.idle_timeout, o.max_active),
            (Some(Duration::from_millis(5)), 2)
        );
        for bad in [
            serde_json::json!(0),
            serde_json::json!(-1),
            serde_json::json!(1.5),
            serde_json::json!("x"),
            serde_json::json!(null),
            serde_json::json!(1e300),
        ] {
            for name in [
                "idleTimeoutMs",
                "maxQueuedEvents",
                "maxQueuedTokens",
                "maxTopLogprobs",
                "maxCollectTokens",
                "maxActive",
                "maxQueued",
                "maxIterationTokens",
                "maxPreparationTokens",
            ] {
                let e = EngineOptions::from_json(&serde_json::json!({ name: bad })).unwrap_err();
                assert_eq!(e.code(), "INVALID_OPTION");
                assert!(e.to_string().starts_with(name), "{e}");
            }
        }
    }
}

impl Drop for InferenceEngine {
    fn drop(&mut self) {
        self.close();
    }
}

struct Hooks(Weak<InferenceEngine>);

impl SessionHooks for Hooks {
    fn wake(&self) {
        Engine::get().wake();
    }

    fn terminal(&self) {
        LIVE.fetch_sub(1, Ordering::AcqRel);
        if let Some(e) = self.0.upgrade() {
            e.live.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Permission to run; released on drop.
pub struct Lease(Arc<InferenceEngine>);

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Part of the collect budget; released on drop (the buffer itself moves to the outcome).
pub struct Reservation(Arc<InferenceEngine>, u64);

impl Drop for Reservation {
    fn drop(&mut self) {
        self.0.reserved_collect.fetch_sub(self.1, Ordering::AcqRel);
    }
}
