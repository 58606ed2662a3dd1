//! Fill: tokens the engine already knows are appended to a generation in one multi-token step
//! instead of being decoded one step each. This is context extension, not a second model: a
//! transformer cannot tell an appended token from a sampled one.
//!
//! Two policies say how strongly a proposal is held:
//! - `Assert`: the tokens are determined (a chat template's fixed tool-call scaffold, spans
//!   several earlier occurrences agree on up to a delimiter); they are appended and published as
//!   they are.
//! - `Verify`: the tokens are likely (a span copied from earlier in the request); the same step's
//!   logits give the model's own token at each position, the agreeing prefix is kept and the
//!   rest rewound, so the output is what plain decoding gives.
//!
//! A `FillSession` is one request's bookkeeping: its sources in priority order (strict rows
//! first, then the echo index), the clamp applied to what they propose, and the counts. It never
//! touches MLX; the speculative row (`speculative`) runs the steps.
mod echo;
mod strict;
pub mod template;

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;

use crate::error::{Error, Result};
use echo::EchoSource;
pub use strict::{FillKind, FillRow};
use strict::StrictRows;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    Assert,
    Verify,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// A strict row whose span the chat template fixes.
    Template,
    /// A strict row whose span the request's tool schemas fix (a tool's name, a required key).
    Schema,
    Echo,
}

/// Tokens a source claims come next.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    pub ids: Vec<u32>,
    pub policy: Policy,
    pub origin: Origin,
    /// Echo only: the span stopped where the history forked.
    pub branch_stop: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillMode {
    Off,
    /// Strict rows only.
    Strict,
    /// Strict rows, then the echo index.
    Echo,
}

/// The engine's fill switch and knobs: mlx-bun's `MLX_BUN_FILL*` variables, or the engine option
/// `fill`.
#[derive(Debug, Clone, PartialEq)]
pub struct FillConfig {
    pub mode: FillMode,
    /// The longest span one proposal appends.
    pub max_span: usize,
    /// Tokens an echo match needs.
    pub k: usize,
    /// Earlier occurrences an echo span consults (the nearest).
    pub candidates: usize,
    /// Tokens the echo index holds at most.
    pub index_max: usize,
    /// A JSON-lines file that gets one record per proposal.
    pub trace: Option<PathBuf>,
}

impl Default for FillConfig {
    fn default() -> Self {
        FillConfig { mode: FillMode::Off, max_span: 32, k: 8, candidates: 24, index_max: 131_072, trace: None }
    }
}

/// Bounds on the knobs: each is a loop or an allocation per step.
const MAX_SPAN: usize = 512;
const MAX_K: usize = 64;
const MAX_CANDIDATES: usize = 1024;
const MAX_INDEX: usize = 1 << 24;

