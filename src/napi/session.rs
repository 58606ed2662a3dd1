//! Engines and sessions for JavaScript. Events cross in batches (`nextBatch` resolves with every
//! ready event at once); index.js turns them back into one `GenerationEvent` per `next()` and
//! calls `consumed()` as each is used, so the Rust queue bounds and idle timer see every read.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use napi::bindgen_prelude::{Either, Float64Array, Int32Array, PromiseRaw, Uint32Array};
use napi::Env;
use napi_derive::napi;
use serde_json::{json, Value};

use super::plan::ExecutionCapabilitiesJs;
use super::convert::{prompt_tokens, render_options, GenerateOptionsJs};
use super::js_error;
use super::model::{KvCache, Model};
use super::tokenizer::{ChatTemplate, RenderOptionsJs, Tokenizer};
use crate::engine::holds::SessionHold;
use crate::engine::inference::{live_session_states, live_sessions};
use crate::engine::method::Script;
use crate::engine::session::{CancelReason, OutputMode, Session, SessionEvent, Status};
use crate::engine::fill::{template, FillPlan};
use crate::engine::{batch_counts, Draft, EngineOptions, InferenceEngine, MethodSpec, Source};
use crate::error::{Error, Result};
use crate::sample::logprobs::TokenLogprobs;
use crate::tokenizer::{load_tokenizer, ChatTemplate as CoreTemplate, Tokenizer as CoreTokenizer};

type Chat = (CoreTokenizer, Option<CoreTemplate>);

#[napi]
pub struct NativeEngine {
    inner: Arc<InferenceEngine>,
    /// Tokenizer and template for `messages` requests, loaded beside the model on first use
    /// unless given. A failed load is not kept: the next request retries and gets the same typed
    /// error.
    chat: OnceLock<Chat>,
    /// A chat template given to `createEngine`, which replaces the model's own.
    template: Option<CoreTemplate>,
    model_path: Option<std::path::PathBuf>,
    /// Set when the model is disposed; opening then fails with `MODEL_DISPOSED`.
    model_disposed: Option<Arc<AtomicBool>>,
}

/// `createEngine(model, options)`; `tokenizer` / `chatTemplate` override the model's own.
#[napi(catch_unwind)]
pub fn create_engine_native(
    model: &Model,
    options: Option<Value>,
    tokenizer: Option<&Tokenizer>,
    chat_template: Option<&ChatTemplate>,
) -> napi::Result<NativeEngine> {
    let options = EngineOptions::from_json(&options.unwrap_or(Value::Null)).map_err(js_error)?;
    let (id, config, disposed) = model.handle()?;
    let source = Source::Model { id, vocab_size: config.vocab_size, checkpoints: crate::model::restores_checkpoints(&config) };
    let chat = OnceLock::new();
    let template = chat_template.map(|c| c.core().clone());
    if let Some(t) = tokenizer {
        let template = template.clone().or_else(|| load_tokenizer(&config.model_path()).ok().and_then(|(_, t)| t));
        let _ = chat.set((t.core().clone(), template));
    }
    Ok(NativeEngine {
        inner: InferenceEngine::new(source, options),
        chat,
        template,
        model_path: Some(config.model_path()),
        model_disposed: Some(disposed),
    })
}

/// `testing.createScriptedEngine(script, options)`: sessions replay `script` instead of a model.
#[napi(catch_unwind)]
pub fn create_scripted_engine_native(script: Value, options: Option<Value>) -> napi::Result<NativeEngine> {
    let options = EngineOptions::from_json(&options.unwrap_or(Value::Null)).map_err(js_error)?;
    let script = Script::from_json(script).map_err(js_error)?;
    Ok(NativeEngine { inner: InferenceEngine::new(Source::Script(script), options), chat: OnceLock::new(), template: None, model_path: None, model_disposed: None })
}

/// Sessions not yet terminal, across every engine.
#[napi(catch_unwind)]
pub fn live_sessions_native() -> u32 {
    live_sessions() as u32
}

/// `testing.liveSessionStates()`: `{ sessions, lost }`, each session not yet terminal described,
/// and how many more are counted live though nothing references them.
#[napi(catch_unwind)]
pub fn live_session_states_native() -> Value {
    let (sessions, lost) = live_session_states();
    json!({ "sessions": sessions, "lost": lost })
}

/// Panics with `message`: a bug inside a synchronous binding, which must throw rather than abort
/// the process (`testing.panicInBinding`).
#[napi(catch_unwind)]
pub fn panic_native(message: String) -> napi::Result<()> {
    panic!("{message}")
}

