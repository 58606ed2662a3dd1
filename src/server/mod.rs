//! The HTTP server: OpenAI's and Anthropic's APIs over one engine, on axum (hyper, tokio).
//! `mlx-bun serve` runs it from the CLI binary; `createServer` runs the same server inside the
//! addon. Handlers never touch MLX: each request becomes an engine session, and the engine
//! thread batches all of them (continuous batching across clients, the prefix cache across
//! turns). The server has its own small tokio runtime, so it works the same in both hosts.
mod anthropic;
mod app;
mod body;
mod channels;
mod context;
mod embeddings;
mod error;
mod fit;
mod generation;
mod log;
mod openai;
mod params;
mod prompt;
mod stop;
mod tool_choice;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use subtle::ConstantTimeEq;
use tower_http::cors::{AllowOrigin, CorsLayer};

use app::App;
pub use app::{KvQuantSetting, ServerOptions, DEFAULT_BODY_LIMIT};
pub use context::{eos_ids, ContextOptions, ServerContext};
use error::ApiError;
pub use log::LogFormat;

use crate::error::{Error, Result};

/// A running server. `close` (or dropping it) stops it.
pub struct Server {
    pub addr: SocketAddr,
    app: Arc<App>,
    shutdown: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Binds now (so a taken port fails here) and serves on a thread of its own.
    pub fn start(ctx: Arc<ServerContext>, options: ServerOptions) -> Result<Server> {
        let listener = std::net::TcpListener::bind((options.host.as_str(), options.port))
            .map_err(|e| Error::io(format!("{}:{}", options.host, options.port), e))?;
        listener.set_nonblocking(true).map_err(|e| Error::io("listener", e))?;
        let addr = listener.local_addr().map_err(|e| Error::io("listener", e))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("mlx-bun-http")
            .enable_all()
            .build()
            .map_err(|e| Error::Internal(format!("server runtime: {e}")))?;
        let app = Arc::new(App::new(ctx, options));
        let (shutdown, mut stop) = tokio::sync::watch::channel(false);
        let router = router(app.clone());
        let serving = app.clone();
        let thread = std::thread::Builder::new()
            .name("mlx-bun-server".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                    let mut graceful = stop.clone();
                    let server = tokio::spawn(async move {
                        let stopping = async move {
                            let _ = graceful.wait_for(|s| *s).await;
                        };
                        axum::serve(listener, router).with_graceful_shutdown(stopping).await
                    });
                    let _ = stop.wait_for(|s| *s).await;
                    let grace = serving.options.shutdown_grace;
                    let mut server = server;
                    if tokio::time::timeout(grace, &mut server).await.is_err() {
                        serving.engine.close();
                        // A cancelled session ends within an engine step; a client that reads
                        // nothing more is not waited for.
                        let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
                    }
                });
                runtime.shutdown_timeout(Duration::from_secs(1));
            })
            .map_err(|e| Error::Internal(format!("server thread: {e}")))?;
        Ok(Server { addr, app, shutdown, thread: Some(thread) })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, lets in-flight requests finish within the grace period, cancels the
    /// rest, and returns once the server is down.
    pub fn close(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.app.engine.close();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.close();
    }
}

fn router(app: Arc<App>) -> Router {
    let mut router = Router::new()
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{id}", get(openai::model))
        .route("/health", get(health))
        .route("/stats", get(stats))
        .route("/fit", get(fit::fit))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(app.options.body_limit))
        .layer(from_fn_with_state(app.clone(), authorize))
        .layer(from_fn_with_state(app.options.log, log::log_requests));
    if !app.options.cors_origins.is_empty() {
        let origins: Vec<HeaderValue> = app.options.cors_origins.iter().filter_map(|o| o.parse().ok()).collect();
        router = router.layer(
            CorsLayer::new()
                .allow_origin(AllowOrigin::list(origins))
                .allow_methods([Method::GET, Method::POST])
                // Browser SDKs send their own headers (`anthropic-version`, `x-stainless-*`).
                .allow_headers(tower_http::cors::Any),
        );
    }
    router.with_state(app)
}

/// With an API key set, every route but `/health` needs it (compared in constant time).
async fn authorize(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let Some(key) = &app.options.api_key else { return next.run(request).await };
    if request.uri().path() == "/health" || request.method() == Method::OPTIONS {
        return next.run(request).await;
    }
    let given = presented_key(request.headers());
    if given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(key.as_bytes()))) {
        return next.run(request).await;
    }
    let e = ApiError::new(StatusCode::UNAUTHORIZED, "invalid_api_key", "a valid API key is required (Authorization: Bearer KEY or x-api-key)");
    let dialect = if request.uri().path() == "/v1/messages" { error::Dialect::Anthropic } else { error::Dialect::OpenAi };
    e.in_dialect(dialect).into_response()
}

fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        return v.strip_prefix("Bearer ");
    }
    headers.get("x-api-key").and_then(|v| v.to_str().ok())
}

async fn health(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(json!({"status": "ok", "model": app.ctx.id}))
}

async fn stats(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let s = app.engine.stats();
    let o = app.engine.options();
    let p = s.prefix_cache;
    Json(json!({
        "model": app.ctx.id,
        "live_sessions": s.live_sessions,
        "running": s.running,
        "idle": s.idle,
        "max_active": o.max_active,
        "max_queued": o.max_queued,
        "prefix_cache": {
            "hits": p.hits, "misses": p.misses, "hit_tokens": p.hit_tokens, "evictions": p.evictions,
            "shared_prefills": p.shared_prefills, "shared_tokens": p.shared_tokens,
            "bytes": p.bytes, "entries": p.entries, "max_bytes": o.prefix_cache_bytes,
        },
    }))
}

async fn not_found(request: Request) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no route {} {}", request.method(), request.uri().path()))
}

