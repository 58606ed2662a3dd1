//! The HTTP server for JavaScript: `loadContext` (a model for serving, loading on the engine
//! thread) and `createServer` (the same server `mlx-bun serve` runs, on its own threads).
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use napi::bindgen_prelude::PromiseRaw;
use napi::Env;
use napi_derive::napi;

use super::js_error;
use super::model::{f32_matmuls, wait_loaded, Load, LoadOptions};
use crate::engine::fill::FillConfig;
use crate::error::Error;
use crate::server::{ContextOptions, KvQuantSetting, LogFormat, Server, ServerContext as CoreContext, ServerOptions as CoreOptions};

/// A model ready to serve: its tokenizer, chat template and sampling defaults; the weights load
/// on the engine thread (requests wait behind the load).
#[napi]
pub struct ServerContext {
    inner: Arc<CoreContext>,
    load: Arc<tokio::sync::Mutex<Load>>,
}

/// `chatTemplate`: a template's source, used instead of the model's own.
#[napi(catch_unwind)]
pub fn load_context_native(path: String, id: Option<String>, options: Option<LoadOptions>, chat_template: Option<String>, memory_budget_bytes: Option<f64>) -> napi::Result<ServerContext> {
    let f32_matmuls = f32_matmuls(options)?;
    let memory_budget_bytes = memory_budget_bytes.map(|v| whole("memoryBudgetBytes", v, 1.0, SAFE)).transpose()?;
    let (ctx, loaded) = CoreContext::open(Path::new(&path), ContextOptions { id, f32_matmuls, chat_template, memory_budget_bytes }).map_err(js_error)?;
    Ok(ServerContext { inner: Arc::new(ctx), load: Arc::new(tokio::sync::Mutex::new(Load::Pending(loaded))) })
}

#[napi]
impl ServerContext {
    /// The name clients send as `model`.
    #[napi(getter, catch_unwind)]
    pub fn id(&self) -> String {
        self.inner.id.clone()
    }

    /// Resolves once the model is loaded; rejects with the load's typed error.
    #[napi(catch_unwind)]
    pub fn loaded<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, ()>> {
        env.spawn_future(wait_loaded(self.load.clone()))
    }
}

/// `createServer`'s options (index.d.ts documents them; index.js checks the keys).
#[napi(object)]
#[derive(Default)]
pub struct ServerOptions {
    pub host: Option<String>,
    pub api_key: Option<String>,
    pub cors_origins: Option<Vec<String>>,
    pub default_max_tokens: Option<f64>,
    pub default_temperature: Option<f64>,
    pub default_top_p: Option<f64>,
    pub default_top_k: Option<f64>,
    pub prompt_cache_bytes: Option<f64>,
    pub batch: Option<f64>,
    pub max_queued: Option<f64>,
    pub body_limit: Option<f64>,
    pub log: Option<String>,
    pub shutdown_grace_ms: Option<f64>,
    pub fill: Option<serde_json::Value>,
    /// `'off'`, `'config'` (the default) or a number of bits.
    pub kv_quant: Option<serde_json::Value>,
    pub memory_budget_bytes: Option<f64>,
}

/// A whole number in `[min, max]`, or the option's error.
fn whole(name: &'static str, v: f64, min: f64, max: f64) -> napi::Result<u64> {
    if v.fract() == 0.0 && v >= min && v <= max {
        Ok(v as u64)
    } else {
        Err(js_error(Error::option(name, format!("must be an integer in [{min}, {max}], got {v}"))))
    }
}

fn unit(name: &'static str, v: f64, max: f64) -> napi::Result<f32> {
    if v.is_finite() && (0.0..=max).contains(&v) {
        Ok(v as f32)
    } else {
        Err(js_error(Error::option(name, format!("must be a number in [0, {max}], got {v}"))))
    }
}

const SAFE: f64 = 9_007_199_254_740_991.0;