/// Bytes of the MLX arrays alive in the process (`testing.mlxActiveMemory()`).
#[napi(catch_unwind)]
pub fn mlx_active_memory_native() -> f64 {
    crate::mlx::memory::active_bytes() as f64
}

#[napi(object)]
pub struct BatchCountsJs {
    /// Decode steps that advanced several sessions in one graph.
    pub steps: f64,
    /// Session steps taken inside them.
    pub rows: f64,
    /// Prefill chunks that advanced several sessions in one graph.
    pub prefill_steps: f64,
    /// Session chunks taken inside them.
    pub prefill_rows: f64,
}

/// How much decoding ran batched, across every engine since the process started.
#[napi(catch_unwind)]
pub fn batch_counts_native() -> BatchCountsJs {
    let c = batch_counts();
    BatchCountsJs {
        steps: c.decode_steps as f64,
        rows: c.decode_rows as f64,
        prefill_steps: c.prefill_steps as f64,
        prefill_rows: c.prefill_rows as f64,
    }
}

#[napi(object)]
pub struct EngineStatsJs {
    pub live_sessions: u32,
    pub running: u32,
    pub reserved_collect_tokens: f64,
    pub idle: bool,
    pub prefix_cache: PrefixCacheStatsJs,
}

/// The prefix cache since the engine was created (`bytes` and `entries`: now).
#[napi(object)]
pub struct PrefixCacheStatsJs {
    pub hits: f64,
    pub misses: f64,
    /// Prompt tokens the hits did not have to prefill.
    pub hit_tokens: f64,
    pub evictions: f64,
    /// Rows that started from the prompt prefix of a row preparing with them, and those tokens.
    pub shared_prefills: f64,
    pub shared_tokens: f64,
    pub bytes: f64,
    pub entries: f64,
}

impl NativeEngine {
    fn chat(&self) -> Result<&Chat> {
        if let Some(chat) = self.chat.get() {
            return Ok(chat);
        }
        let path = self.model_path.as_ref().ok_or_else(|| Error::Template("this engine has no tokenizer".into()))?;
        let (tokenizer, template) = load_tokenizer(path)?;
        Ok(self.chat.get_or_init(|| (tokenizer, self.template.clone().or(template))))
    }

    fn spec(&self, prompt: Option<Either<Uint32Array, Vec<f64>>>, messages: Option<Value>, chat: Option<RenderOptionsJs>, mut opts: GenerateOptionsJs, cache: Option<&KvCache>, draft: Option<&Model>) -> Result<MethodSpec> {
        let prefix = opts.take_prefix_key();
        let draft_tokens = opts.take_draft_tokens()?;
        let draft = match draft {
            Some(m) => {
                let (model, config, _) = m.handle().map_err(|e| Error::option("draftModel", e.reason.clone()))?;
                Some(Draft { model, tokens: draft_tokens, vocab_size: config.vocab_size })
            }
            None => None,
        };
        let opts = opts.into_options()?;
        let Source::Model { id, .. } = &self.inner.source else {
            let Source::Script(script) = &self.inner.source else { unreachable!() };
            if cache.is_some() {
                return Err(Error::option("cache", "a scripted engine has no model to cache"));
            }
            return Ok(MethodSpec::Script(script.clone()));
        };
        let mut fill = FillPlan::default();
        let prompt = match (prompt, messages) {
            (Some(p), None) => prompt_tokens(p)?,
            (None, Some(m)) => {
                let (tokenizer, template) = self.chat()?;
                let template = template.as_ref().ok_or_else(|| Error::Template("the model has no chat template".into()))?;
                let render = render_options(chat);
                // With fill on, the strict rows of the template's tool calls.
                if let (true, Some(Value::Array(tools)), Value::Array(list)) = (self.inner.options().fill.enabled(), &render.tools, &m) {
                    fill = template::compile(template, tokenizer, list, tools, &render.extra);
                }
                tokenizer.encode_chat(template, &m, &render)?
            }
            _ => return Err(Error::InvalidPrompt("a request needs promptTokens or messages, not both".into())),
        };
        let cache = cache.map(|c| c.handle().lease(*id, prompt.len())).transpose()?;
        Ok(MethodSpec::Generate { model: *id, prompt, opts, prefix, cache, draft, fill })
    }
}

