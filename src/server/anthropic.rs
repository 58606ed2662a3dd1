//! Anthropic's Messages API: `POST /v1/messages`, streaming as the event sequence
//! `message_start`, `ping`, then per content block `content_block_start`,
//! `content_block_delta`…, `content_block_stop`, then `message_delta`, `message_stop`. Client
//! tools are rendered by the chat template and the model's calls come back as `tool_use` blocks.
use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value as Json_};

use super::error::{ApiError, Dialect};
use super::generation::{Chunk, Run, Summary};
use super::channels::{Split, ToolCall};
use super::tool_choice::ToolChoice;
use super::prompt::{chat_prompt, text_content, ChatPrompt};
use super::params::Sampling;
use super::app::{check_model, request_id, sse, App};
use super::body;
use super::log::LogSlot;
use crate::engine::FinishReason;

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
    tools: Option<Vec<Json_>>,
    tool_choice: Option<Json_>,
    thinking: Option<Json_>,
}

/// Anthropic's messages as OpenAI-shaped ones for the chat template: `tool_use` blocks become an
/// assistant's `tool_calls`, each `tool_result` block a `tool` message, text blocks the content.
fn openai_messages(system: Option<Json_>, messages: Vec<Json_>) -> Result<Vec<Json_>, ApiError> {
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
        let blocks = match m.get("content") {
            Some(Json_::Array(blocks)) => blocks.as_slice(),
            other => {
                out.push(json!({"role": role, "content": text_content(other.unwrap_or(&Json_::Null), &format!("messages[{i}].content"))?}));
                continue;
            }
        };
        let (mut text, mut calls, mut results) = (String::new(), Vec::new(), Vec::new());
        for (j, b) in blocks.iter().enumerate() {
            let at = format!("messages[{i}].content[{j}]");
            match (b.get("type").and_then(Json_::as_str), role) {
                (Some("text"), _) => text += &text_content(&Json_::Array(vec![b.clone()]), &at)?,
                (Some("tool_use"), "assistant") => calls.push(json!({"id": b["id"], "type": "function",
                    "function": {"name": b["name"], "arguments": b.get("input").cloned().unwrap_or_else(|| json!({}))}})),
                (Some("tool_result"), "user") => results.push(json!({"role": "tool", "tool_call_id": b["tool_use_id"],
                    "content": text_content(b.get("content").unwrap_or(&Json_::Null), &format!("{at}.content"))?})),
                (Some(kind), _) => return Err(ApiError::unsupported(&format!("{at}.type={kind}"), &format!("not served in a {role} message"))),
                (None, _) => return Err(ApiError::param(&at, "needs a type")),
            }
        }
        let had_results = !results.is_empty();
        out.extend(results);
        if role == "assistant" {
            let mut message = json!({"role": "assistant", "content": text});
            if !calls.is_empty() {
                message["tool_calls"] = Json_::Array(calls);
            }
            out.push(message);
        } else if !text.is_empty() || !had_results {
            out.push(json!({"role": "user", "content": text}));
        }
    }
    Ok(out)
}

