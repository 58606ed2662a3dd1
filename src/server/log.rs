//! One log line per request on stderr: method, path, status, prompt / cached / generated tokens,
//! time to first token and duration. A streamed answer is logged when its stream ends: the line
//! is shared by the middleware and the stream, and written when the last of them lets go.
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;
use serde_json::json;

use super::generation::Summary;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LogFormat {
    Text,
    Json,
    Off,
}

struct Line {
    format: LogFormat,
    method: String,
    path: String,
    status: u16,
    prompt_tokens: Option<usize>,
    summary: Option<Summary>,
    user: Option<String>,
    started: Instant,
}

/// The request's log line, as handlers fill it in.
#[derive(Clone)]
pub struct LogSlot(Option<Arc<Mutex<Line>>>);

impl LogSlot {
    fn with(&self, f: impl FnOnce(&mut Line)) {
        if let Some(line) = &self.0 {
            f(&mut line.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }

    /// The prompt is tokenized and a session is about to open.
    pub fn begin(&self, prompt_tokens: usize, user: Option<String>) {
        self.with(|l| {
            l.prompt_tokens = Some(prompt_tokens);
            l.user = user;
        });
    }

    pub fn finish(&self, summary: &Summary) {
        self.with(|l| l.summary = Some(summary.clone()));
    }
}

impl<S: Send + Sync> FromRequestParts<S> for LogSlot {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(parts.extensions.get::<LogSlot>().cloned().unwrap_or(LogSlot(None)))
    }
}

pub async fn log_requests(State(format): State<LogFormat>, mut request: Request, next: Next) -> Response {
    if format == LogFormat::Off {
        return next.run(request).await;
    }
    let slot = LogSlot(Some(Arc::new(Mutex::new(Line {
        format,
        method: request.method().to_string(),
        path: request.uri().path().to_string(),
        status: 0,
        prompt_tokens: None,
        summary: None,
        user: None,
        started: Instant::now(),
    }))));
    request.extensions_mut().insert(slot.clone());
    let response = next.run(request).await;
    let status = response.status().as_u16();
    slot.with(|l| l.status = status);
    response
}

impl Drop for Line {
    fn drop(&mut self) {
        let ms = self.started.elapsed().as_secs_f64() * 1e3;
        let s = self.summary.as_ref();
        let prompt = s.map(|s| s.prompt_tokens as usize).or(self.prompt_tokens);
        match self.format {
            LogFormat::Off => {}
            LogFormat::Json => eprintln!(
                "{}",
                json!({
                    "method": self.method, "path": self.path, "status": self.status,
                    "prompt_tokens": prompt, "cached_tokens": s.map(|s| s.cached_tokens),
                    "generated_tokens": s.map(|s| s.completion_tokens), "ttft_ms": s.map(|s| round(s.ttft_ms)),
                    "duration_ms": round(ms), "user": self.user,
                })
            ),
            LogFormat::Text => {
                let mut line = format!("{} {} {}", self.method, self.path, self.status);
                if let Some(p) = prompt {
                    line += &format!(" prompt={p}");
                }
                if let Some(s) = s {
                    line += &format!(" cached={} generated={} ttft={:.1}ms", s.cached_tokens, s.completion_tokens, s.ttft_ms);
                }
                eprintln!("{line} {ms:.1}ms");
            }
        }
    }
}

fn round(ms: f64) -> f64 {
    (ms * 10.0).round() / 10.0
}
