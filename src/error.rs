//! One error type for the whole crate. Every variant has a stable code that JavaScript sees as
//! `err.code`; messages name the file, tensor, field or option at fault.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no model at {0}")]
    ModelNotFound(PathBuf),
    /// `Registry.resolve` found no model for a query (code `MODEL_NOT_FOUND`).
    #[error("no model matching \"{0}\" (run a scan, or download it with `mlx-bun get`)")]
    NoModelMatch(String),
    /// `Registry.resolve` found several repositories for a query.
    #[error("\"{query}\" is ambiguous: {}", candidates.join(", "))]
    AmbiguousModel { query: String, candidates: Vec<String> },
    #[error("{path}: {reason}")]
    InvalidWeights { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    InvalidConfig { path: PathBuf, reason: String },
    /// A saved KV cache that cannot be restored: damaged, of another version, or of another model.
    #[error("{path}: {reason}")]
    InvalidCacheFile { path: PathBuf, reason: String },
    /// A teacher-logits dump (`mlx-bun eval kl --reference-logits`) that cannot be scored:
    /// damaged, cut short, of another format version or of another vocabulary.
    #[error("{path}: {reason}")]
    InvalidDump { path: PathBuf, reason: String },
    #[error("unsupported model_type '{0}' (supported: llama, mistral, qwen2, qwen3, qwen3_moe, qwen3_next, qwen3_5, qwen3_5_moe, gemma, gemma2, gemma3_text, gemma4_text, gemma4, phi3, smollm3, olmo2, glm4, granite, starcoder2, minicpm)")]
    UnsupportedModelType(String),
    #[error("tensor {tensor}: unsupported GGUF quantization type {kind}")]
    UnsupportedQuant { tensor: String, kind: String },
    #[error("tensor {tensor}: {reason}")]
    Tensor { tensor: String, reason: String },
    #[error("{option}: {reason}")]
    InvalidOption { option: &'static str, reason: String },
    #[error("{0}")]
    InvalidPrompt(String),
    /// A grammar (JSON schema, regex, Lark) llguidance cannot compile, or one that gets stuck.
    #[error("grammar: {0}")]
    InvalidGrammar(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("download: {0}")]
    Download(String),
    /// A downloaded file's size or digest differs from what the hub lists; nothing of it is kept.
    #[error("download: {file}: {reason}")]
    Checksum { file: String, reason: String },
    #[error("the engine is closed")]
    EngineClosed,
    /// The engine thread has ended (after a failure it could not contain): nothing more runs.
    #[error("the engine thread has stopped; restart the process to generate again")]
    EngineDead,
    /// A bug: a panic inside the engine, contained to the work that hit it.
    #[error("internal error: {0}")]
    Internal(String),
    #[error("{option}: {reason}")]
    UnsupportedOption { option: String, reason: String },
    #[error("the model has been disposed")]
    ModelDisposed,
    #[error("mlx: {0}")]
    Mlx(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("the engine is full: {0}")]
    AdmissionRejected(String),
    /// A model or a session's context cannot fit the memory budget (`fit()`'s formulas).
    #[error("insufficient memory: {0}")]
    InsufficientMemory(String),
    #[error("collect and callback sessions return their output through result, not events")]
    NotAStream,
    #[error("generation events have one consumer")]
    AlreadyConsumed,
    #[error("concurrent next() is not supported")]
    ConcurrentNext,
    /// A method broke the session's publication rules (its outcome is `execution_failed`).
    #[error("{0}")]
    Protocol(String),
    #[error("cancelled ({0})")]
    Cancelled(&'static str),
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Aggregate(Vec<Error>),
    /// Another error's code and message (see `replicate`).
    #[error("{message}")]
    Copied { code: &'static str, message: String },
}

impl Error {
    /// The same failure for another row or caller, with the same code and message. Errors are
    /// not `Clone` (I/O errors are not): variants without payloads are copied, the rest become
    /// `Copied`.
    pub fn replicate(&self) -> Error {
        match self {
            Error::EngineClosed => Error::EngineClosed,
            Error::EngineDead => Error::EngineDead,
            Error::ModelDisposed => Error::ModelDisposed,
            Error::Cancelled(r) => Error::Cancelled(r),
            other => Error::Copied { code: other.code(), message: other.to_string() },
        }
    }

    /// The stable, documented code of this error (mirrored in index.d.ts `ErrorCode`).
    pub fn code(&self) -> &'static str {
        match self {
            Error::ModelNotFound(_) | Error::NoModelMatch(_) => "MODEL_NOT_FOUND",
            Error::AmbiguousModel { .. } => "AMBIGUOUS_MODEL",
            Error::InvalidWeights { .. } => "INVALID_WEIGHTS",
            Error::InvalidConfig { .. } => "INVALID_CONFIG",
            Error::InvalidCacheFile { .. } => "INVALID_CACHE_FILE",
            Error::InvalidDump { .. } => "INVALID_LOGITS_DUMP",
            Error::UnsupportedModelType(_) => "UNSUPPORTED_MODEL_TYPE",
            Error::UnsupportedQuant { .. } => "UNSUPPORTED_QUANTIZATION",
            Error::Tensor { .. } => "INVALID_TENSOR",
            Error::InvalidOption { .. } => "INVALID_OPTION",
            Error::InvalidPrompt(_) => "INVALID_PROMPT",
            Error::InvalidGrammar(_) => "INVALID_GRAMMAR",
            Error::Tokenizer(_) => "TOKENIZER_ERROR",
            Error::Template(_) => "TEMPLATE_ERROR",
            Error::Download(_) => "DOWNLOAD_FAILED",
            Error::Checksum { .. } => "CHECKSUM_MISMATCH",
            Error::EngineClosed => "ENGINE_CLOSED",
            Error::EngineDead => "ENGINE_DEAD",
            Error::Internal(_) => "INTERNAL_ERROR",
            Error::UnsupportedOption { .. } => "UNSUPPORTED_OPTION",
            Error::ModelDisposed => "MODEL_DISPOSED",
            Error::Mlx(_) => "MLX_ERROR",
            Error::Io { .. } => "IO_ERROR",
            Error::AdmissionRejected(_) => "ADMISSION_REJECTED",
            Error::InsufficientMemory(_) => "INSUFFICIENT_MEMORY",
            Error::NotAStream => "NOT_A_STREAM",
            Error::AlreadyConsumed => "ALREADY_CONSUMED",
            Error::ConcurrentNext => "CONCURRENT_NEXT",
            Error::Protocol(_) => "METHOD_PROTOCOL",
            Error::Cancelled(_) => "CANCELLED",
            Error::Aggregate(_) => "AGGREGATE_ERROR",
            Error::Copied { code, .. } => code,
        }
    }

    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    pub fn option(option: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidOption { option, reason: reason.into() }
    }

    pub fn weights(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::InvalidWeights { path: path.into(), reason: reason.into() }
    }

    pub fn config(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::InvalidConfig { path: path.into(), reason: reason.into() }
    }

    pub fn tensor(tensor: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Tensor { tensor: tensor.into(), reason: reason.into() }
    }
}

/// Runs `f`, turning a panic inside it into `INTERNAL_ERROR` with the panic's message, so that a
/// bug fails the work that hit it instead of the engine thread or the host process.
pub fn catch_panic<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| Err(Error::from_panic(payload)))
}

impl Error {
    /// `INTERNAL_ERROR` carrying a caught panic's message.
    pub fn from_panic(payload: Box<dyn std::any::Any + Send>) -> Error {
        let message = match payload.downcast::<String>() {
            Ok(s) => *s,
            Err(payload) => payload.downcast_ref::<&str>().map_or_else(|| "a panic without a message".to_string(), |s| s.to_string()),
        };
        Error::Internal(message)
    }
}

impl From<mlx_rs::error::Exception> for Error {
    fn from(e: mlx_rs::error::Exception) -> Self {
        Error::Mlx(e.what().to_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
