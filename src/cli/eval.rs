//! `mlx-bun eval`: perplexity of a text, KL against a saved teacher-logits dump, and such a dump
//! written from our own engine (`crate::eval`). The model runs on the engine thread, where all
//! MLX work belongs; the CLI waits for it.
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};
use serde_json::json;

use crate::engine::EngineThread;
use crate::error::{Error, Result};
use crate::eval::dump::{self, Dump, DumpWriter, Manifest};
use crate::cache::KvQuantOptions;
use crate::eval::forward::{self, Pass};
use crate::eval::metrics::{KlSummary, Perplexity};
use crate::model::weights::F32Matmuls;
use crate::model::{create_model, open_config, open_source, LanguageModel};
use crate::progress::Progress;
use crate::sample::validate_prompt;
use crate::tokenizer::load_tokenizer;

use super::F32MatmulsArg;

#[derive(Args)]
pub struct EvalArgs {
    #[command(subcommand)]
    command: EvalCommand,
}

#[derive(Subcommand)]
enum EvalCommand {
    /// Perplexity of a text.
    ///
    /// Its tokens are cut into windows of --ctx (the remainder dropped, as mlx-lm's perplexity
    /// does), each scored from a fresh cache, --chunk tokens a forward.
    Perplexity {
        /// Model folder or .gguf file.
        model: PathBuf,
        /// A UTF-8 text file, tokenized with the model's tokenizer (its special tokens added).
        #[arg(long)]
        text: PathBuf,
        #[command(flatten)]
        window: Window,
        #[command(flatten)]
        kv: KvFlags,
        /// Which weight matrices are held in f32 for matmuls (what `all` costs is its KL).
        #[arg(long, value_enum, default_value_t = F32MatmulsArg::Auto)]
        f32_matmuls: F32MatmulsArg,
        /// Print one JSON object instead of the text report.
        #[arg(long)]
        json: bool,
    },
    /// KL of a candidate model against a saved teacher's logits.
    ///
    /// Reads the format-1 dump of scripts/mlx_lm_eval.py or `mlx-bun eval dump`; reports the
    /// mean, p95 and max KL over positions, the reference mass the top-k covers, and top-1
    /// agreement.
    Kl {
        /// The model to score: a folder or .gguf file.
        #[arg(long)]
        candidate: PathBuf,
        /// The dump's folder (manifest.json, tokens.bin, seq-<i>.bin).
        #[arg(long)]
        reference_logits: PathBuf,
        /// Score only the first N sequences of the dump.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        n: Option<u32>,
        /// Positions per forward (compare candidates at one chunk: it changes the rounding).
        #[arg(long, default_value_t = DEFAULT_CHUNK, value_parser = clap::value_parser!(u32).range(1..))]
        chunk: u32,
        #[command(flatten)]
        kv: KvFlags,
        /// Which weight matrices are held in f32 for matmuls (what `all` costs is its KL).
        #[arg(long, value_enum, default_value_t = F32MatmulsArg::Auto)]
        f32_matmuls: F32MatmulsArg,
        /// Print one JSON object instead of the text report.
        #[arg(long)]
        json: bool,
    },
    /// Write a format-1 dump of a model's logits on a text.
    ///
    /// `eval kl` scores other models (or the same one at another chunk) against it. The folder's
    /// path is printed.
    Dump {
        /// Model folder or .gguf file: the reference.
        model: PathBuf,
        /// A UTF-8 text file, tokenized with the model's tokenizer.
        #[arg(long)]
        text: PathBuf,
        /// Folder to write (created if missing).
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        window: Window,
        /// Write at most N sequences (default: every whole window of the text).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        n: Option<u32>,
        /// Logits kept per position.
        #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..))]
        top_k: u32,
    },
}

/// 256 positions of f32 logits: 50 MB for SmolLM2's vocabulary, 270 MB for Gemma 3's.
const DEFAULT_CHUNK: u32 = 256;

#[derive(Args)]
struct Window {
    /// Tokens per window (mlx-lm's perplexity default).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(2..))]
    ctx: u32,
    /// Positions per forward.
    #[arg(long, default_value_t = DEFAULT_CHUNK, value_parser = clap::value_parser!(u32).range(1..))]
    chunk: u32,
}

