//! `mlx-bun chat`: a conversation with one model in the terminal. Each turn renders the whole
//! conversation with the model's chat template and runs it as one engine session. The engine's
//! prefix cache keeps the KV cache each turn ends with, under one session id per conversation,
//! so the next turn prefills only the new messages. On a terminal, input comes through rustyline
//! (line editing, history); from a pipe it is read line by line, with no prompt echoed, so that
//! stdout carries the replies alone.
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rustyline::error::ReadlineError;
use serde_json::{json, Value as Json};

use super::{wait_loaded, F32MatmulsArg};
use crate::engine::fill::FillConfig;
use crate::engine::inference::PrefixKey;
use crate::engine::session::{CancelReason, OutputMode, Session, SessionEvent};
use crate::engine::{EngineOptions, GenerateStats, InferenceEngine, MethodSpec, Source};
use crate::error::{Error, Result};
use crate::pull;
use crate::sample::{GenerateOptions, SamplingOptions};
use crate::server::{ContextOptions, ServerContext};
use crate::tokenizer::detok::StreamDecoder;
use crate::tokenizer::template::RenderOptions;
use crate::tokenizer::ChatTemplate;

#[derive(clap::Args)]
pub struct ChatArgs {
    /// Model folder or .gguf file (default: SmolLM2-135M-Instruct, pulled on first use).
    #[arg(long)]
    model: Option<PathBuf>,
    /// A system message that opens the conversation (kept across /reset).
    #[arg(long)]
    system: Option<String>,
    /// Most tokens in one reply.
    #[arg(long, default_value_t = 1024)]
    max_tokens: u32,
    /// Sampling temperature, 0 = always the likeliest token (default: the model's
    /// generation_config.json, else 0).
    #[arg(long)]
    temperature: Option<f32>,
    /// Nucleus mass; 0 and 1 = off (default: the model's generation_config.json, else off).
    #[arg(long)]
    top_p: Option<f32>,
    /// Sample among the K likeliest tokens; 0 = off (default: the model's
    /// generation_config.json, else off).
    #[arg(long)]
    top_k: Option<u32>,
    /// Sampler seed: the same seed and conversation give the same replies.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Which weight matrices are held in f32 for matmuls.
    #[arg(long, value_enum, default_value_t = F32MatmulsArg::Auto)]
    f32_matmuls: F32MatmulsArg,
}

const HELP: &str = "Type a message and press Enter. Commands:
  /reset   forget the conversation (the system message stays)
  /exit    leave (also Ctrl-D)
  /help    this text
Ctrl-C while the model answers stops that answer.";

pub fn chat(a: ChatArgs) -> Result<()> {
    let path = match a.model {
        Some(m) => m,
        None => pull::pull_default(&pull::home(), true)?,
    };
    let (ctx, loaded) = ServerContext::open(&path, ContextOptions { f32_matmuls: a.f32_matmuls.into(), ..Default::default() })?;
    let Some(template) = ctx.template.clone() else {
        return Err(Error::Template(format!("{} has no chat template; use `mlx-bun generate`", path.display())));
    };
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        eos_token_ids: Some(ctx.eos_ids.clone()),
        sampling: SamplingOptions {
            temperature: a.temperature.or(ctx.defaults.temperature).unwrap_or(0.0),
            top_p: a.top_p.or(ctx.defaults.top_p).unwrap_or(0.0),
            top_k: a.top_k.or(ctx.defaults.top_k).unwrap_or(0),
            seed: a.seed,
            ..Default::default()
        },
        ..Default::default()
    };
    // Bad sampling flags fail now, not at the first message.
    opts.validate(ctx.vocab_size)?;
    wait_loaded(&path, loaded)?;
    // No idle timeout: the reader is this thread, which never stops reading mid-turn.
    let engine = InferenceEngine::new(Source::Model { id: ctx.model, vocab_size: ctx.vocab_size, checkpoints: ctx.checkpoints }, EngineOptions { idle_timeout: None, fill: FillConfig::from_env()?, ..Default::default() });
    let interactive = std::io::stdin().is_terminal();
    let mut input = if interactive { Input::editor()? } else { Input::Lines(std::io::stdin().lock()) };
    if interactive {
        eprintln!("mlx-bun: chatting with {}; /help for commands, Ctrl-D to leave", ctx.id);
    }
    let mut chat = Conversation { ctx: &ctx, template, engine, opts, system: a.system, messages: Vec::new(), id: 0, interactive };
    chat.reset();
    let result = chat.run(&mut input);
    input.save_history();
    result
}

