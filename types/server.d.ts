// Types of the HTTP server: loadContext, createServer (Rust: src/server).
import type { ChatTemplate, LoadOptions } from '../index'
import type { FillMode, FillOptions } from './sessions'

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
  /** A model whose weights leave no context in this many bytes (`fit`'s `maxSafeContext` 0) throws `INSUFFICIENT_MEMORY` before it loads. */
  memoryBudgetBytes?: number
}

/**
 * `loadContext(dir, id?, options?)`: returns at once; the model loads on the engine thread.
 * `memoryBudgetBytes` (mlx-bun's: refuse a model whose `fit()` leaves no context) throws
 * `UNSUPPORTED_OPTION`: this engine does not admit models by memory yet.
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
  /** The engine's `fill` (see `EngineOptions.fill`); default `MLX_BUN_FILL`, else off. */
  fill?: FillMode | FillOptions
  /**
   * Every request's KV caches quantized from its first step: `'config'` (default) per the model's
   * kv_config.json (plain when the folder has none), a number of bits (2, 3, 4, 5, 6, 8; group 64)
   * for every layer, or `'off'`.
   */
  kvQuant?: 'off' | 'config' | number
  /** The engine's `memoryBudgetBytes` (see `EngineOptions`): a request whose context cannot fit gets `400` `INSUFFICIENT_MEMORY`. Default: none (mlx-bun: RAM × 0.75). */
  memoryBudgetBytes?: number
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
 * `POST /v1/completions`, Anthropic's `POST /v1/messages`, `GET /v1/models`, `/health`,
 * `/stats` and `/fit` (mlx-bun's fit report of the served model, `?ctx=N&kvBits=B`), on `port`
 * (0: a free one), the same server as `mlx-bun serve`. mlx-bun's `kvQuant`,
 * `memoryBudgetBytes`, `defaultThinking`, `defaultAdapter` and `hlg` throw `UNSUPPORTED_OPTION`.
 */
export function createServer(ctx: ServerContext, port: number, options?: ServerOptions): HttpServer
