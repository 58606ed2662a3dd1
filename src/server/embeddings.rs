//! OpenAI's `POST /v1/embeddings` over mlx-bun's embeddings (`embedMany`): each input's last
//! hidden state at an appended end-of-text token, L2-normalised, computed in padded batches on
//! the engine thread. A client that goes away drops its pending batches.
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use super::app::{check_model, App};
use super::body;
use super::error::ApiError;
use super::log::LogSlot;
use crate::engine::{l2_normalised, EngineThread};
use crate::error::Error;

/// OpenAI's own limit on inputs per request.
const MAX_INPUTS: usize = 2048;

#[derive(Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdRows(Vec<Vec<u32>>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EmbeddingsRequest {
    model: String,
    input: Input,
    /// "float" (default) or "base64": little-endian f32 bytes, what the OpenAI SDKs ask for.
    encoding_format: Option<String>,
    /// Keep the first `dimensions` components, L2-normalised again (Matryoshka truncation, as
    /// Qwen3-Embedding supports).
    dimensions: Option<usize>,
    /// An end-user identifier: informational, written to the request log.
    user: Option<String>,
}

pub async fn embeddings(State(app): State<Arc<App>>, log: LogSlot, bytes: body::Body) -> Result<Response, ApiError> {
    let r: EmbeddingsRequest = bytes.json()?;
    check_model(&app, &r.model)?;
    // Token ids are a text's ids: the end-of-text token is appended to them as to a text's.
    let ctx = &app.ctx;
    let with_end = |mut ids: Vec<u32>| -> Result<Vec<u32>, ApiError> {
        ids.push(ctx.tokenizer.end_of_text_id()?);
        Ok(ids)
    };
    let rows = match r.input {
        Input::Text(t) => vec![ctx.tokenizer.embedding_input(&t, None)?],
        Input::Texts(t) => t.iter().map(|t| ctx.tokenizer.embedding_input(t, None)).collect::<crate::error::Result<_>>()?,
        Input::Ids(ids) => vec![with_end(ids)?],
        Input::IdRows(rows) => rows.into_iter().map(with_end).collect::<Result<_, _>>()?,
    };
    if rows.is_empty() || rows.len() > MAX_INPUTS {
        return Err(ApiError::param("input", format!("must hold 1 to {MAX_INPUTS} inputs, got {}", rows.len())));
    }
    let base64 = match r.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => return Err(ApiError::param("encoding_format", format!("must be \"float\" or \"base64\", got {other:?}"))),
    };
    if r.dimensions == Some(0) {
        return Err(ApiError::param("dimensions", "must be at least 1"));
    }
    let (counts, vectors) = EngineThread::get().embed_rows(ctx.model, rows);
    let prompt_tokens: usize = counts.iter().sum();
    log.begin(prompt_tokens, r.user);
    let vectors = vectors.await.map_err(|_| Error::EngineDead)??;
    if let (Some(d), Some(hidden)) = (r.dimensions, vectors.first().map(Vec::len)) {
        if d > hidden {
            return Err(ApiError::param("dimensions", format!("must be at most {hidden}, the model's hidden size, got {d}")));
        }
    }
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let v = match r.dimensions {
                Some(d) => l2_normalised(&v[..d]),
                None => v,
            };
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let usage = json!({"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens});
    Ok(Json(json!({"object": "list", "data": data, "model": ctx.id, "usage": usage})).into_response())
}
