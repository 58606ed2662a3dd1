//! What every handler shares: the server's options, its context and its sessions, and the
//! helpers both APIs use (model check, ids, streamed answers).
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};

use super::context::ServerContext;
use super::error::ApiError;
use super::generation::{Chunk, Run};
use super::log::{LogFormat, LogSlot};
use crate::cache::{KvQuant, KvQuantOptions};
use crate::error::Error;
use crate::engine::inference::DEFAULT_PREFIX_CACHE_BYTES;
use crate::engine::fill::FillConfig;
use crate::engine::{EngineOptions, InferenceEngine, Source};

/// The largest request body accepted by default (`413` above it).
pub const DEFAULT_BODY_LIMIT: usize = 32 << 20;

#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// 127.0.0.1 unless told otherwise: the server is for this machine.
    pub host: String,
    /// 0 picks a free port (`Server::port` says which).
    pub port: u16,
    /// Required as `Authorization: Bearer KEY` or `x-api-key: KEY` when set.
    pub api_key: Option<String>,
    /// Origins allowed by CORS; none (the default) sends no CORS headers.
    pub cors_origins: Vec<String>,
    /// `max_tokens` when a request has none; unset: 65 536 for chat, 512 for completions.
    pub default_max_tokens: Option<u32>,
    pub default_temperature: Option<f32>,
    pub default_top_p: Option<f32>,
    pub default_top_k: Option<u32>,
    pub body_limit: usize,
    pub log: LogFormat,
    /// How long `close` lets in-flight requests finish before it cancels them.
    pub shutdown_grace: Duration,
    /// Bytes of KV caches kept for prompts that start the same way (0: none); mlx-bun's
    /// `promptCacheBytes`.
    pub prompt_cache_bytes: u64,
    /// Requests decoded together; more wait in the queue, up to `max_queued` (then `429`).
    pub batch: usize,
    pub max_queued: usize,
    /// mlx-bun's fill feature (`--fill`, `MLX_BUN_FILL*`): echo spans in every request it can
    /// place with.
    pub fill: FillConfig,
    /// How every request's KV caches are quantized (mlx-bun's `kvQuant`).
    pub kv_quant: KvQuantSetting,
    /// Requests are admitted only while their contexts fit (the engine's `memoryBudgetBytes`).
    pub memory_budget_bytes: Option<u64>,
}

/// mlx-bun's `kvQuant`: per the model's kv_config.json (`Config`, the default, as optiq serve
/// does; nothing when the folder has none), every layer at `Bits`, or `Off`. A server quantizes
/// from a request's first step, as mlx-bun's does whatever the scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvQuantSetting {
    Off,
    Config,
    Bits(i32),
}

impl KvQuantSetting {
    /// `off`, `config`, or a number of bits.
    pub fn parse(s: &str) -> crate::error::Result<Self> {
        let setting = match s {
            "off" => KvQuantSetting::Off,
            "config" => KvQuantSetting::Config,
            bits => KvQuantSetting::Bits(bits.parse().map_err(|_| Error::option("kvQuant", format!("must be 'off', 'config' or 2, 3, 4, 5, 6, 8, got '{bits}'")))?),
        };
        setting.options(&[]).validate().map_err(|_| Error::option("kvQuant", format!("must be 'off', 'config' or 2, 3, 4, 5, 6, 8, got '{s}'")))?;
        Ok(setting)
    }

    /// A request's KV options for a model whose kv_config.json says `config`.
    pub fn options(self, config: &[(usize, KvQuant)]) -> KvQuantOptions {
        let on = KvQuantOptions { start: Some(0), ..Default::default() };
        match self {
            KvQuantSetting::Off => KvQuantOptions::default(),
            KvQuantSetting::Config => KvQuantOptions { config: config.to_vec(), ..on },
            KvQuantSetting::Bits(b) => KvQuantOptions { bits: Some(b), ..on },
        }
    }
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            cors_origins: Vec::new(),
            default_max_tokens: None,
            default_temperature: None,
            default_top_p: None,
            default_top_k: None,
            body_limit: DEFAULT_BODY_LIMIT,
            log: LogFormat::Text,
            shutdown_grace: Duration::from_secs(10),
            prompt_cache_bytes: DEFAULT_PREFIX_CACHE_BYTES,
            batch: EngineOptions::default().max_active,
            max_queued: EngineOptions::default().max_queued,
            fill: FillConfig::default(),
            kv_quant: KvQuantSetting::Config,
            memory_budget_bytes: None,
        }
    }
}

/// What every handler shares: the model, the options, and the engine whose sessions run the
/// requests (one per server, so its batch and prompt cache are this server's).
pub struct App {
    pub ctx: Arc<ServerContext>,
    pub options: ServerOptions,
    pub engine: Arc<InferenceEngine>,
}

impl App {
    pub fn new(ctx: Arc<ServerContext>, options: ServerOptions) -> Self {
        let limits = EngineOptions {
            prefix_cache_bytes: options.prompt_cache_bytes,
            max_active: options.batch,
            max_queued: options.max_queued,
            fill: options.fill.clone(),
            memory_budget_bytes: options.memory_budget_bytes,
            ..Default::default()
        };
        let engine = InferenceEngine::new(Source::Model { id: ctx.model, vocab_size: ctx.vocab_size, checkpoints: ctx.checkpoints }, limits);
        App { ctx, options, engine }
    }
}

pub fn check_model(app: &App, model: &str) -> std::result::Result<(), ApiError> {
    if model == app.ctx.id {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::NOT_FOUND, "model_not_found", format!("model '{model}' is not served here; this server serves '{}'", app.ctx.id)))
    }
}

/// An id unique within the process, in each API's style (`chatcmpl-…`, `msg_…`).
pub fn request_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let sep = if prefix == "msg" { '_' } else { '-' };
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    format!("{prefix}{sep}{started:x}{:04x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A streamed answer: `first`, then the events `f` makes of each chunk of the run. The run
/// lives in the stream, so a client that goes away drops it, which cancels its session.
pub fn sse<F>(run: Run, first: Vec<Event>, log: LogSlot, f: F) -> Response
where
    F: FnMut(Result<Chunk, ApiError>) -> Vec<Event> + Send + 'static,
{
    struct Streaming<F> {
        run: Option<Run>,
        queue: VecDeque<Event>,
        log: LogSlot,
        f: F,
    }
    let state = Streaming { run: Some(run), queue: first.into(), log, f };
    let events = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(e) = st.queue.pop_front() {
                return Some((Ok::<_, Infallible>(e), st));
            }
            match st.run.as_mut()?.next().await {
                Some(chunk) => {
                    if let Ok(Chunk::Done(s)) = &chunk {
                        st.log.finish(s);
                    }
                    let events = (st.f)(chunk);
                    st.queue.extend(events);
                }
                // The run is over: the queue drains, then the stream ends.
                None => st.run = None,
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}
