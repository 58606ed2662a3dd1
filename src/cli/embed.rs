//! `mlx-bun embed`: embeddings of texts (mlx-bun's `embedMany`), one JSON line per text.
use std::io::{BufRead, Write};
use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use super::{wait_loaded, F32MatmulsArg};
use crate::engine::EngineThread;
use crate::error::{Error, Result};
use crate::pull;
use crate::server::{ContextOptions, ServerContext};

#[derive(Args)]
pub struct EmbedArgs {
    /// Texts to embed; without any, each line of stdin is one.
    texts: Vec<String>,
    /// Model folder or .gguf file (default: SmolLM2-135M-Instruct, pulled on first use).
    #[arg(long)]
    model: Option<PathBuf>,
    /// A task instruction: the texts are queries in Qwen3-Embedding's format
    /// ("Instruct: {instruction}\nQuery:{text}"); documents go without one.
    #[arg(long)]
    instruction: Option<String>,
    /// Which weight matrices are held in f32 for matmuls.
    #[arg(long, value_enum, default_value_t = F32MatmulsArg::Auto)]
    f32_matmuls: F32MatmulsArg,
}

/// Prints `{"index", "tokens", "embedding"}` per text, in order: the last hidden state at an
/// appended end-of-text token, L2-normalised.
pub fn embed(a: EmbedArgs) -> Result<()> {
    let model = match a.model {
        Some(m) => m,
        None => pull::pull_default(&pull::home(), true)?,
    };
    let texts = if a.texts.is_empty() {
        std::io::stdin().lock().lines().collect::<std::io::Result<Vec<_>>>().map_err(|e| Error::io("stdin", e))?
    } else {
        a.texts
    };
    let (ctx, loaded) = ServerContext::open(&model, ContextOptions { f32_matmuls: a.f32_matmuls.into(), ..Default::default() })?;
    wait_loaded(&model, loaded)?;
    let (counts, vectors) = EngineThread::get().embed_texts(ctx.model, &ctx.tokenizer, &texts, a.instruction.as_deref())?;
    let vectors = vectors.blocking_recv().map_err(|_| Error::EngineDead)??;
    let mut stdout = std::io::stdout().lock();
    for (i, (v, n)) in vectors.iter().zip(counts).enumerate() {
        writeln!(stdout, "{}", json!({"index": i, "tokens": n, "embedding": v})).map_err(|e| Error::io("stdout", e))?;
    }
    Ok(())
}
