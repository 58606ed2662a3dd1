//! Admission, shared by the JavaScript-facing engine and the engine thread: the engine's limits,
//! the counters both sides read (sessions open, running, arriving; collect tokens reserved), and
//! the leases the thread takes from them. At most `max_active` sessions run at once and
//! `max_queued` more may wait; collect buffers share one token budget.
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::fill::FillConfig;
use crate::cache::PrefixStats;
use crate::error::{Error, Result};

/// Limits of an engine; mlx-bun's defaults.
#[derive(Debug, Clone)]
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
    /// mlx-bun's `grammarJump` feature: tokens a grammar forces are fed in one step.
    pub grammar_jump: bool,
    /// mlx-bun's fill feature (`MLX_BUN_FILL*`, or the option `fill`).
    pub fill: FillConfig,
    /// mlx-bun's `memoryBudgetBytes`: sessions are admitted only while their contexts fit
    /// (`memory`); `None`: no budget.
    pub memory_budget_bytes: Option<u64>,
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
            grammar_jump: false,
            fill: FillConfig::default(),
            memory_budget_bytes: None,
        }
    }
}

impl EngineOptions {
    /// Reads mlx-bun's option names from a JSON object; each given value must be a positive
    /// safe integer. Unknown keys are left to the caller (the binding passes only these).
    pub fn from_json(v: &serde_json::Value) -> Result<Self> {
        let mut o = EngineOptions { fill: FillConfig::from_env()?, ..EngineOptions::default() };
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
        o.memory_budget_bytes = get("memoryBudgetBytes")?;
        o.prefix_cache_bytes = match map.get("prefixCacheBytes") {
            None => o.prefix_cache_bytes,
            Some(x) => match x.as_f64() {
                Some(f) if f.fract() == 0.0 && (0.0..=9_007_199_254_740_991.0).contains(&f) => f as u64,
                _ => return Err(Error::option("prefixCacheBytes", format!("must be a non-negative safe integer, got {x}"))),
            },
        };
        o.grammar_jump = match map.get("grammarJump") {
            None => o.grammar_jump,
            Some(serde_json::Value::Bool(b)) => *b,
            Some(x) => return Err(Error::option("grammarJump", format!("must be a boolean, got {x}"))),
        };
        if let Some(f) = map.get("fill") {
            o.fill = FillConfig::from_json(f, o.fill)?;
        }
        Ok(o)
    }
}

pub struct Admission {
    pub options: EngineOptions,
    closed: AtomicBool,
    /// Sessions open (not yet terminal).
    live: AtomicUsize,
    running: AtomicUsize,
    reserved_collect: AtomicU64,
    /// Sessions opened but not yet received by the engine thread: the scheduler counts them as
    /// queued, so a lone running row stops holding the thread as soon as one is opened.
    arriving: AtomicUsize,
    /// The engine thread has no work and has handed back the memory its work freed.
    idle: AtomicBool,
    /// The prefix cache's counters (the cache itself lives on the engine thread).
    pub prefix_stats: Arc<PrefixStats>,
}

#[derive(Debug, Clone, Copy)]
pub struct EngineStats {
    pub live_sessions: usize,
    pub running: usize,
    pub reserved_collect_tokens: u64,
    /// No work, and the memory it freed handed back (`mlx::memory::release_idle`).
    pub idle: bool,
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

impl Admission {
    pub fn new(options: EngineOptions) -> Arc<Self> {
        Arc::new(Admission {
            options,
            closed: AtomicBool::new(false),
            live: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            reserved_collect: AtomicU64::new(0),
            arriving: AtomicUsize::new(0),
            idle: AtomicBool::new(true),
            prefix_stats: Arc::default(),
        })
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Later sessions are refused (`ENGINE_CLOSED`).
    pub fn mark_closed(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Counts a new session, unless `max_active + max_queued` are open already.
    pub fn admit_session(&self) -> Result<()> {
        let o = &self.options;
        let capacity = o.max_active + o.max_queued;
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < capacity).then_some(n + 1))
            .map(|_| ())
            .map_err(|_| Error::AdmissionRejected(format!("{capacity} sessions are open (maxActive {} + maxQueued {})", o.max_active, o.max_queued)))
    }

    /// A session counted by `admit_session` reached its terminal state.
    pub fn session_ended(&self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
    }

    /// A session is on its way to the engine thread.
    pub fn arriving_one(&self) {
        self.arriving.fetch_add(1, Ordering::AcqRel);
    }

    /// Sessions on their way to the engine thread.
    pub fn arriving(&self) -> usize {
        self.arriving.load(Ordering::Acquire)
    }

    /// Set by the engine thread as it starts working and once it has released memory after.
    pub fn set_idle(&self, idle: bool) {
        self.idle.store(idle, Ordering::Release);
    }

    /// The engine thread has received (or will never receive) a session.
    pub fn arrived(&self) {
        self.arriving.fetch_sub(1, Ordering::AcqRel);
    }

    /// An execution lease, if fewer than `max_active` sessions hold one.
    pub fn try_lease(self: &Arc<Self>) -> Option<Lease> {
        let max = self.options.max_active;
        self.running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
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

    pub fn stats(&self) -> EngineStats {
        let p = &self.prefix_stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        EngineStats {
            live_sessions: self.live.load(Ordering::Acquire),
            running: self.running.load(Ordering::Acquire),
            reserved_collect_tokens: self.reserved_collect.load(Ordering::Acquire),
            idle: self.idle.load(Ordering::Acquire),
            prefix_cache: PrefixCacheStats {
                hits: get(&p.hits),
                misses: get(&p.misses),
                hit_tokens: get(&p.hit_tokens),
                evictions: get(&p.evictions),
                shared_prefills: get(&p.shared_prefills),
                shared_tokens: get(&p.shared_tokens),
                bytes: get(&p.bytes),
                entries: get(&p.entries),
            },
        }
    }
}

/// Permission to run; released on drop.
pub struct Lease(Arc<Admission>);

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Part of the collect budget; released on drop (the buffer itself moves to the outcome).
pub struct Reservation(Arc<Admission>, u64);

impl Drop for Reservation {
    fn drop(&mut self) {
        self.0.reserved_collect.fetch_sub(self.1, Ordering::AcqRel);
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

