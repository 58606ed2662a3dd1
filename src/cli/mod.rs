//! The `mlx-bun` command line: `pull`, `generate` and `convert`. The same entry point serves the
//! Rust binary and `npx mlx-bun` (through the addon's `runCli`).
mod bench;

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::json;

use crate::engine::session::{OutputMode, SessionEvent};
use crate::engine::{EngineThread, EngineOptions, FinishReason, InferenceEngine, MethodSpec, Source};
use crate::error::{Error, Result};
use crate::model::convert::{self, ConvertOptions};
use crate::model::open_source;
use crate::model::weights::{DType, F32Matmuls};
use crate::pull;
use crate::sample::{GenerateOptions, SamplingOptions};
use crate::tokenizer::detok::StreamDecoder;
use crate::tokenizer::template::RenderOptions;
use crate::tokenizer::{load_tokenizer, ChatTemplate};

#[derive(Parser)]
#[command(name = "mlx-bun", version, about = "Local LLM inference on MLX")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Download the default model (SmolLM2-135M-Instruct) into $MLX_BUN_HOME.
    Pull,
    /// Stream a completion to stdout; speeds go to stderr.
    Generate {
        #[arg(long)]
        prompt: String,
        /// Model folder or .gguf file (default: SmolLM2-135M-Instruct, pulled on first use).
        #[arg(long)]
        model: Option<PathBuf>,
        #[arg(long, default_value_t = 256)]
        max_tokens: u32,
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        /// Nucleus mass; 0 (default) and 1 = off.
        #[arg(long, default_value_t = 0.0)]
        top_p: f32,
        #[arg(long, default_value_t = 0)]
        top_k: u32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Render the prompt as a user message with the model's chat template.
        #[arg(long)]
        chat: bool,
        #[arg(long, value_enum, default_value_t = F32MatmulsArg::Auto)]
        f32_matmuls: F32MatmulsArg,
    },
    /// Measure prefill/decode speed, time to first token and peak RSS (one JSON line).
    Bench {
        #[arg(long)]
        model: PathBuf,
        #[arg(long, default_value_t = 128)]
        prompt_tokens: u32,
        #[arg(long, default_value_t = 256)]
        gen_tokens: u32,
        #[arg(long, default_value_t = 3)]
        repeats: u32,
        #[arg(long, value_enum, default_value_t = F32MatmulsArg::Auto)]
        f32_matmuls: F32MatmulsArg,
        /// Prompt tokens per prefill step (mlx-lm's default, 2048, unless set).
        #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..))]
        prefill_chunk_size: u32,
    },
    /// Write a model as an HF/MLX folder (safetensors, config.json, tokenizer files).
    Convert {
        model: PathBuf,
        out: PathBuf,
        #[arg(long, value_enum)]
        dtype: Option<DtypeArg>,
        #[arg(long)]
        q_bits: Option<i32>,
        #[arg(long)]
        q_group_size: Option<i32>,
    },
}

/// Which dense matrices are held in f32 for matmuls (`F32Matmuls`): auto and none = every matrix
/// as stored (mlx-lm's numbers); all = every one transposed in f32 (faster on the CPU, may change
/// tokens).
#[derive(Clone, Copy, ValueEnum)]
enum F32MatmulsArg {
    Auto,
    All,
    None,
}