#[napi]
impl NativeEngine {
    /// Opens a session; `output` is 'stream' (default), 'collect' or 'callback'.
    #[napi(catch_unwind)]
    pub fn open(
        &self,
        prompt_tokens: Option<Either<Uint32Array, Vec<f64>>>,
        messages: Option<Value>,
        chat: Option<RenderOptionsJs>,
        options: Option<GenerateOptionsJs>,
        output: Option<String>,
        has_on_tokens: bool,
        aborted: bool,
        cache: Option<&KvCache>,
        draft_model: Option<&Model>,
    ) -> napi::Result<NativeSession> {
        let open = || -> Result<Arc<Session>> {
            if self.model_disposed.as_ref().is_some_and(|d| d.load(Ordering::Acquire)) {
                return Err(Error::ModelDisposed);
            }
            let mode = OutputMode::parse(output.as_deref().unwrap_or("stream"))?;
            if mode == OutputMode::Callback && !has_on_tokens {
                return Err(Error::option("onTokens", "a function is required with output 'callback'"));
            }
            let spec = self.spec(prompt_tokens, messages, chat, options.unwrap_or_default(), cache, draft_model)?;
            self.inner.open(spec, mode, aborted)
        };
        open().map(|inner| NativeSession { hold: SessionHold::new(inner) }).map_err(js_error)
    }

    /// Marks the engine closed at once, on the caller's thread: an `open` right after an
    /// un-awaited `close()` throws `ENGINE_CLOSED` (the async `close` runs later, elsewhere).
    #[napi(catch_unwind)]
    pub fn mark_closed(&self) {
        self.inner.mark_closed();
    }

    /// Cancels every session with `engine_closed` and waits until all have ended.
    #[napi(catch_unwind)]
    pub fn close<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, ()>> {
        let sessions = self.inner.close();
        env.spawn_future(async move {
            for s in sessions {
                s.outcome().await;
            }
            Ok(())
        })
    }

    #[napi(getter, catch_unwind)]
    pub fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// What this engine can do, in `resolveExecution`'s terms (every request's placement is
    /// resolved against it).
    #[napi(getter, catch_unwind)]
    pub fn capabilities(&self) -> ExecutionCapabilitiesJs {
        (&self.inner.capabilities()).into()
    }

    #[napi(getter, catch_unwind)]
    pub fn stats(&self) -> EngineStatsJs {
        let s = self.inner.stats();
        let p = s.prefix_cache;
        EngineStatsJs {
            live_sessions: s.live_sessions as u32,
            running: s.running as u32,
            reserved_collect_tokens: s.reserved_collect_tokens as f64,
            idle: s.idle,
            prefix_cache: PrefixCacheStatsJs {
                hits: p.hits as f64,
                misses: p.misses as f64,
                hit_tokens: p.hit_tokens as f64,
                evictions: p.evictions as f64,
                shared_prefills: p.shared_prefills as f64,
                shared_tokens: p.shared_tokens as f64,
                bytes: p.bytes as f64,
                entries: p.entries as f64,
            },
        }
    }
}

#[napi(object)]
pub struct TopLogprobJs {
    pub id: u32,
    pub logprob: f64,
}

#[napi(object)]
pub struct TokenLogprobsJs {
    pub logprob: f64,
    pub top: Option<Vec<TopLogprobJs>>,
}

fn logprobs_js(l: &TokenLogprobs) -> TokenLogprobsJs {
    TokenLogprobsJs {
        logprob: f64::from(l.logprob),
        top: (!l.top.is_empty()).then(|| l.top.iter().map(|t| TopLogprobJs { id: t.id, logprob: f64::from(t.logprob) }).collect()),
    }
}

/// Ready events in columns: one typed array per field instead of one JS object per event.
#[napi(object)]
pub struct EventBatch {
    /// Tokens of every committed event, concatenated.
    pub tokens: Uint32Array,
    /// Per event: its token count, or -1 for a progress event.
    pub counts: Int32Array,
    /// `sequence` of the first committed event.
    pub first_sequence: f64,
    /// `completed, total` of each progress event, in order (`total` NaN when absent).
    pub progress: Float64Array,
    /// Per token, when any event carried logprobs; `null` for tokens of events without.
    pub logprobs: Option<Vec<Option<TokenLogprobsJs>>>,
}

fn batch(events: Vec<SessionEvent>) -> EventBatch {
    let mut tokens = Vec::new();
    let mut counts = Vec::with_capacity(events.len());
    let mut progress = Vec::new();
    let mut first_sequence = None;
    let any_logprobs = events.iter().any(|e| matches!(e, SessionEvent::Committed { logprobs: Some(_), .. }));
    let mut logprobs = any_logprobs.then(Vec::new);
    for e in events {
        match e {
            SessionEvent::Committed { sequence, token_ids, logprobs: lp } => {
                first_sequence.get_or_insert(sequence);
                counts.push(token_ids.len() as i32);
                if let Some(out) = logprobs.as_mut() {
                    match &lp {
                        Some(lp) => out.extend(lp.iter().map(|l| Some(logprobs_js(l)))),
                        None => out.extend(token_ids.iter().map(|_| None)),
                    }
                }
                tokens.extend(token_ids);
            }
            SessionEvent::Progress { completed, total } => {
                counts.push(-1);
                progress.push(completed);
                progress.push(total.unwrap_or(f64::NAN));
            }
        }
    }
    EventBatch {
        tokens: tokens.into(),
        counts: counts.into(),
        first_sequence: first_sequence.unwrap_or(0) as f64,
        progress: progress.into(),
        logprobs,
    }
}

