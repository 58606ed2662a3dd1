//! OpenAI's API: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, with
//! their streaming (server-sent events ending in `data: [DONE]`) and usage shapes.
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value as Json_};

use super::channels::{Split, ToolCall};
use super::error::ApiError;
use super::generation::{Chunk, Piece, Run, Summary};
use super::params::{Sampling, Stop};
use super::tool_choice::ToolChoice;
use super::prompt::{chat_prompt, ChatPrompt};
use super::app::{check_model, request_id, sse, App};
use super::body;
use super::log::LogSlot;
use crate::engine::FinishReason;
use crate::sample::grammar::GrammarSpec;
use crate::sample::logprobs::TokenLogprobs;
use crate::tokenizer::Tokenizer;

/// mlx-bun's default `max_tokens` for chat completions (`defaultMaxTokens`).
pub const DEFAULT_CHAT_MAX_TOKENS: u32 = 65_536;
/// ... and for plain completions.
pub const DEFAULT_COMPLETION_MAX_TOKENS: u32 = 512;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChatRequest {
    model: String,
    messages: Vec<Json_>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    min_p: Option<f32>,
    seed: Option<u64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    logit_bias: Option<BTreeMap<String, f32>>,
    stop: Option<Stop>,
    logprobs: Option<bool>,
    top_logprobs: Option<u32>,
    n: Option<u32>,
    /// An end-user identifier: informational, written to the request log.
    user: Option<String>,
    tools: Option<Vec<Json_>>,
    tool_choice: Option<Json_>,
    response_format: Option<Json_>,
    /// Further chat-template variables (`enable_thinking`, ...), as mlx-lm's server takes them.
    chat_template_kwargs: Option<serde_json::Map<String, Json_>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompletionRequest {
    model: String,
    prompt: Prompt,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    echo: Option<bool>,
    max_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    min_p: Option<f32>,
    seed: Option<u64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    logit_bias: Option<BTreeMap<String, f32>>,
    stop: Option<Stop>,
    n: Option<u32>,
    user: Option<String>,
    logprobs: Option<u32>,
    suffix: Option<String>,
}

fn refuse(present: bool, param: &str, why: &str) -> Result<(), ApiError> {
    if present {
        Err(ApiError::unsupported(param, why))
    } else {
        Ok(())
    }
}

/// OpenAI's `response_format`: `text` (no grammar), `json_object` (any JSON object) or
/// `json_schema` (`{ json_schema: { name, schema, strict } }`: a document valid against it).
fn response_format(f: &Json_) -> Result<Option<GrammarSpec>, ApiError> {
    let bad = |why: &str| ApiError::param("response_format", why.to_string());
    match f.get("type").and_then(Json_::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarSpec::JsonSchema(serde_json::json!({ "type": "object" })))),
        Some("json_schema") => {
            let schema = f.get("json_schema").ok_or_else(|| bad("json_schema is required with type 'json_schema'"))?;
            match schema.get("schema") {
                Some(s) if s.is_object() || s.is_boolean() => Ok(Some(GrammarSpec::JsonSchema(s.clone()))),
                Some(_) => Err(bad("json_schema.schema must be a JSON schema object")),
                None => Err(bad("json_schema.schema is required")),
            }
        }
        _ => Err(bad("type must be 'text', 'json_object' or 'json_schema'")),
    }
}

fn one_choice(n: Option<u32>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(_) => Err(ApiError::unsupported("n", "one choice per request")),
    }
}