impl From<F32MatmulsArg> for F32Matmuls {
    fn from(a: F32MatmulsArg) -> Self {
        match a {
            F32MatmulsArg::Auto => F32Matmuls::Auto,
            F32MatmulsArg::All => F32Matmuls::All,
            F32MatmulsArg::None => F32Matmuls::None,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum DtypeArg {
    F32,
    F16,
    Bf16,
}

/// Runs the CLI with `args` (without the program name); returns the process exit code.
pub fn run(args: Vec<String>) -> i32 {
    let cli = match Cli::try_parse_from(std::iter::once("mlx-bun".to_string()).chain(args)) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    match execute(cli.command) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("mlx-bun: {} ({})", e, e.code());
            1
        }
    }
}

fn execute(cmd: Command) -> Result<()> {
    match cmd {
        Command::Pull => {
            let path = pull::pull_default(&pull::home(), true)?;
            println!("{}", path.display());
            Ok(())
        }
        Command::Generate { prompt, model, max_tokens, temperature, top_p, top_k, seed, chat, f32_matmuls } => {
            let model = match model {
                Some(m) => m,
                None => pull::pull_default(&pull::home(), true)?,
            };
            let opts = GenerateOptions {
                max_tokens,
                sampling: SamplingOptions { temperature, top_p, top_k, seed, ..Default::default() },
                ..Default::default()
            };
            generate(&model, &prompt, chat, opts, f32_matmuls.into())
        }
        Command::Bench { model, prompt_tokens, gen_tokens, repeats, f32_matmuls, prefill_chunk_size } => {
            bench::bench(&model, prompt_tokens, gen_tokens, repeats, f32_matmuls.into(), prefill_chunk_size)
        }
        Command::Convert { model, out, dtype, q_bits, q_group_size } => {
            let dtype = dtype.map(|d| match d {
                DtypeArg::F32 => DType::F32,
                DtypeArg::F16 => DType::F16,
                DtypeArg::Bf16 => DType::BF16,
            });
            convert_model(&model, &out, ConvertOptions { dtype, q_bits, q_group_size })?;
            println!("{}", out.display());
            Ok(())
        }
    }
}

fn generate(path: &Path, prompt: &str, chat: bool, mut opts: GenerateOptions, f32_matmuls: F32Matmuls) -> Result<()> {
    let (tokenizer, template) = load_tokenizer(path)?;
    let ids = if chat {
        let template = template.ok_or_else(|| Error::Template(format!("{} has no chat template", path.display())))?;
        let text = template.render(&json!([{"role": "user", "content": prompt}]), &RenderOptions::default())?;
        tokenizer.encode(&text, false)?
    } else {
        tokenizer.encode(prompt, true)?
    };
    let (weights, config) = open_source(path)?;
    let weights = weights.with_f32_matmuls(f32_matmuls);
    let mut eos = config.eos_token_ids.clone();
    eos.extend(tokenizer.eos_token_ids().iter().filter(|id| !config.eos_token_ids.contains(id)));
    opts.eos_token_ids = Some(eos);
    let vocab_size = config.vocab_size;
    let (model, loaded) = EngineThread::get().load(Box::new(move || Ok(weights)), config);
    loaded.blocking_recv().map_err(|_| Error::EngineDead)??;
    let engine = InferenceEngine::new(Source::Model { id: model, vocab_size }, EngineOptions { idle_timeout: None, prefix_cache_bytes: 0, ..Default::default() });
    let session = engine.open(MethodSpec::Generate { model, prompt: ids, opts, prefix: Default::default(), cache: None }, OutputMode::Stream, false)?;
    let mut decoder = StreamDecoder::new(&tokenizer, true);
    let mut stdout = std::io::stdout().lock();
    let outcome = session.read_blocking(|event| {
        if let SessionEvent::Committed { token_ids, .. } = event {
            for &id in token_ids {
                let _ = write!(stdout, "{}", decoder.push(id)?);
            }
            let _ = stdout.flush();
        }
        Ok(())
    })?;
    let result = outcome.into_result()?;
    let _ = writeln!(stdout, "{}", decoder.finish()?);
    let stats = result.metrics;
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | generation: {} tokens, {:.1} tok/s | peak memory {:.0} MB{}",
        stats.prompt_tokens,
        stats.prefill_tps,
        stats.generated_tokens,
        stats.decode_tps,
        stats.peak_memory_bytes as f64 / 1e6,
        if result.finish_reason == FinishReason::Length { " (stopped at --max-tokens)" } else { "" }
    );
    drop(session);
    drop(engine);
    EngineThread::get().unload(model);
    Ok(())
}

/// Converts `path` into an HF/MLX folder at `out`.
pub fn convert_model(path: &Path, out: &Path, opts: ConvertOptions) -> Result<()> {
    opts.validate()?;
    let (weights, config) = open_source(path)?;
    let (tokenizer, template) = load_tokenizer(path)?;
    let (tensors, raw) = EngineThread::get()
        .run(move || convert::convert(&weights, &config, &opts))
        .blocking_recv()
        .map_err(|_| Error::EngineDead)??;
    convert::write_weights(out, &tensors, &raw)?;
    tokenizer.save_dir(out, template.as_ref().map(ChatTemplate::source))
}
