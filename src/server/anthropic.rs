//! Anthropic's Messages API: `POST /v1/messages`, streaming as the event sequence
//! `message_start`, `content_block_start`, `ping`, `content_block_delta`…, `content_block_stop`,
//! `message_delta`, `message_stop`.
use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value as Json_};

use super::error::{ApiError, Dialect};
use super::generation::{Chunk, Run, Summary};
use super::openai::text_content;
use super::params::Sampling;
use super::app::{check_model, request_id, sse, App};
use super::body;
use super::log::LogSlot;
use crate::engine::FinishReason;
use crate::tokenizer::template::RenderOptions;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessagesRequest {
    model: String,
    messages: Vec<Json_>,
    /// Required, as in Anthropic's API.
    max_tokens: u32,
    system: Option<Json_>,
    stop_sequences: Option<Vec<String>>,
    stream: Option<bool>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    /// `{user_id}`: informational, written to the request log.
    metadata: Option<Json_>,
    tools: Option<Json_>,
    tool_choice: Option<Json_>,
    thinking: Option<Json_>,
}

fn template_messages(system: Option<Json_>, messages: Vec<Json_>) -> Result<Json_, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::param("messages", "must not be empty"));
    }
    let mut out = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = system {
        out.push(json!({"role": "system", "content": text_content(&system, "system")?}));
    }
    for (i, m) in messages.iter().enumerate() {
        let role = match m.get("role").and_then(Json_::as_str) {
            Some(r @ ("user" | "assistant")) => r,
            Some(r) => return Err(ApiError::param(&format!("messages[{i}].role"), format!("must be user or assistant, got '{r}'"))),
            None => return Err(ApiError::param(&format!("messages[{i}].role"), "is required")),
        };
        let content = text_content(m.get("content").unwrap_or(&Json_::Null), &format!("messages[{i}].content"))?;
        out.push(json!({"role": role, "content": content}));
    }
    Ok(Json_::Array(out))
}

pub async fn messages(State(app): State<Arc<App>>, log: LogSlot, bytes: body::Body) -> Result<Response, ApiError> {
    handle(app, log, bytes).await.map_err(|e| e.in_dialect(Dialect::Anthropic))
}

async fn handle(app: Arc<App>, log: LogSlot, bytes: body::Body) -> Result<Response, ApiError> {
    let r: MessagesRequest = bytes.json()?;
    check_model(&app, &r.model)?;
    if r.tools.is_some() || r.tool_choice.is_some() {
        return Err(ApiError::unsupported("tools", "tool use is not served yet"));
    }
    if r.thinking.is_some() {
        return Err(ApiError::unsupported("thinking", "extended thinking is not served yet"));
    }
    let ctx = &app.ctx;
    let template = ctx.template.as_ref().ok_or_else(|| ApiError::bad_request(format!("{} has no chat template", ctx.id)))?;
    let text = template.render(&template_messages(r.system, r.messages)?, &RenderOptions::default())?;
    let prompt = ctx.tokenizer.encode(&text, false)?;
    let sampling = Sampling { max_tokens: Some(r.max_tokens), temperature: r.temperature, top_p: r.top_p, top_k: r.top_k, ..Default::default() };
    let opts = sampling.options(ctx, &app.options, r.max_tokens)?;
    let user = r.metadata.as_ref().and_then(|m| m.get("user_id")).and_then(Json_::as_str).map(str::to_owned);
    let input_tokens = prompt.len();
    log.begin(input_tokens, user);
    let run = Run::start(&app.engine, ctx, prompt, opts, r.stop_sequences.unwrap_or_default())?;
    let id = request_id("msg");
    let model = ctx.id.clone();
    if !r.stream.unwrap_or(false) {
        let (all, summary) = run.collect().await?;
        log.finish(&summary);
        return Ok(Json(json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": all.text}],
            "stop_reason": stop_reason(&summary),
            "stop_sequence": summary.stop_sequence,
            "usage": usage(&summary),
        }))
        .into_response());
    }
    let event = |name: &str, data: Json_| Event::default().event(name).data(data.to_string());
    let first = vec![
        event("message_start", json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0}}})),
        event("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
        event("ping", json!({"type": "ping"})),
    ];
    Ok(sse(run, first, log, move |c| match c {
        Ok(Chunk::Piece(p)) if p.text.is_empty() => vec![],
        Ok(Chunk::Piece(p)) => {
            vec![event("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p.text}}))]
        }
        Ok(Chunk::Done(s)) => vec![
            event("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
            event("message_delta", json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason(&s), "stop_sequence": s.stop_sequence}, "usage": usage(&s)})),
            event("message_stop", json!({"type": "message_stop"})),
        ],
        Err(e) => {
            let e = e.in_dialect(Dialect::Anthropic);
            vec![event("error", json!({"type": "error", "error": {"type": "api_error", "message": e.message}}))]
        }
    }))
}

fn stop_reason(s: &Summary) -> &'static str {
    match (s.finish_reason, &s.stop_sequence) {
        (_, Some(_)) => "stop_sequence",
        (FinishReason::Stop, None) => "end_turn",
        (FinishReason::Length, None) => "max_tokens",
    }
}

/// Anthropic counts prompt tokens read from its cache apart from the others.
fn usage(s: &Summary) -> Json_ {
    json!({
        "input_tokens": s.prompt_tokens - s.cached_tokens.min(s.prompt_tokens),
        "cache_read_input_tokens": s.cached_tokens,
        "output_tokens": s.completion_tokens,
    })
}
