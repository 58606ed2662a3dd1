//! `mlx-bun bench`: prefill and decode speed, time to first token and peak RSS for one model, as
//! one JSON line (scripts/bench.py runs it beside mlx-lm and prints the ratios).
use std::path::Path;

use serde_json::json;

use crate::cache::KvQuantOptions;
use crate::engine::fill::FillConfig;
use crate::engine::session::OutputMode;
use crate::engine::{EngineThread, EngineOptions, GenerateStats, InferenceEngine, MethodSpec, Source};
use crate::error::Result;
use crate::model::open_source;
use crate::model::weights::F32Matmuls;
use crate::sample::GenerateOptions;

/// What one `mlx-bun bench` measures.
pub struct Workload {
    pub prompt_tokens: u32,
    pub gen_tokens: u32,
    pub repeats: u32,
    pub prefill_chunk_size: u32,
    pub kv: KvQuantOptions,
}

pub fn bench(path: &Path, w: Workload, f32_matmuls: F32Matmuls) -> Result<()> {
    let Workload { prompt_tokens, gen_tokens, repeats, prefill_chunk_size, kv } = w;
    let (weights, config) = open_source(path)?;
    let weights = weights.with_f32_matmuls(f32_matmuls);
    let vocab = config.vocab_size as u32;
    let checkpoints = crate::model::restores_checkpoints(&config);
    let engine = EngineThread::get();
    let (model, loaded) = engine.load(Box::new(move || Ok(weights)), config);
    super::wait_loaded(path, loaded)?;
    let sessions = InferenceEngine::new(Source::Model { id: model, vocab_size: vocab as usize, checkpoints }, EngineOptions { idle_timeout: None, prefix_cache_bytes: 0, fill: FillConfig::from_env()?, ..Default::default() });
    // Token ids do not change the work done; a fixed pseudo-random spread avoids degenerate input.
    let prompt: Vec<u32> = (0..prompt_tokens).map(|i| (i.wrapping_mul(7919) + 13) % vocab).collect();
    let run = |max_tokens: u32| -> Result<GenerateStats> {
        let opts = GenerateOptions { max_tokens, eos_token_ids: Some(Vec::new()), prefill_chunk_size, kv: kv.clone(), ..Default::default() };
        let session = sessions.open(MethodSpec::Generate { model, prompt: prompt.clone(), opts, prefix: Default::default(), cache: None, draft: None, fill: Default::default() }, OutputMode::Stream, false)?;
        Ok(session.read_blocking(|_| Ok(()))?.into_result()?.metrics)
    };
    run(gen_tokens.min(8))?; // warm-up
    let runs: Vec<GenerateStats> = (0..repeats).map(|_| run(gen_tokens)).collect::<Result<_>>()?;
    let series = |f: fn(&GenerateStats) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        json!({"min": v[0], "median": v[v.len() / 2], "max": v[v.len() - 1]})
    };
    let out = json!({
        "engine": "mlx-bun",
        "model": path,
        "prompt_tokens": prompt_tokens,
        "gen_tokens": gen_tokens,
        "prefill_chunk_size": prefill_chunk_size,
        "kv_bits": kv.bits,
        "prefill_tps": series(|s| s.prefill_tps),
        "decode_tps": series(|s| s.decode_tps),
        "ttft_ms": series(|s| s.prefill_ms),
        "peak_rss_mb": peak_rss_mb(),
    });
    println!("{out}");
    engine.unload(model);
    Ok(())
}

fn peak_rss_mb() -> f64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    // Linux reports KiB, macOS bytes.
    let kib = if cfg!(target_os = "macos") { usage.ru_maxrss as f64 / 1024.0 } else { usage.ru_maxrss as f64 };
    kib / 1024.0
}