/// The evaluated model's KV cache quantized, with mlx-lm's flags: what that costs is the KL
/// against a dump made with a plain cache. The teacher's (`eval dump`) stays plain.
#[derive(Args)]
struct KvFlags {
    /// Quantize the KV cache to this many bits (2, 3, 4, 5, 6 or 8); plain by default.
    #[arg(long)]
    kv_bits: Option<i32>,
    /// Group size of the KV cache's quantization (32, 64 or 128).
    #[arg(long, default_value_t = 64)]
    kv_group_size: i32,
    /// Positions a layer's cache holds before it is quantized (unlike generate's 5000, 0: an
    /// evaluation's windows are short, and the cost is measured from the first chunk on).
    #[arg(long, default_value_t = 0)]
    quantized_kv_start: usize,
}

impl KvFlags {
    fn options(&self) -> Result<KvQuantOptions> {
        let o = KvQuantOptions { bits: self.kv_bits, group_size: self.kv_group_size, start: Some(self.quantized_kv_start), config: Vec::new() };
        o.validate()?;
        Ok(o)
    }
}

pub fn eval(a: EvalArgs) -> Result<()> {
    match a.command {
        EvalCommand::Perplexity { model, text, window, kv, f32_matmuls, json } => perplexity(&model, &text, &window, kv.options()?, f32_matmuls.into(), json),
        EvalCommand::Kl { candidate, reference_logits, n, chunk, kv, f32_matmuls, json } => {
            kl(&candidate, &reference_logits, n, chunk as usize, kv.options()?, f32_matmuls.into(), json)
        }
        EvalCommand::Dump { model, text, out, window, n, top_k } => write_dump(&model, &text, &out, &window, n, top_k as usize),
    }
}

/// Loads `path` on the engine thread and runs `work` on it there, with a bar of `positions`.
fn on_model<T: Send + 'static>(
    path: &Path,
    f32_matmuls: F32Matmuls,
    what: &str,
    positions: u64,
    work: impl FnOnce(&dyn LanguageModel, &dyn Fn(u64)) -> Result<T> + Send + 'static,
) -> Result<T> {
    let (weights, config) = open_source(path)?;
    let weights = weights.with_f32_matmuls(f32_matmuls);
    let bar = Progress::steps(what, positions);
    let ticker = bar.ticker();
    let out = EngineThread::get()
        .run(move || work(&*create_model(weights, config)?, &|n| ticker.inc(n)))
        .blocking_recv()
        .map_err(|_| Error::EngineDead)??;
    bar.finish();
    Ok(out)
}

/// A text file's tokens, cut into whole windows.
struct Text {
    /// Tokens in the text, the remainder included.
    tokens: usize,
    sha256: String,
    windows: Vec<Vec<u32>>,
    /// The model's vocabulary, which every token is inside.
    vocab: usize,
}

/// `text` tokenized with `model`'s tokenizer and cut into (at most `n`) whole windows of `ctx`.
fn read_text(model: &Path, text: &Path, ctx: usize, n: Option<u32>) -> Result<Text> {
    let bytes = std::fs::read(text).map_err(|e| Error::io(text, e))?;
    let sha256 = {
        use sha2::{Digest, Sha256};
        Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
    };
    let text = String::from_utf8(bytes).map_err(|_| Error::option("text", format!("{} is not UTF-8", text.display())))?;
    let (tokenizer, _) = load_tokenizer(model)?;
    let tokens = tokenizer.encode(&text, true)?;
    if tokens.len() < ctx {
        return Err(Error::option("ctx", format!("the text has {} tokens, fewer than one window of {ctx}", tokens.len())));
    }
    let vocab = open_config(model)?.vocab_size;
    let windows: Vec<Vec<u32>> = tokens.chunks_exact(ctx).take(n.map_or(usize::MAX, |n| n as usize)).map(<[u32]>::to_vec).collect();
    for w in &windows {
        validate_prompt(w, vocab)?;
    }
    Ok(Text { tokens: tokens.len(), sha256, windows, vocab })
}

fn slices(windows: &[Vec<u32>]) -> Vec<&[u32]> {
    windows.iter().map(Vec::as_slice).collect()
}