struct Conversation<'a> {
    ctx: &'a ServerContext,
    template: ChatTemplate,
    engine: Arc<InferenceEngine>,
    opts: GenerateOptions,
    system: Option<String>,
    messages: Vec<Json>,
    /// Names this conversation's prefix-cache entries; a new one after /reset.
    id: u64,
    interactive: bool,
}

impl Conversation<'_> {
    fn run(&mut self, input: &mut Input) -> Result<()> {
        while let Some(line) = input.next()? {
            let line = line.trim();
            match line {
                "" => {}
                "/exit" => break,
                "/help" => eprintln!("{HELP}"),
                "/reset" => {
                    self.reset();
                    eprintln!("mlx-bun: conversation reset");
                }
                _ if line.starts_with('/') => eprintln!("mlx-bun: unknown command {line}; /help lists them"),
                _ => match self.turn(line) {
                    Ok(()) => {}
                    // At a terminal a failed turn is reported and the conversation goes on;
                    // a script gets the error and exit code 1.
                    Err(e) if self.interactive => eprintln!("mlx-bun: {} ({})", e, e.code()),
                    Err(e) => return Err(e),
                },
            }
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.messages.clear();
        if let Some(s) = &self.system {
            self.messages.push(json!({"role": "system", "content": s}));
        }
        self.id += 1;
    }

    /// One user message and the model's reply, streamed to stdout. A cancelled or failed turn
    /// leaves the conversation as it was before it.
    fn turn(&mut self, user: &str) -> Result<()> {
        self.messages.push(json!({"role": "user", "content": user}));
        match self.reply() {
            Ok(Some(reply)) => {
                self.messages.push(json!({"role": "assistant", "content": reply}));
                Ok(())
            }
            Ok(None) => {
                self.messages.pop();
                eprintln!("mlx-bun: answer stopped; the conversation is as before it");
                Ok(())
            }
            Err(e) => {
                self.messages.pop();
                Err(e)
            }
        }
    }

    /// The reply's text, or `None` when Ctrl-C cancelled it.
    fn reply(&self) -> Result<Option<String>> {
        let text = self.template.render(&Json::Array(self.messages.clone()), &RenderOptions::default())?;
        let prompt = self.ctx.tokenizer.encode(&text, false)?;
        let prefix = PrefixKey { namespace: String::new(), session: Some(format!("chat-{}", self.id)) };
        let started = Instant::now();
        let spec = MethodSpec::Generate { model: self.ctx.model, prompt, opts: self.opts.clone(), prefix, cache: None, draft: None, fill: Default::default() };
        let session = self.engine.open(spec, OutputMode::Stream, false)?;
        let _cancel = self.interactive.then(|| CancelOnSigint::start(session.clone())).transpose()?;
        let mut decoder = StreamDecoder::new(&self.ctx.tokenizer, true);
        let mut reply = String::new();
        let mut first_token = None;
        let mut stdout = std::io::stdout().lock();
        let outcome = session.read_blocking(|event| {
            if let SessionEvent::Committed { token_ids, .. } = event {
                first_token.get_or_insert_with(Instant::now);
                for &id in token_ids {
                    let piece = decoder.push(id)?;
                    let _ = write!(stdout, "{piece}");
                    reply.push_str(&piece);
                }
                let _ = stdout.flush();
            }
            Ok(())
        })?;
        let rest = decoder.finish()?;
        reply.push_str(&rest);
        let _ = writeln!(stdout, "{rest}");
        let _ = stdout.flush();
        match outcome.into_result() {
            Ok(result) => {
                let ttft = first_token.map(|t| t.duration_since(started));
                eprintln!("{}", stats_line(&result.metrics, ttft));
                Ok(Some(reply))
            }
            Err(Error::Cancelled(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// `prompt: 45 tokens (30 cached) | reply: 12 tokens, 85.3 tok/s | TTFT 120 ms`.
fn stats_line(s: &GenerateStats, ttft: Option<Duration>) -> String {
    let ttft = ttft.map_or_else(|| "no tokens".to_string(), |t| format!("TTFT {:.0} ms", t.as_secs_f64() * 1e3));
    format!(
        "prompt: {} tokens ({} cached) | reply: {} tokens, {:.1} tok/s | {ttft}",
        s.prompt_tokens, s.cached_tokens, s.generated_tokens, s.decode_tps
    )
}

enum Input {
    /// A terminal: line editing and history (kept in `$MLX_BUN_HOME/chat_history`).
    Editor(Box<rustyline::DefaultEditor>, PathBuf),
    /// A pipe or file: plain lines.
    Lines(std::io::StdinLock<'static>),
}

impl Input {
    fn editor() -> Result<Self> {
        let mut editor = rustyline::DefaultEditor::new().map_err(|e| Error::Internal(format!("line editor: {e}")))?;
        let history = pull::home().join("chat_history");
        match editor.load_history(&history) {
            Ok(()) => {}
            Err(ReadlineError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!("mlx-bun: could not read {}: {e}", history.display()),
        }
        Ok(Input::Editor(Box::new(editor), history))
    }

    /// The next line, or `None` at the end of input (Ctrl-D).
    fn next(&mut self) -> Result<Option<String>> {
        match self {
            Input::Lines(stdin) => {
                let mut line = String::new();
                let n = stdin.read_line(&mut line).map_err(|e| Error::io(Path::new("<stdin>"), e))?;
                Ok((n > 0).then_some(line))
            }
            Input::Editor(editor, _) => loop {
                match editor.readline(">>> ") {
                    Ok(line) => {
                        if !line.trim().is_empty() {
                            let _ = editor.add_history_entry(line.as_str());
                        }
                        return Ok(Some(line));
                    }
                    // Ctrl-C at the prompt drops the line being typed, as shells do.
                    Err(ReadlineError::Interrupted) => continue,
                    Err(ReadlineError::Eof) => return Ok(None),
                    Err(ReadlineError::Io(e)) => return Err(Error::io(Path::new("<terminal>"), e)),
                    Err(e) => return Err(Error::Internal(format!("line editor: {e}"))),
                }
            },
        }
    }

    fn save_history(&mut self) {
        if let Input::Editor(editor, path) = self {
            let saved = path.parent().map_or(Ok(()), std::fs::create_dir_all).map_err(ReadlineError::Io).and_then(|()| editor.save_history(path));
            if let Err(e) = saved {
                eprintln!("mlx-bun: could not save the chat history to {}: {e}", path.display());
            }
        }
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// While it lives, Ctrl-C (SIGINT) cancels `session` instead of ending the program; the
/// handler that was there before (the default, or Node's) comes back when it is dropped.
/// Hand-written on sigaction because tokio's and signal-hook's handlers stay installed for the
/// life of the process, and this CLI also runs inside Node (`runCli`), where Ctrl-C must keep its
/// meaning after the turn. A signal handler may only set a flag; a thread polls it.
struct CancelOnSigint {
    previous: libc::sigaction,
    done: Option<mpsc::Sender<()>>,
    watcher: Option<std::thread::JoinHandle<()>>,
}

impl CancelOnSigint {
    fn start(session: Arc<Session>) -> Result<Self> {
        INTERRUPTED.store(false, Ordering::SeqCst);
        // SAFETY: plain sigaction calls on structs we own; the handler only stores an atomic.
        let previous = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGINT, &action, &mut previous) != 0 {
                return Err(Error::io(Path::new("<sigaction>"), std::io::Error::last_os_error()));
            }
            previous
        };
        let (done, stop) = mpsc::channel::<()>();
        let watcher = std::thread::spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(Duration::from_millis(50)) {
                if INTERRUPTED.swap(false, Ordering::SeqCst) {
                    session.cancel(CancelReason::Requested);
                }
            }
        });
        Ok(CancelOnSigint { previous, done: Some(done), watcher: Some(watcher) })
    }
}

impl Drop for CancelOnSigint {
    fn drop(&mut self) {
        // SAFETY: puts back the action saved in `start`.
        unsafe { libc::sigaction(libc::SIGINT, &self.previous, std::ptr::null_mut()) };
        self.done.take();
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
    }
}