fn core_options(port: u32, o: ServerOptions) -> napi::Result<CoreOptions> {
    let d = CoreOptions::default();
    let port = whole("port", port as f64, 0.0, 65_535.0)? as u16;
    Ok(CoreOptions {
        host: o.host.unwrap_or(d.host),
        port,
        api_key: o.api_key.filter(|k| !k.is_empty()),
        cors_origins: o.cors_origins.unwrap_or_default(),
        default_max_tokens: o.default_max_tokens.map(|v| whole("defaultMaxTokens", v, 1.0, u32::MAX as f64)).transpose()?.map(|v| v as u32),
        default_temperature: o.default_temperature.map(|v| unit("defaultTemperature", v, f32::MAX as f64)).transpose()?,
        default_top_p: o.default_top_p.map(|v| unit("defaultTopP", v, 1.0)).transpose()?,
        default_top_k: o.default_top_k.map(|v| whole("defaultTopK", v, 0.0, u32::MAX as f64)).transpose()?.map(|v| v as u32),
        prompt_cache_bytes: o.prompt_cache_bytes.map(|v| whole("promptCacheBytes", v, 0.0, SAFE)).transpose()?.unwrap_or(d.prompt_cache_bytes),
        batch: o.batch.map(|v| whole("batch", v, 1.0, 4096.0)).transpose()?.map_or(d.batch, |v| v as usize),
        max_queued: o.max_queued.map(|v| whole("maxQueued", v, 0.0, 1e6)).transpose()?.map_or(d.max_queued, |v| v as usize),
        body_limit: o.body_limit.map(|v| whole("bodyLimit", v, 1.0, (1u64 << 32) as f64)).transpose()?.map_or(d.body_limit, |v| v as usize),
        log: match o.log.as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some("off") => LogFormat::Off,
            Some(other) => return Err(js_error(Error::option("log", format!("must be 'text', 'json' or 'off', got '{other}'")))),
        },
        shutdown_grace: o.shutdown_grace_ms.map(|v| whole("shutdownGraceMs", v, 0.0, SAFE)).transpose()?.map_or(d.shutdown_grace, Duration::from_millis),
        memory_budget_bytes: o.memory_budget_bytes.map(|v| whole("memoryBudgetBytes", v, 1.0, SAFE)).transpose()?,
        kv_quant: match &o.kv_quant {
            None => d.kv_quant,
            Some(serde_json::Value::String(s)) => KvQuantSetting::parse(s).map_err(js_error)?,
            Some(serde_json::Value::Number(n)) => KvQuantSetting::parse(&n.to_string()).map_err(js_error)?,
            Some(other) => return Err(js_error(Error::option("kvQuant", format!("must be 'off', 'config' or a number of bits, got {other}")))),
        },
        fill: {
            let env = FillConfig::from_env().map_err(js_error)?;
            match &o.fill {
                Some(v) => FillConfig::from_json(v, env).map_err(js_error)?,
                None => env,
            }
        },
    })
}

/// A running server. It runs until `close()`, whether or not JavaScript keeps this handle.
#[napi]
pub struct HttpServer {
    inner: Arc<Mutex<Option<Server>>>,
    url: String,
    port: u32,
}

/// Servers keep running when their handle is collected, as `Bun.serve`'s do; `close()` ends one.
static RUNNING: Mutex<Vec<Arc<Mutex<Option<Server>>>>> = Mutex::new(Vec::new());

#[napi(catch_unwind)]
pub fn create_server_native(ctx: &ServerContext, port: u32, options: Option<ServerOptions>) -> napi::Result<HttpServer> {
    let options = core_options(port, options.unwrap_or_default())?;
    let server = Server::start(ctx.inner.clone(), options).map_err(js_error)?;
    let (url, port) = (server.url(), server.addr.port() as u32);
    let inner = Arc::new(Mutex::new(Some(server)));
    RUNNING.lock().unwrap_or_else(|e| e.into_inner()).push(inner.clone());
    Ok(HttpServer { inner, url, port })
}

#[napi]
impl HttpServer {
    #[napi(getter, catch_unwind)]
    pub fn url(&self) -> String {
        self.url.clone()
    }

    #[napi(getter, catch_unwind)]
    pub fn port(&self) -> u32 {
        self.port
    }

    /// Stops accepting, lets in-flight requests finish within the grace period, cancels the
    /// rest; resolves once the server is down. (The wait runs on a thread of its own.)
    #[napi(catch_unwind)]
    pub fn close<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, ()>> {
        let inner = self.inner.clone();
        RUNNING.lock().unwrap_or_else(|e| e.into_inner()).retain(|s| !Arc::ptr_eq(s, &inner));
        let (done, closed) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let server = inner.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(mut s) = server {
                s.close();
            }
            let _ = done.send(());
        });
        env.spawn_future(async move {
            let _ = closed.await;
            Ok(())
        })
    }
}