fn perplexity(model: &Path, text: &Path, w: &Window, kv: KvQuantOptions, f32_matmuls: F32Matmuls, json: bool) -> Result<()> {
    let (ctx, chunk) = (w.ctx as usize, w.chunk as usize);
    let Text { tokens, windows, .. } = read_text(model, text, ctx, None)?;
    let count = windows.len();
    let bits = kv.bits;
    let losses = on_model(model, f32_matmuls, "perplexity", (count * (ctx - 1)) as u64, move |m, tick| forward::losses(m, &slices(&windows), &Pass::new(m, chunk, &kv)?, tick))?;
    let p = Perplexity::from_losses(&losses);
    if json {
        let out = json!({"model": model, "text": text, "tokens": tokens, "ctx": ctx, "chunk": chunk, "kvBits": bits, "windows": count,
            "scored": p.scored, "meanNll": p.mean_nll, "perplexity": p.perplexity, "standardError": p.standard_error});
        println!("{out}");
    } else {
        println!("perplexity {:.4} ± {:.4}  (mean NLL {:.6})", p.perplexity, p.standard_error, p.mean_nll);
        println!("  {} tokens scored in {count} windows of {ctx} ({tokens} in the text), chunk {chunk}{}", p.scored, kv_note(bits));
    }
    Ok(())
}

fn kl(candidate: &Path, dir: &Path, n: Option<u32>, chunk: usize, kv: KvQuantOptions, f32_matmuls: F32Matmuls, json: bool) -> Result<()> {
    let dump = Dump::open(dir)?;
    let vocab = open_config(candidate)?.vocab_size;
    dump.check_vocab(vocab)?;
    let m = dump.manifest.clone();
    let seqs = n.map_or(m.n_seqs, |n| (n as u64).min(m.n_seqs)) as usize;
    let bits = kv.bits;
    let summary: KlSummary = on_model(candidate, f32_matmuls, "kl", seqs as u64 * m.positions_per_seq, move |model, tick| {
        forward::score(model, &dump, seqs, &Pass::new(model, chunk, &kv)?, tick)
    })?;
    let r = summary.report();
    if json {
        let out = json!({"candidate": candidate, "reference": dir, "referenceModel": m.model, "sequences": seqs, "topK": m.top_k, "chunk": chunk, "kvBits": bits, "report": r});
        println!("{out}");
        return Ok(());
    }
    println!("KL of {} against {} ({})", candidate.display(), dir.display(), m.model);
    println!("  {seqs} sequences × {} positions, top-{}, chunk {chunk}{}", m.positions_per_seq, m.top_k, kv_note(bits));
    println!("  KL             mean {:.6e}  p95 {:.6e}  max {:.6e}", r.kl.mean, r.kl.p95, r.kl.max);
    println!("  captured mass  mean {:.6}  min {:.6}", r.captured_mass.mean, r.captured_mass.min);
    println!("  top-1 agreement {:.4}", r.top1_agreement);
    Ok(())
}

fn kv_note(bits: Option<i32>) -> String {
    bits.map_or(String::new(), |b| format!(", {b}-bit KV cache"))
}

fn write_dump(model: &Path, text: &Path, out: &Path, w: &Window, n: Option<u32>, top_k: usize) -> Result<()> {
    let (ctx, chunk) = (w.ctx as usize, w.chunk as usize);
    let Text { sha256, windows, vocab, .. } = read_text(model, text, ctx, n)?;
    if top_k > vocab {
        return Err(Error::option("top-k", format!("{top_k} exceeds the vocabulary of {vocab}")));
    }
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let manifest = Manifest {
        format_version: dump::FORMAT_VERSION,
        model: model.display().to_string(),
        corpus_sha256: sha256,
        ctx_len: ctx as u64,
        n_seqs: windows.len() as u64,
        top_k: top_k as u64,
        positions_per_seq: ctx as u64 - 1,
        created: dump::rfc3339(created),
        notes: format!("mlx-bun {} eval dump, chunk {chunk}", env!("CARGO_PKG_VERSION")),
        vocab_size: Some(vocab as u64),
    };
    let writer = DumpWriter::create(out, manifest, &slices(&windows))?;
    let positions = (windows.len() * (ctx - 1)) as u64;
    let writer = on_model(model, F32Matmuls::Auto, "dump", positions, move |m, tick| {
        forward::write_dump(m, &slices(&windows), &Pass { chunk, kv: None }, top_k, &writer, tick)?;
        Ok(writer)
    })?;
    writer.finish()?;
    println!("{}", out.display());
    Ok(())
}