impl FillConfig {
    /// From `MLX_BUN_FILL=off|strict|echo` (default off), `_MAX_SPAN`, `_K`, `_CANDIDATES`,
    /// `_INDEX_MAX` and `_TRACE` (a file path). Numbers are floored and clamped into range as
    /// mlx-bun does; an unknown mode is an error.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let d = FillConfig::default();
        let mode = match var("MLX_BUN_FILL").as_deref() {
            None | Some("" | "off" | "0") => FillMode::Off,
            Some("strict" | "1") => FillMode::Strict,
            Some("echo") => FillMode::Echo,
            Some(other) => return Err(Error::option("fill", format!("MLX_BUN_FILL={other}: expected off|strict|echo"))),
        };
        let number = |name: &str, default: usize, lo: usize, hi: usize| -> usize {
            match var(name).and_then(|v| v.trim().parse::<f64>().ok()).filter(|v| v.is_finite()) {
                Some(v) => (v.floor().max(0.0).min(hi as f64) as usize).clamp(lo, hi),
                None => default,
            }
        };
        let trace = var("MLX_BUN_FILL_TRACE").filter(|v| !matches!(v.as_str(), "" | "0" | "1" | "true")).map(PathBuf::from);
        Ok(FillConfig {
            mode,
            max_span: number("MLX_BUN_FILL_MAX_SPAN", d.max_span, 2, MAX_SPAN),
            k: number("MLX_BUN_FILL_K", d.k, 2, MAX_K),
            candidates: number("MLX_BUN_FILL_CANDIDATES", d.candidates, 1, MAX_CANDIDATES),
            index_max: number("MLX_BUN_FILL_INDEX_MAX", d.index_max, 1024, MAX_INDEX),
            trace,
        })
    }

    /// The engine option `fill`: `'off' | 'strict' | 'echo'`, or `{ mode, maxSpan, k,
    /// candidates, indexMax, trace }` over `base` (the environment's settings). Values out of
    /// range are refused.
    pub fn from_json(v: &serde_json::Value, base: FillConfig) -> Result<Self> {
        let mode = |m: &str| match m {
            "off" => Ok(FillMode::Off),
            "strict" => Ok(FillMode::Strict),
            "echo" => Ok(FillMode::Echo),
            other => Err(Error::option("fill", format!("mode must be 'off', 'strict' or 'echo', got {other:?}"))),
        };
        let mut c = base;
        match v {
            serde_json::Value::String(m) => c.mode = mode(m)?,
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    let int = |lo: usize, hi: usize| -> Result<usize> {
                        match value.as_f64() {
                            Some(f) if f.fract() == 0.0 && f >= lo as f64 && f <= hi as f64 => Ok(f as usize),
                            _ => Err(Error::option("fill", format!("{key} must be an integer from {lo} to {hi}, got {value}"))),
                        }
                    };
                    match key.as_str() {
                        "mode" => c.mode = mode(value.as_str().ok_or_else(|| Error::option("fill", format!("mode must be a string, got {value}")))?)?,
                        "maxSpan" => c.max_span = int(2, MAX_SPAN)?,
                        "k" => c.k = int(2, MAX_K)?,
                        "candidates" => c.candidates = int(1, MAX_CANDIDATES)?,
                        "indexMax" => c.index_max = int(1024, MAX_INDEX)?,
                        "trace" => {
                            c.trace = match value {
                                serde_json::Value::Null => None,
                                serde_json::Value::String(p) if !p.is_empty() => Some(PathBuf::from(p)),
                                _ => return Err(Error::option("fill", format!("trace must be a file path, got {value}"))),
                            }
                        }
                        other => return Err(Error::option("fill", format!("unknown key {other:?} (mode, maxSpan, k, candidates, indexMax, trace)"))),
                    }
                }
            }
            other => return Err(Error::option("fill", format!("must be 'off', 'strict', 'echo' or an object, got {other}"))),
        }
        Ok(c)
    }

    pub fn enabled(&self) -> bool {
        self.mode != FillMode::Off
    }
}

/// What a request's fill starts from: strict rows compiled from its chat template and tools
/// (`template::compile`), and the tokens that end an argument value there (a copied span may
/// end at one).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FillPlan {
    pub rows: Vec<FillRow>,
    pub delimiters: HashSet<u32>,
}

/// What a request's fill did (`stats.fill`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FillStats {
    /// Proposals that put at least one token into the output.
    pub events: u32,
    /// Tokens appended from proposals, of which from strict rows and from the echo index.
    pub injected: u32,
    pub strict: u32,
    pub echo: u32,
    /// Verify proposals forwarded, and their tokens kept and dropped.
    pub verify_events: u32,
    pub verify_accepted: u32,
    pub verify_rejected: u32,
    /// Proposals a clamp shortened (stop token, delimiter, span limit, budget).
    pub index_truncated: u32,
    /// Echo spans that stopped because the history forked.
    pub branch_stops: u32,
    /// Tokens the model sampled itself.
    pub decode_steps: u32,
}

/// One request's fill: its sources, the tail of its sequence, and its counts.
pub struct FillSession {
    strict: StrictRows,
    echo: Option<EchoSource>,
    eos: HashSet<u32>,
    delimiters: HashSet<u32>,
    max_span: usize,
    window: usize,
    /// The last `window` tokens of prompt and output.
    tail: Vec<u32>,
    trace: Option<std::fs::File>,
    pub stats: FillStats,
}