/// Anthropic's client tools as the OpenAI-shaped ones chat templates render.
fn openai_tools(tools: Vec<Json_>) -> Result<Vec<Json_>, ApiError> {
    tools
        .into_iter()
        .enumerate()
        .map(|(i, t)| match (t.get("type"), t.get("name")) {
            (Some(kind), _) if kind != "custom" => Err(ApiError::unsupported(&format!("tools[{i}].type={kind}"), "server tools are not served")),
            (_, Some(name)) => Ok(json!({"type": "function", "function": {
                "name": name, "description": t.get("description").cloned().unwrap_or_default(),
                "parameters": t.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"}))}})),
            _ => Err(ApiError::param(&format!("tools[{i}].name"), "is required")),
        })
        .collect()
}

pub async fn messages(State(app): State<Arc<App>>, log: LogSlot, bytes: body::Body) -> Result<Response, ApiError> {
    handle(app, log, bytes).await.map_err(|e| e.in_dialect(Dialect::Anthropic))
}

async fn handle(app: Arc<App>, log: LogSlot, bytes: body::Body) -> Result<Response, ApiError> {
    let r: MessagesRequest = bytes.json()?;
    check_model(&app, &r.model)?;
    if r.thinking.is_some() {
        return Err(ApiError::unsupported("thinking", "extended thinking is not served yet"));
    }
    let choice = ToolChoice::anthropic(r.tool_choice.as_ref())?;
    let tools = r.tools.map(openai_tools).transpose()?;
    let ctx = &app.ctx;
    let ChatPrompt { ids: prompt, mut channels, forced, fill } = chat_prompt(ctx, openai_messages(r.system, r.messages)?, tools, &choice, Default::default(), app.options.fill.enabled())?;
    let sampling = Sampling { max_tokens: Some(r.max_tokens), temperature: r.temperature, top_p: r.top_p, top_k: r.top_k, ..Default::default() };
    let mut opts = sampling.options(ctx, &app.options, r.max_tokens)?;
    opts.grammar = forced;
    let user = r.metadata.as_ref().and_then(|m| m.get("user_id")).and_then(Json_::as_str).map(str::to_owned);
    let input_tokens = prompt.len();
    log.begin(input_tokens, user);
    let run = Run::start(&app.engine, ctx, prompt, opts, r.stop_sequences.unwrap_or_default(), fill)?;
    let id = request_id("msg");
    let model = ctx.id.clone();
    if !r.stream.unwrap_or(false) {
        let (all, summary) = run.collect().await?;
        log.finish(&summary);
        let split = channels.whole(&all.text);
        let mut content = Vec::new();
        if !split.reasoning.is_empty() {
            content.push(json!({"type": "thinking", "thinking": split.reasoning, "signature": ""}));
        }
        if !split.content.trim().is_empty() || split.calls.is_empty() {
            content.push(json!({"type": "text", "text": split.content}));
        }
        content.extend(split.calls.iter().enumerate().map(|(n, c)| tool_use(&id, n, c)));
        return Ok(Json(json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason(&summary, !split.calls.is_empty()),
            "stop_sequence": summary.stop_sequence,
            "usage": usage(&summary),
        }))
        .into_response());
    }
    let first = vec![
        event("message_start", json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0}}})),
        event("ping", json!({"type": "ping"})),
    ];
    let mut blocks = Blocks { id, next: 0, open: None, calls: 0 };
    Ok(sse(run, first, log, move |c| match c {
        Ok(Chunk::Piece(p)) => blocks.split(channels.push(&p.text)),
        Ok(Chunk::Done(s)) => {
            let mut events = blocks.split(channels.finish());
            if blocks.next == 0 {
                events.extend(blocks.open_block(Kind::Text));
            }
            events.extend(blocks.close());
            events.push(event("message_delta", json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason(&s, blocks.calls > 0), "stop_sequence": s.stop_sequence}, "usage": usage(&s)})));
            events.push(event("message_stop", json!({"type": "message_stop"})));
            events
        }
        Err(e) => {
            let e = e.in_dialect(Dialect::Anthropic);
            vec![event("error", json!({"type": "error", "error": {"type": "api_error", "message": e.message}}))]
        }
    }))
}

fn event(name: &str, data: Json_) -> Event {
    Event::default().event(name).data(data.to_string())
}

fn tool_use(id: &str, n: usize, call: &ToolCall) -> Json_ {
    let input: Json_ = serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
    json!({"type": "tool_use", "id": format!("toolu_{}_{n}", id.trim_start_matches("msg_")), "name": call.name, "input": input})
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Text,
    Thinking,
}

/// A streamed message's content blocks: each opened when its first delta comes, closed when a
/// block of another kind begins; a tool call is a block of its own.
struct Blocks {
    id: String,
    next: usize,
    open: Option<(usize, Kind)>,
    calls: usize,
}

impl Blocks {
    fn open_block(&mut self, kind: Kind) -> Vec<Event> {
        let mut events = self.close();
        let block = match kind {
            Kind::Text => json!({"type": "text", "text": ""}),
            Kind::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
        };
        events.push(event("content_block_start", json!({"type": "content_block_start", "index": self.next, "content_block": block})));
        self.open = Some((self.next, kind));
        self.next += 1;
        events
    }

    fn close(&mut self) -> Vec<Event> {
        self.open.take().map(|(index, _)| event("content_block_stop", json!({"type": "content_block_stop", "index": index}))).into_iter().collect()
    }

    fn delta(&mut self, kind: Kind, text: String) -> Vec<Event> {
        let mut events = if self.open.map(|(_, k)| k) == Some(kind) { Vec::new() } else { self.open_block(kind) };
        let index = self.next - 1;
        let delta = match kind {
            Kind::Text => json!({"type": "text_delta", "text": text}),
            Kind::Thinking => json!({"type": "thinking_delta", "thinking": text}),
        };
        events.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": delta})));
        events
    }

    fn split(&mut self, split: Split) -> Vec<Event> {
        let mut events = Vec::new();
        if !split.reasoning.is_empty() {
            events.extend(self.delta(Kind::Thinking, split.reasoning));
        }
        if !split.content.is_empty() {
            events.extend(self.delta(Kind::Text, split.content));
        }
        for call in &split.calls {
            events.extend(self.close());
            let mut block = tool_use(&self.id, self.calls, call);
            let input = std::mem::replace(&mut block["input"], json!({}));
            events.push(event("content_block_start", json!({"type": "content_block_start", "index": self.next, "content_block": block})));
            events.push(event("content_block_delta", json!({"type": "content_block_delta", "index": self.next,
                "delta": {"type": "input_json_delta", "partial_json": input.to_string()}})));
            events.push(event("content_block_stop", json!({"type": "content_block_stop", "index": self.next})));
            self.next += 1;
            self.calls += 1;
        }
        events
    }
}

fn stop_reason(s: &Summary, called: bool) -> &'static str {
    match (s.finish_reason, &s.stop_sequence) {
        _ if called => "tool_use",
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