#[napi(object)]
pub struct OutcomeJs {
    pub status: String,
    pub committed_tokens: f64,
    pub output: Option<Uint32Array>,
    pub metrics: Option<Value>,
    /// Completed: `{finishReason, metrics}`.
    pub result: Option<Value>,
    /// Cancelled: the reason.
    pub reason: Option<String>,
    /// Failed: `{code, message, cleanupError?, cause?}`.
    pub error: Option<Value>,
}

/// A session for JavaScript. The object and each pending promise hold it (`SessionHold`): once
/// the object is collected and no promise is pending, the session is closed.
#[napi]
pub struct NativeSession {
    hold: SessionHold,
}

#[napi]
impl NativeSession {
    #[napi(getter, catch_unwind)]
    pub fn id(&self) -> String {
        self.hold.session().id.clone()
    }

    #[napi(getter, catch_unwind)]
    pub fn state(&self) -> Value {
        serde_json::to_value(self.hold.session().state()).unwrap_or(Value::Null)
    }

    /// Claims the one consumer of a stream session's events.
    #[napi(catch_unwind)]
    pub fn claim_reader(&self) -> napi::Result<()> {
        self.hold.session().claim_reader().map_err(js_error)
    }

    /// Every ready event (waiting for one); `null` once the session has ended and been drained.
    /// Like every promise of these classes, its future owns what it waits on rather than
    /// borrowing `self`: a worker's environment may be torn down (`worker.terminate()`) while
    /// the promise is pending, freeing this object, and the future still runs to its end.
    #[napi(catch_unwind)]
    pub fn next_batch<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, Option<EventBatch>>> {
        let (inner, pending) = (self.hold.session().clone(), self.hold.promise());
        env.spawn_future(async move {
            let next = inner.next_batch().await;
            drop(pending);
            Ok(next.map_err(js_error)?.map(batch))
        })
    }

    /// The consumer used `n` more of the events it was handed.
    #[napi(catch_unwind)]
    pub fn consumed(&self, n: u32) {
        self.hold.session().consumed(n as usize);
    }

    #[napi(catch_unwind)]
    pub fn cancel(&self, reason: Option<String>) -> napi::Result<()> {
        let reason = reason.map_or(Ok(CancelReason::Requested), |r| CancelReason::parse(&r)).map_err(js_error)?;
        self.hold.session().cancel(reason);
        Ok(())
    }

    /// Callback mode: the callback returned `false`.
    #[napi(catch_unwind)]
    pub fn stop_output(&self) {
        self.hold.session().stop_output();
    }

    /// Callback mode: the callback threw.
    #[napi(catch_unwind)]
    pub fn fail_output(&self, message: String) {
        self.hold.session().fail_output(message);
    }

    #[napi(catch_unwind)]
    pub fn outcome<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, OutcomeJs>> {
        let (inner, pending) = (self.hold.session().clone(), self.hold.promise());
        env.spawn_future(async move {
            let outcome = inner.outcome().await;
            drop(pending);
            Ok(outcome_js(outcome))
        })
    }
}

fn outcome_js(o: crate::engine::session::Outcome) -> OutcomeJs {
    {
        let mut out = OutcomeJs {
            status: String::new(),
            committed_tokens: o.committed_tokens as f64,
            output: o.output.map(Uint32Array::new),
            metrics: o.metrics.and_then(|m| serde_json::to_value(m).ok()),
            result: None,
            reason: None,
            error: None,
        };
        match o.status {
            Status::Completed(r) => {
                out.status = "completed".into();
                out.result = serde_json::to_value(r).ok();
            }
            Status::Cancelled(r) => {
                out.status = "cancelled".into();
                out.reason = Some(r.as_str().into());
            }
            Status::Failed(f) => {
                out.status = "failed".into();
                let mut e = json!({"code": f.code, "message": f.message});
                if let Some(c) = f.cleanup_error {
                    e["cleanupError"] = Value::String(c);
                }
                if let Some(c) = f.cause {
                    e["cause"] = Value::String(c.into());
                }
                out.error = Some(e);
            }
        }
        out
    }
}