impl FillSession {
    /// `eos`: the request's stop tokens, which no span contains.
    pub fn new(config: &FillConfig, plan: FillPlan, eos: &[u32], prompt: &[u32]) -> Result<Self> {
        let strict = StrictRows::new(plan.rows);
        let echo = (config.mode == FillMode::Echo)
            .then(|| EchoSource::new(config.k, config.max_span, config.candidates, config.index_max, plan.delimiters.clone(), prompt));
        let window = strict.window().max(echo.as_ref().map_or(1, EchoSource::window));
        let trace = match &config.trace {
            Some(path) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|source| Error::Io { path: path.clone(), source })?,
            ),
            None => None,
        };
        Ok(FillSession {
            strict,
            echo,
            eos: eos.iter().copied().collect(),
            delimiters: plan.delimiters,
            max_span: config.max_span,
            window,
            tail: prompt[prompt.len().saturating_sub(window)..].to_vec(),
            trace,
            stats: FillStats::default(),
        })
    }

    /// The longest span it proposes.
    pub fn max_span(&self) -> usize {
        self.max_span
    }

    fn append(&mut self, ids: &[u32]) {
        self.tail.extend_from_slice(ids);
        let extra = self.tail.len().saturating_sub(self.window);
        self.tail.drain(..extra);
        if let Some(e) = &mut self.echo {
            e.observe(ids);
        }
    }

    /// A token the model sampled enters the sequence.
    pub fn observe(&mut self, token: u32) {
        self.stats.decode_steps += 1;
        self.append(&[token]);
    }

    /// What the sources propose next, at most `budget` tokens (the output the request may still
    /// produce), clamped; only proposals of `only`'s policy when given (a row whose caches cannot
    /// rewind takes assertions only). The caller hands it back to `commit` with what it kept.
    pub fn propose(&mut self, budget: usize, only: Option<Policy>) -> Option<Proposal> {
        let candidates = [self.strict.propose(&self.tail), self.echo.as_ref().and_then(|e| e.propose(&self.tail))];
        for p in candidates.into_iter().flatten() {
            if p.branch_stop {
                self.stats.branch_stops += 1;
            }
            let echo = p.origin == Origin::Echo;
            let ids = self.clamp(&p.ids, budget, echo);
            if ids.len() < 2 {
                continue;
            }
            if ids.len() != p.ids.len() {
                self.stats.index_truncated += 1;
            }
            // An echo claim cut short anywhere but at a delimiter is no longer the claim its
            // source made. Strict rows are determined by construction: a shorter span stays so.
            let weakened = echo && ids.len() != p.ids.len() && !ids.last().is_some_and(|l| self.delimiters.contains(l));
            let policy = if weakened { Policy::Verify } else { p.policy };
            if only.is_some_and(|o| o != policy) {
                continue;
            }
            return Some(Proposal { ids, policy, ..p });
        }
        None
    }

    /// The clamp, in order: cut before the first stop token (ending is the model's decision),
    /// cut after the first delimiter (echo only), keep at most the span limit and the budget.
    fn clamp(&self, ids: &[u32], budget: usize, echo: bool) -> Vec<u32> {
        let mut end = ids.iter().position(|id| self.eos.contains(id)).unwrap_or(ids.len());
        if echo {
            if let Some(d) = ids[..end].iter().position(|id| self.delimiters.contains(id)) {
                end = d + 1;
            }
        }
        ids[..end.min(self.max_span).min(budget)].to_vec()
    }

    /// What the row kept of `proposal`: all of an assertion, the agreeing prefix of a verified
    /// span. `actual` is what the model's own sampling gave at each position, for the trace.
    pub fn commit(&mut self, proposal: Proposal, accepted: usize, actual: &[u32]) {
        let n = accepted.min(proposal.ids.len());
        if proposal.policy == Policy::Verify {
            self.stats.verify_events += 1;
            self.stats.verify_accepted += n as u32;
            self.stats.verify_rejected += (proposal.ids.len() - n) as u32;
        }
        self.write_trace(&proposal, n, actual);
        if n == 0 {
            return;
        }
        self.append(&proposal.ids[..n]);
        self.stats.events += 1;
        self.stats.injected += n as u32;
        match proposal.origin {
            Origin::Echo => self.stats.echo += n as u32,
            Origin::Template | Origin::Schema => self.stats.strict += n as u32,
        }
    }

    /// One JSON line per proposal: what was proposed next to what the model sampled at each of
    /// its positions. A failed write turns the trace off rather than the request.
    fn write_trace(&mut self, p: &Proposal, accepted: usize, actual: &[u32]) {
        let Some(file) = &mut self.trace else { return };
        let first_mismatch = p.ids.iter().zip(actual).position(|(a, b)| a != b).map_or(-1, |i| i as i64);
        let record = serde_json::json!({
            "ts": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()),
            "origin": p.origin,
            "policy": p.policy,
            "generated": self.stats.decode_steps + self.stats.injected,
            "proposedLen": p.ids.len(),
            "accepted": accepted,
            "firstMismatch": first_mismatch,
            "proposed": p.ids,
            "actual": actual,
        });
        if writeln!(file, "{record}").is_err() {
            self.trace = None;
        }
    }
}

#[cfg(test)]
mod tests;