pub async fn chat_completions(State(app): State<Arc<App>>, log: LogSlot, bytes: body::Body) -> Result<Response, ApiError> {
    let r: ChatRequest = bytes.json()?;
    check_model(&app, &r.model)?;
    one_choice(r.n)?;
    let grammar = r.response_format.as_ref().map(response_format).transpose()?.flatten();
    if let Some(g) = &grammar {
        g.check().map_err(|e| ApiError { param: Some("response_format".into()), ..ApiError::from(e) })?;
    }
    let ctx = &app.ctx;
    let choice = ToolChoice::openai(r.tool_choice.as_ref())?;
    let ChatPrompt { ids: prompt, mut channels, forced, fill } = chat_prompt(ctx, r.messages, r.tools, &choice, r.chat_template_kwargs.unwrap_or_default(), app.options.fill.enabled())?;
    let grammar = match (grammar, forced) {
        (Some(_), Some(_)) => return Err(ApiError::unsupported("response_format", "not with a tool_choice that forces a call")),
        (g, f) => g.or(f),
    };
    let sampling = Sampling {
        max_tokens: r.max_completion_tokens.or(r.max_tokens),
        temperature: r.temperature,
        top_p: r.top_p,
        top_k: r.top_k,
        min_p: r.min_p,
        seed: r.seed,
        presence_penalty: r.presence_penalty,
        frequency_penalty: r.frequency_penalty,
        repetition_penalty: r.repetition_penalty,
        logit_bias: r.logit_bias,
        top_logprobs: r.top_logprobs,
        logprobs: r.logprobs.unwrap_or(false),
    };
    let mut opts = sampling.options(ctx, &app.options, app.options.default_max_tokens.unwrap_or(DEFAULT_CHAT_MAX_TOKENS))?;
    opts.grammar = grammar;
    log.begin(prompt.len(), r.user);
    let run = Run::start(&app.engine, ctx, prompt, opts, r.stop.map(Stop::into_vec).unwrap_or_default(), fill)?;
    let id = request_id("chatcmpl");
    let (model, created) = (ctx.id.clone(), ctx.created);
    let tokenizer = ctx.tokenizer.clone();
    if !r.stream.unwrap_or(false) {
        let (all, summary) = run.collect().await?;
        log.finish(&summary);
        let split = channels.whole(&all.text);
        // With calls and no words, OpenAI's `content` is null.
        let content = if split.calls.is_empty() || !split.content.trim().is_empty() { Json_::from(split.content) } else { Json_::Null };
        let mut message = json!({"role": "assistant", "content": content});
        if !split.reasoning.is_empty() {
            message["reasoning_content"] = split.reasoning.into();
        }
        let reason = if split.calls.is_empty() { finish(&summary) } else { "tool_calls" };
        if !split.calls.is_empty() {
            message["tool_calls"] = tool_calls(&id, 0, &split.calls);
        }
        return Ok(Json(json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": chat_logprobs(&tokenizer, &all),
                "finish_reason": reason,
            }],
            "usage": usage(&summary),
        }))
        .into_response());
    }
    let include_usage = r.stream_options.unwrap_or_default().include_usage.unwrap_or(false);
    let call_ids = id.clone();
    let chunk = move |choices: Json_, usage: Option<Json_>| {
        let mut c = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices});
        if let Some(u) = usage {
            c["usage"] = u;
        }
        Event::default().data(c.to_string())
    };
    let first = chunk(json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]), None);
    let mut calls = 0;
    let mut delta = move |split: Split| -> Option<Json_> {
        let mut d = serde_json::Map::new();
        if !split.content.is_empty() {
            d.insert("content".into(), split.content.into());
        }
        if !split.reasoning.is_empty() {
            d.insert("reasoning_content".into(), split.reasoning.into());
        }
        if !split.calls.is_empty() {
            d.insert("tool_calls".into(), tool_calls(&call_ids, calls, &split.calls));
            calls += split.calls.len();
        }
        (!d.is_empty()).then_some(Json_::Object(d))
    };
    let mut called = false;
    Ok(sse(run, vec![first], log, move |c| match c {
        Ok(Chunk::Piece(p)) => {
            let split = channels.push(&p.text);
            called |= !split.calls.is_empty();
            let lp = chat_logprobs(&tokenizer, &p);
            match delta(split) {
                Some(d) => vec![chunk(json!([{"index": 0, "delta": d, "logprobs": lp, "finish_reason": null}]), None)],
                None if !lp.is_null() => vec![chunk(json!([{"index": 0, "delta": {"content": ""}, "logprobs": lp, "finish_reason": null}]), None)],
                None => vec![],
            }
        }
        Ok(Chunk::Done(s)) => {
            let rest = channels.finish();
            called |= !rest.calls.is_empty();
            let mut events: Vec<Event> = delta(rest).map(|d| chunk(json!([{"index": 0, "delta": d, "logprobs": null, "finish_reason": null}]), None)).into_iter().collect();
            let reason = if called { "tool_calls" } else { finish(&s) };
            events.push(chunk(json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": reason}]), None));
            if include_usage {
                events.push(chunk(json!([]), Some(usage(&s))));
            }
            events.push(Event::default().data("[DONE]"));
            events
        }
        Err(e) => vec![error_event(e)],
    }))
}

pub async fn completions(State(app): State<Arc<App>>, log: LogSlot, bytes: body::Body) -> Result<Response, ApiError> {
    let r: CompletionRequest = bytes.json()?;
    check_model(&app, &r.model)?;
    one_choice(r.n)?;
    refuse(r.suffix.is_some(), "suffix", "fill-in-the-middle is not served yet")?;
    refuse(r.logprobs.is_some(), "logprobs", "this route reports no logprobs yet; /v1/chat/completions does")?;
    let ctx = &app.ctx;
    let (prompt, prompt_text) = match r.prompt {
        Prompt::Text(t) => (ctx.tokenizer.encode(&t, true)?, t),
        Prompt::Texts(mut t) if t.len() == 1 => {
            let t = t.remove(0);
            (ctx.tokenizer.encode(&t, true)?, t)
        }
        Prompt::Texts(_) => return Err(ApiError::unsupported("prompt", "one prompt per request")),
        Prompt::Ids(ids) => {
            let text = ctx.tokenizer.decode(&ids, false)?;
            (ids, text)
        }
    };
    let sampling = Sampling {
        max_tokens: r.max_tokens,
        temperature: r.temperature,
        top_p: r.top_p,
        top_k: r.top_k,
        min_p: r.min_p,
        seed: r.seed,
        presence_penalty: r.presence_penalty,
        frequency_penalty: r.frequency_penalty,
        repetition_penalty: r.repetition_penalty,
        logit_bias: r.logit_bias,
        ..Default::default()
    };
    let opts = sampling.options(ctx, &app.options, app.options.default_max_tokens.unwrap_or(DEFAULT_COMPLETION_MAX_TOKENS))?;
    log.begin(prompt.len(), r.user);
    let run = Run::start(&app.engine, ctx, prompt, opts, r.stop.map(Stop::into_vec).unwrap_or_default(), Default::default())?;
    let echo = if r.echo.unwrap_or(false) { prompt_text } else { String::new() };
    let id = request_id("cmpl");
    let (model, created) = (ctx.id.clone(), ctx.created);
    let body = move |text: String, finish_reason: Json_| {
        json!({"id": id, "object": "text_completion", "created": created, "model": model,
               "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason}]})
    };
    if !r.stream.unwrap_or(false) {
        let (all, summary) = run.collect().await?;
        log.finish(&summary);
        let mut out = body(echo + &all.text, finish(&summary).into());
        out["usage"] = usage(&summary);
        return Ok(Json(out).into_response());
    }
    let include_usage = r.stream_options.unwrap_or_default().include_usage.unwrap_or(false);
    let first = if echo.is_empty() { vec![] } else { vec![Event::default().data(body(echo, Json_::Null).to_string())] };
    Ok(sse(run, first, log, move |c| match c {
        Ok(Chunk::Piece(p)) => vec![Event::default().data(body(p.text, Json_::Null).to_string())],
        Ok(Chunk::Done(s)) => {
            let mut last = body(String::new(), finish(&s).into());
            if include_usage {
                last["usage"] = usage(&s);
            }
            vec![Event::default().data(last.to_string()), Event::default().data("[DONE]")]
        }
        Err(e) => vec![error_event(e)],
    }))
}

fn model_entry(app: &App) -> Json_ {
    json!({"id": app.ctx.id, "object": "model", "created": app.ctx.created, "owned_by": "mlx-bun"})
}

pub async fn models(State(app): State<Arc<App>>) -> Json<Json_> {
    Json(json!({"object": "list", "data": [model_entry(&app)]}))
}

/// `GET /v1/models/{id}`.
pub async fn model(State(app): State<Arc<App>>, Path(id): Path<String>) -> Result<Json<Json_>, ApiError> {
    check_model(&app, &id)?;
    Ok(Json(model_entry(&app)))
}

fn finish(s: &Summary) -> &'static str {
    match s.finish_reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// `tool_calls` as OpenAI writes them; ids are the completion's id and the call's index.
fn tool_calls(id: &str, first: usize, calls: &[ToolCall]) -> Json_ {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"index": first + i, "id": format!("call_{}_{}", id.trim_start_matches("chatcmpl-"), first + i), "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect()
}

fn usage(s: &Summary) -> Json_ {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
    })
}

/// `choices[].logprobs` of a chat completion: each token with its logprob and bytes, and the
/// most likely alternatives; `null` when none were asked for.
fn chat_logprobs(tokenizer: &Tokenizer, piece: &Piece) -> Json_ {
    if piece.tokens.is_empty() {
        return Json_::Null;
    }
    let entry = |id: u32, logprob: f32| {
        let token = tokenizer.decode(&[id], false).unwrap_or_default();
        json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()})
    };
    let content: Vec<Json_> = piece
        .tokens
        .iter()
        .map(|(id, lp): &(u32, TokenLogprobs)| {
            let mut e = entry(*id, lp.logprob);
            e["top_logprobs"] = lp.top.iter().map(|t| entry(t.id, t.logprob)).collect();
            e
        })
        .collect();
    json!({"content": content})
}

/// An error after the stream began: the status line is already sent, so it goes as an event.
fn error_event(e: ApiError) -> Event {
    let response_body = json!({"error": {"message": e.message, "type": "server_error", "param": e.param, "code": e.code}});
    Event::default().data(response_body.to_string())
}
