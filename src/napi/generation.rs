//! Token delivery: `nextBatch()` resolves with every token already produced (one promise per
//! batch, not per token); index.js wraps it in an async generator.
use std::sync::atomic::Ordering;
use std::sync::Arc;

use napi::bindgen_prelude::Uint32Array;
use napi_derive::napi;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::Mutex;

use super::js_error;
use crate::engine::{Event, GenerationHandle};
use crate::sample::logprobs::TokenLogprobs;

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

#[napi(object)]
pub struct Batch {
    pub tokens: Uint32Array,
    /// Present when logprobs were requested: one entry per token.
    pub logprobs: Option<Vec<TokenLogprobsJs>>,
    /// Set on the last batch: `'stop' | 'length' | 'cancelled'`.
    pub finish_reason: Option<String>,
    /// Set on the last batch (`GenerateStats`).
    pub stats: Option<serde_json::Value>,
    /// `"CODE: message"` when the generation failed after producing these tokens.
    pub error: Option<String>,
}

#[napi]
pub struct NativeGeneration {
    events: Arc<Mutex<tokio::sync::mpsc::UnboundedReceiver<Event>>>,
    cancel: Arc<std::sync::atomic::AtomicBool>,
}

impl NativeGeneration {
    pub fn new(h: GenerationHandle) -> Self {
        NativeGeneration { events: Arc::new(Mutex::new(h.events)), cancel: h.cancel }
    }
}

fn logprobs_js(l: TokenLogprobs, with_top: bool) -> TokenLogprobsJs {
    TokenLogprobsJs {
        logprob: l.logprob as f64,
        top: with_top.then(|| l.top.into_iter().map(|t| TopLogprobJs { id: t.id, logprob: t.logprob as f64 }).collect()),
    }
}

#[napi]
impl NativeGeneration {
    /// Waits for the next token(s); `null` once the generation has ended and been reported.
    #[napi]
    pub async fn next_batch(&self) -> napi::Result<Option<Batch>> {
        let mut rx = self.events.lock().await;
        let Some(first) = rx.recv().await else { return Ok(None) };
        let mut tokens = Vec::new();
        let mut logprobs: Option<Vec<TokenLogprobsJs>> = None;
        let mut event = Some(first);
        while let Some(e) = event.take() {
            match e {
                Event::Token { id, logprobs: lp } => {
                    tokens.push(id);
                    if let Some(l) = lp {
                        let with_top = !l.top.is_empty();
                        logprobs.get_or_insert_with(Vec::new).push(logprobs_js(l, with_top));
                    }
                }
                Event::Done { reason, stats } => {
                    rx.close();
                    return Ok(Some(Batch {
                        tokens: tokens.into(),
                        logprobs,
                        finish_reason: serde_json::to_value(reason).ok().and_then(|v| v.as_str().map(str::to_owned)),
                        stats: serde_json::to_value(stats).ok(),
                        error: None,
                    }));
                }
                Event::Failed(err) => {
                    rx.close();
                    // Tokens produced before the failure are not lost: they arrive with the error.
                    if tokens.is_empty() {
                        return Err(js_error(err));
                    }
                    let error = Some(format!("{}: {err}", err.code()));
                    return Ok(Some(Batch { tokens: tokens.into(), logprobs, finish_reason: None, stats: None, error }));
                }
            }
            event = match rx.try_recv() {
                Ok(e) => Some(e),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => None,
            };
        }
        Ok(Some(Batch { tokens: tokens.into(), logprobs, finish_reason: None, stats: None, error: None }))
    }

    /// Asks the engine to stop; the final batch then reports `finishReason: 'cancelled'`.
    #[napi]
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
    }
}

impl Drop for NativeGeneration {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Release);
    }
}
