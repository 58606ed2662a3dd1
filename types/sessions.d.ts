// Types of engines and their sessions: createEngine, InferenceEngine, GenerationSession (Rust: src/engine).
import type { ChatMessage, ChatTemplate, ErrorCode, ExecutionCapabilities, GenerateOptions, GenerateStats, Model, Tokenizer } from '../index'

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
  /**
   * mlx-bun's `memoryBudgetBytes`: a session is admitted only while its whole context (prompt
   * and `maxTokens`, billed by `fit`'s formulas with its `kvBits`) fits beside the model's weights,
   * the contexts of the sessions running and the prefix cache. Prefix-cache entries are reclaimed
   * first (oldest first); then it waits for running sessions to end; a context that could not fit
   * even alone fails the session with `INSUFFICIENT_MEMORY`. Default: none.
   */
  memoryBudgetBytes?: number
  /** Tokenizer for `messages` requests. Default: the one beside the model. */
  tokenizer?: Tokenizer
  /** Chat template for `messages` requests. Default: the model's own. */
  chatTemplate?: ChatTemplate
  /**
   * mlx-bun's `grammarJump`: text a request's grammar forces (a JSON key, a closing brace) is
   * fed to the model in one step instead of one step per token. Placed as mlx-bun places it:
   * such requests run as grammar proposals (`method: 'speculative'`) in the batch, without the
   * prefix cache; with `logprobs`, a forced token reports those of the grammar's masked
   * distribution (logprob 0, itself the only alternative). The forced text is tokenized
   * canonically, so tokens may differ from a run without it. Default false.
   */
  grammarJump?: boolean
  /**
   * mlx-bun's fill (`MLX_BUN_FILL` and its `_MAX_SPAN`, `_K`, `_CANDIDATES`, `_INDEX_MAX`,
   * `_TRACE` variables give the default; this option overrides them). `'echo'`: when the last
   * `k` tokens occurred earlier in the prompt or output, what followed them there is appended in
   * one step and only the prefix the model itself would produce is kept, so outputs are those of
   * a run without fill (greedy and seeded sampling alike) while edits and rewrites of the prompt's
   * text take fewer steps (for tool requests, spans the template determines are kept unverified,
   * as mlx-bun does). `'strict'` (included in `'echo'`): for `messages` with tools, the fixed
   * parts of a tool call, cut from the chat template's own rendering, are appended unverified once
   * the model has begun the call (see README). Requests with a grammar or logprobs run without
   * it; `stats.fill` counts what it did.
   * Default `'off'`.
   */
  fill?: FillMode | FillOptions
}

export type FillMode = 'off' | 'strict' | 'echo'

export interface FillOptions {
  mode?: FillMode
  /** Longest span appended at once, 2–512. Default 32. */
  maxSpan?: number
  /** Tokens an echo match needs, 2–64. Default 8. */
  k?: number
  /** Earlier occurrences (the nearest) an echo span consults, 1–1024. Default 24. */
  candidates?: number
  /** Tokens the echo index holds, 1024–2^24. Default 131072. */
  indexMax?: number
  /** A JSON-lines file that gets one record per proposal (proposed and sampled ids). */
  trace?: string | null
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

/** One generation (Rust: `engine::session::Session`); made by `InferenceEngine.open`. */
export class GenerationSession {
  private constructor()
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
  /** No work, and the memory its work freed handed back to the system (MLX's buffer cache, and on Linux malloc's free pages). An extension of mlx-bun. */
  idle: boolean
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

/** mlx-bun's `InferenceEngine` over one model; made by `createEngine`. */
export class InferenceEngine {
  private constructor()
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
  /** Bytes of the MLX arrays alive in the process (weights, caches, activations). */
  mlxActiveMemory(): number
}
