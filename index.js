'use strict'
// mlx-bun: the JavaScript face of the native engine. Everything heavy runs in Rust; this file
// loads the platform binding, maps native errors to `err.code`, and turns batched native token
// delivery into the per-token async iteration mlx-bun users write `for await` over.
const { existsSync } = require('node:fs')
const { join } = require('node:path')

function platformTriple() {
  const { platform, arch } = process
  if (platform === 'linux' && (arch === 'x64' || arch === 'arm64')) return `linux-${arch}-gnu`
  if (platform === 'darwin' && arch === 'arm64') return 'darwin-arm64'
  throw new Error(`mlx-bun: unsupported platform ${platform}-${arch} (supported: linux-x64-gnu, linux-arm64-gnu, darwin-arm64)`)
}

function loadNative() {
  const triple = platformTriple()
  const local = join(__dirname, `mlx-bun.${triple}.node`)
  if (existsSync(local)) return require(local)
  try {
    return require(`@mlx-bun/${triple}`)
  } catch (e) {
    throw new Error(`mlx-bun: the native binding for ${triple} is missing (build it with \`npm run build\` or install @mlx-bun/${triple}): ${e.message}`)
  }
}

const native = loadNative()
native.installExitHook(require('node:worker_threads').isMainThread)

const CODED = /^([A-Z][A-Z0-9_]+): ([\s\S]*)$/
// napi's own argument conversion errors (a string where a number belongs, ...) are bad options.
const NAPI_ARG = new Set(['InvalidArg', 'ObjectExpected', 'StringExpected', 'NameExpected', 'FunctionExpected', 'NumberExpected', 'BooleanExpected', 'ArrayExpected', 'BigintExpected'])

/** Moves the `CODE: ` prefix of a native error message into `err.code`. */
function mapError(e) {
  if (e instanceof Error && typeof e.message === 'string') {
    const m = CODED.exec(e.message)
    if (m) {
      e.code = m[1]
      e.message = m[2]
    } else if (NAPI_ARG.has(e.code)) {
      e.code = 'INVALID_OPTION'
    } else if (e.code === 'GenericFailure') {
      // A panic inside a binding (napi's catch_unwind): a bug, thrown instead of aborting.
      e.code = 'INTERNAL_ERROR'
    }
  }
  return e
}

function coded(code, message) {
  return Object.assign(new Error(message), { code })
}

// Every option object is checked by key: nothing a caller writes is silently ignored. Options of
// mlx-bun's API that this engine does not implement yet are refused by name (UNSUPPORTED_OPTION);
// any other unknown key is INVALID_OPTION, naming the known key it most resembles.
const GENERATE_KEYS = ['maxTokens', 'prefillChunkSize', 'eosTokenIds', 'temperature', 'topP', 'topK', 'minP', 'minTokensToKeep',
  'repetitionPenalty', 'repetitionContextSize', 'presencePenalty', 'presenceContextSize', 'frequencyPenalty', 'frequencyContextSize',
  'logitBias', 'seed', 'logprobs', 'topLogprobs', 'cache']
const OPTION_KEYS = {
  generate: new Set([...GENERATE_KEYS, 'signal']),
  request: new Set([...GENERATE_KEYS, 'promptTokens', 'messages', 'chat', 'cacheNamespace', 'sessionId']),
  control: new Set(['output', 'onTokens', 'signal']),
  chat: new Set(['addGenerationPrompt', 'tools', 'enableThinking', 'extra']),
  engine: new Set(['idleTimeoutMs', 'maxQueuedEvents', 'maxQueuedTokens', 'maxTopLogprobs', 'maxCollectTokens', 'maxActive', 'maxQueued',
    'maxIterationTokens', 'maxPreparationTokens', 'prefixCacheBytes', 'tokenizer', 'chatTemplate']),
  load: new Set(['f32Matmuls']),
  context: new Set(['f32Matmuls', 'chatTemplate']),
  server: new Set(['host', 'apiKey', 'corsOrigins', 'defaultMaxTokens', 'defaultTemperature', 'defaultTopP', 'defaultTopK',
    'promptCacheBytes', 'batch', 'maxQueued', 'bodyLimit', 'log', 'shutdownGraceMs']),
}
const NOT_YET = {
  kvBits: 'quantized KV caches',
  kvGroupSize: 'quantized KV caches',
  quantizedKvStart: 'quantized KV caches',
  kvConfig: 'quantized KV caches',
  xtcProbability: 'XTC sampling',
  xtcThreshold: 'XTC sampling',
  adapters: 'LoRA adapters',
  promptEmbeddings: 'vision inputs',
  imageMask: 'vision inputs',
  visionPixels: 'vision inputs',
}
// mlx-bun's server options this engine does not implement yet.
const NOT_YET_SERVING = {
  kvQuant: 'quantized KV caches',
  memoryBudgetBytes: 'memory budgets (fit)',
  defaultThinking: 'thinking controls',
  defaultAdapter: 'LoRA adapters',
  hlg: 'HLG decoding',
}
const NOT_YET_BY_KIND = { generate: NOT_YET, request: NOT_YET, server: NOT_YET_SERVING, context: NOT_YET_SERVING }

/** Edit distance, for "did you mean". */
function distance(a, b) {
  a = a.toLowerCase()
  b = b.toLowerCase()
  let row = Array.from({ length: b.length + 1 }, (_, j) => j)
  for (let i = 1; i <= a.length; i++) {
    const next = [i]
    for (let j = 1; j <= b.length; j++) next[j] = Math.min(row[j] + 1, next[j - 1] + 1, row[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1))
    row = next
  }
  return row[b.length]
}

/** Throws for the first key of `obj` that the `kind` of options does not have (undefined values count as absent). */
function checkKeys(kind, obj) {
  const known = OPTION_KEYS[kind]
  for (const key of Object.keys(obj)) {
    if (known.has(key) || obj[key] === undefined) continue
    const notYet = NOT_YET_BY_KIND[kind]
    if (notYet && Object.hasOwn(notYet, key)) {
      throw coded('UNSUPPORTED_OPTION', `${key}: ${notYet[key]} are not supported by this engine yet`)
    }
    let near = null
    for (const k of known) if (distance(key, k) <= Math.max(2, Math.floor(k.length / 4)) && (near === null || distance(key, k) < distance(key, near))) near = k
    throw coded('INVALID_OPTION', `${key}: not a ${kind} option${near ? ` (did you mean '${near}'?)` : ''}`)
  }
}

function wrap(fn) {
  return function (...args) {
    let r
    try {
      r = fn.apply(this, args)
    } catch (e) {
      throw mapError(e)
    }
    return r && typeof r.then === 'function' ? r.catch((e) => Promise.reject(mapError(e))) : r
  }
}

// Native methods throw coded errors; map them at the source, once.
for (const cls of [native.Weights, native.Model, native.Tokenizer, native.StreamDecoder, native.ChatTemplate, native.NativeEngine, native.NativeSession, native.KvCache, native.ServerContext, native.HttpServer]) {
  for (const key of Object.getOwnPropertyNames(cls.prototype)) {
    const d = Object.getOwnPropertyDescriptor(cls.prototype, key)
    if (key !== 'constructor' && typeof d.value === 'function') {
      Object.defineProperty(cls.prototype, key, { ...d, value: wrap(d.value) })
    } else if (typeof d.get === 'function') {
      Object.defineProperty(cls.prototype, key, { ...d, get: wrap(d.get) })
    }
  }
}

// Static factories are not redefinable on native classes; expose mapped ones on subclasses.
class Weights extends native.Weights {
  static open = wrap((path) => native.Weights.open(path))
}
class ChatTemplate extends native.ChatTemplate {
  static load = wrap((path) => native.ChatTemplate.load(path))
  static fromString = wrap((source, bosToken, eosToken) => native.ChatTemplate.fromString(source, bosToken, eosToken))
}

/** A native event batch, read back one `GenerationEvent` at a time. */
class BatchReader {
  constructor(b) {
    this.b = b
    this.event = 0
    this.token = 0
    this.progress = 0
    this.sequence = b.firstSequence
  }

  get empty() {
    return this.event >= this.b.counts.length
  }

  next() {
    const b = this.b
    const n = b.counts[this.event++]
    if (n < 0) {
      const completed = b.progress[this.progress]
      const total = b.progress[this.progress + 1]
      this.progress += 2
      return Number.isNaN(total) ? { type: 'progress', completed } : { type: 'progress', completed, total }
    }
    const start = this.token
    this.token += n
    const event = { type: 'committed', sequence: this.sequence++, tokenIds: Array.from(b.tokens.subarray(start, start + n)) }
    if (b.logprobs && n > 0 && b.logprobs[start] != null) event.logprobs = b.logprobs.slice(start, start + n)
    return event
  }
}

function toOutcome(o) {
  const out = { status: o.status, committedTokens: o.committedTokens }
  if (o.status === 'completed') out.result = o.result
  else if (o.status === 'cancelled') out.reason = o.reason
  else out.error = o.error
  if (o.output) out.output = o.output
  if (o.metrics && o.status !== 'completed') out.metrics = o.metrics
  return out
}

/**
 * One generation of an engine (mlx-bun's GenerationSession). The state machine, queue bounds and
 * idle timer live in Rust; this adapts batched native delivery to per-event iteration.
 */
class GenerationSession {
  #native
  #result
  #reader = null
  #reading = false

  constructor(nativeSession, output, onTokens, signal) {
    this.#native = nativeSession
    if (signal) {
      const onAbort = () => this.cancel('requested').catch(() => {})
      if (signal.aborted) onAbort()
      else {
        signal.addEventListener('abort', onAbort, { once: true })
        this.result.then(() => signal.removeEventListener('abort', onAbort))
      }
    }
    if (output === 'callback') this.#pump(onTokens)
  }

  get id() {
    return this.#native.id
  }

  get state() {
    return this.#native.state
  }

  /** Created on first use, so a session nobody holds can be collected (and is then closed). */
  get result() {
    return (this.#result ??= this.#native.outcome().then(toOutcome))
  }

  get events() {
    return { [Symbol.asyncIterator]: () => this.#iterator() }
  }

  async cancel(reason) {
    this.#reader = null
    this.#native.cancel(reason)
    await this.result
  }

  close() {
    return this.cancel('consumer_closed')
  }

  #iterator() {
    this.#native.claimReader()
    const iterator = {
      next: () => this.#next(),
      return: async () => {
        await this.close()
        return { done: true, value: undefined }
      },
      throw: async (error) => {
        await this.close()
        throw error
      },
      [Symbol.asyncIterator]: () => iterator,
    }
    return iterator
  }

  async #next() {
    if (this.#reading) throw coded('CONCURRENT_NEXT', 'concurrent next() is not supported')
    this.#reading = true
    try {
      if (this.#reader === null || this.#reader.empty) {
        const batch = await this.#native.nextBatch()
        if (batch === null) return { done: true, value: undefined }
        this.#reader = new BatchReader(batch)
      }
      const event = this.#reader.next()
      this.#native.consumed(1)
      return { done: false, value: event }
    } finally {
      this.#reading = false
    }
  }

  /** Callback mode: hands each batch of committed tokens to `onTokens` and awaits it. */
  async #pump(onTokens) {
    const native = this.#native
    for (;;) {
      const batch = await native.nextBatch().catch(() => null)
      if (batch === null) return
      const events = batch.counts.length
      if (batch.counts.some((n) => n >= 0)) {
        let r
        try {
          const lp = batch.logprobs ? batch.logprobs.map((l) => l ?? undefined) : undefined
          r = await onTokens(Array.from(batch.tokens), lp)
        } catch (e) {
          // Fail before acknowledging: the acknowledgement may let the session complete.
          native.failOutput(e instanceof Error ? e.message : String(e))
          native.consumed(events)
          continue
        }
        native.consumed(events)
        if (r === false) native.stopOutput()
      } else {
        native.consumed(events)
      }
    }
  }
}

/** mlx-bun's InferenceEngine over one model: `open` sessions, `close` them all. */
class InferenceEngine {
  #native

  constructor(nativeEngine) {
    this.#native = nativeEngine
  }

  open(request, control = {}) {
    if (request === null || typeof request !== 'object') throw coded('INVALID_OPTION', 'request: must be an object')
    if (control === null || typeof control !== 'object') throw coded('INVALID_OPTION', 'control: must be an object')
    checkKeys('request', request)
    checkKeys('control', control)
    if (request.chat != null && typeof request.chat === 'object') checkKeys('chat', request.chat)
    const { promptTokens, messages, chat, cache, ...options } = request
    if (cache !== undefined && !(cache instanceof native.KvCache)) throw coded('INVALID_OPTION', 'cache: must be a cache made by model.makeCache()')
    const { output = 'stream', onTokens, signal } = control
    if (typeof output !== 'string') throw coded('INVALID_OPTION', `output: must be 'stream', 'collect' or 'callback'`)
    if (onTokens !== undefined && typeof onTokens !== 'function') throw coded('INVALID_OPTION', 'onTokens: must be a function')
    if (signal !== undefined && (signal === null || typeof signal.addEventListener !== 'function')) {
      throw coded('INVALID_OPTION', 'signal: must be an AbortSignal')
    }
    const session = this.#native.open(promptTokens ?? null, messages ?? null, chat ?? null, options, output, typeof onTokens === 'function', signal?.aborted === true, cache)
    return new GenerationSession(session, output, onTokens, signal)
  }

  close() {
    this.#native.markClosed()
    return this.#native.close()
  }

  get closed() {
    return this.#native.closed
  }

  get stats() {
    return this.#native.stats
  }

  /** What this engine can do, in `resolveExecution`'s terms; every request is placed against it. */
  get capabilities() {
    return this.#native.capabilities
  }
}

/** JSON-bound values with NaN and infinities as text, which JSON cannot carry; Rust rejects them by name. */
function jsonSafe(v) {
  if (typeof v === 'number') return Number.isFinite(v) ? v : String(v)
  if (Array.isArray(v)) return v.map(jsonSafe)
  if (v !== null && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, jsonSafe(x)]))
  return v
}

function engineOptions(options) {
  if (options === null || typeof options !== 'object') throw coded('INVALID_OPTION', 'options: must be an object')
  checkKeys('engine', options)
  const { tokenizer, chatTemplate, ...rest } = options
  return [jsonSafe(rest), tokenizer ?? null, chatTemplate ?? null]
}

/** `createEngine(model, options)`: sessions over `model` with mlx-bun's limits (see index.d.ts). */
function createEngine(model, options = {}) {
  const [rest, tokenizer, chatTemplate] = engineOptions(options)
  return new InferenceEngine(wrap(native.createEngineNative)(model, rest, tokenizer, chatTemplate))
}

const testing = {
  /** An engine whose sessions replay `script` instead of running a model. */
  createScriptedEngine(script, options = {}) {
    const [rest] = engineOptions(options)
    return new InferenceEngine(wrap(native.createScriptedEngineNative)(jsonSafe(script), rest))
  },
  liveSessions: () => native.liveSessionsNative(),
  /** Panics inside a synchronous binding (for the panic-isolation tests). */
  panicInBinding: wrap((message) => native.panicNative(message)),
  batchCounts: () => native.batchCountsNative(),
}

// generate() runs on one engine per model that never cancels idle consumers and never rejects.
const generateEngines = new WeakMap()

function generateEngine(model) {
  let engine = generateEngines.get(model)
  if (engine === undefined) {
    // No prefix cache: as in mlx-bun, generate() keeps no state between calls (pass `cache`).
    engine = createEngine(model, { idleTimeoutMs: Number.MAX_SAFE_INTEGER, maxQueued: Number.MAX_SAFE_INTEGER - 8, prefixCacheBytes: 0 })
    generateEngines.set(model, engine)
  }
  return engine
}

/**
 * A running generation: iterate it once with `for await`. `stats` and `finishReason` are set when
 * it ends, including after `break` or an abort.
 */
class Generation {
  #session
  #started = false

  constructor(session) {
    this.#session = session
    this.stats = undefined
    this.finishReason = undefined
  }

  /** Stops generating; the iteration then ends with `finishReason === 'cancelled'`. */
  cancel() {
    this.#session.cancel('requested').catch(() => {})
  }

  [Symbol.asyncIterator]() {
    if (this.#started) throw coded('ALREADY_CONSUMED', 'a Generation can be iterated only once')
    this.#started = true
    return this.#iterate()
  }

  #finish(o) {
    this.stats = o.status === 'completed' ? o.result.metrics : o.metrics
    this.finishReason = o.status === 'completed' ? o.result.finishReason : 'cancelled'
  }

  async *#iterate() {
    const session = this.#session
    const events = session.events[Symbol.asyncIterator]()
    let index = 0
    try {
      for (let r = await events.next(); !r.done; r = await events.next()) {
        const e = r.value
        if (e.type !== 'committed') continue
        for (let i = 0; i < e.tokenIds.length; i++) {
          const t = { token: e.tokenIds[i], index: index++ }
          if (e.logprobs) t.logprobs = e.logprobs[i]
          yield t
        }
      }
      const outcome = await session.result
      this.#finish(outcome)
      if (outcome.status === 'failed') {
        const { cause, message } = outcome.error
        throw coded(cause ?? 'MLX_ERROR', message)
      }
    } finally {
      if (this.stats === undefined) {
        // Left early (break, return, throw): stop the engine and wait for the final stats so
        // nothing stays pending and native state is released.
        await session.close()
        this.#finish(await session.result)
      }
    }
  }
}

/**
 * Streams tokens for `promptTokens`. Options follow mlx-bun (see index.d.ts); invalid options
 * throw here, synchronously, with `err.code === 'INVALID_OPTION'`.
 */
function generate(model, promptTokens, options = {}) {
  if (options === null || typeof options !== 'object') throw coded('INVALID_OPTION', 'options: must be an object')
  checkKeys('generate', options)
  const { signal, ...rest } = options
  const session = generateEngine(model).open({ ...rest, promptTokens }, signal ? { signal } : {})
  return new Generation(session)
}

/**
 * `model.ready` (and a server context's): resolves once the engine thread has built the model, rejects with the load's
 * typed error (every use of a model whose load failed fails with that error too). Marked handled,
 * so a caller who never awaits it gets no unhandled rejection.
 */
function withReady(model) {
  const ready = model.loaded()
  ready.catch(() => {})
  Object.defineProperty(model, 'ready', { value: ready, enumerable: false })
  return model
}

function loadOptions(options) {
  if (options === undefined || options === null) return options
  if (typeof options !== 'object') throw coded('INVALID_OPTION', 'options: must be an object')
  checkKeys('load', options)
  return options
}

/** Saves a cache made by `model.makeCache()` to `path`; resolves once the file is written. */
function saveKvCache(cache, path) {
  if (!(cache instanceof native.KvCache)) throw coded('INVALID_OPTION', 'cache: must be a cache made by model.makeCache()')
  if (typeof path !== 'string' || path === '') throw coded('INVALID_OPTION', 'path: must be a non-empty string')
  return wrap(native.saveKvCache)(cache, path)
}

/** A new cache of `model` restored from a file `saveKvCache` wrote. */
function loadKvCache(model, path) {
  if (!(model instanceof native.Model)) throw coded('INVALID_OPTION', 'model: must be a model (createModel, loadModel)')
  if (typeof path !== 'string' || path === '') throw coded('INVALID_OPTION', 'path: must be a non-empty string')
  return wrap(native.loadKvCache)(model, path)
}

function optionObject(options) {
  if (options === undefined || options === null) return {}
  if (typeof options !== 'object') throw coded('INVALID_OPTION', 'options: must be an object')
  return options
}

/**
 * `loadContext(dir, id?, options?)`: a model to serve. Returns at once; the weights load on the
 * engine thread (`ctx.ready`), and requests wait behind the load.
 */
function loadContext(dir, id, options) {
  if (id !== null && typeof id === 'object') [id, options] = [undefined, id]
  if (typeof dir !== 'string' || dir === '') throw coded('INVALID_OPTION', 'dir: must be a non-empty string')
  if (id !== undefined && id !== null && typeof id !== 'string') throw coded('INVALID_OPTION', 'id: must be a string')
  options = optionObject(options)
  checkKeys('context', options)
  const { chatTemplate, ...load } = options
  let source = null
  if (chatTemplate instanceof native.ChatTemplate) source = chatTemplate.source
  else if (typeof chatTemplate === 'string') source = chatTemplate
  else if (chatTemplate != null) throw coded('INVALID_OPTION', 'chatTemplate: must be a ChatTemplate or a template source string')
  return withReady(wrap(native.loadContextNative)(dir, id ?? null, load, source))
}

/**
 * `createServer(ctx, port, options?)`: OpenAI- and Anthropic-compatible HTTP on `port` (0: any
 * free one). Like `Bun.serve`, a running server keeps the process alive until `close()`.
 */
function createServer(ctx, port, options) {
  if (!(ctx instanceof native.ServerContext)) throw coded('INVALID_OPTION', 'ctx: must be a context made by loadContext()')
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw coded('INVALID_OPTION', `port: must be an integer in [0, 65535], got ${port}`)
  options = optionObject(options)
  checkKeys('server', options)
  const server = wrap(native.createServerNative)(ctx, port, options)
  const alive = setInterval(() => {}, 1 << 30)
  const close = server.close.bind(server)
  let closing = null
  Object.defineProperty(server, 'close', {
    value: () => {
      closing ??= close().finally(() => clearInterval(alive))
      return closing
    },
  })
  return server
}

/** mlx-bun 0.5's placement policy; the result is frozen, as in mlx-bun. */
function resolveExecution(request, capabilities, features) {
  const r = wrap(native.resolveExecutionNative)(request, capabilities, features)
  return Object.freeze({ ...r, reasons: Object.freeze(r.reasons) })
}

module.exports = {
  generate,
  Generation,
  createEngine,
  InferenceEngine,
  GenerationSession,
  testing,
  loadModelConfig: wrap(native.loadModelConfig),
  loadModel: wrap(async (path, options) => withReady(await native.loadModel(path, loadOptions(options)))),
  createModel: wrap((weights, config, options) => withReady(native.createModel(weights, config, loadOptions(options)))),
  loadTokenizer: wrap(native.loadTokenizerNative),
  pullDefaultModel: wrap(native.pullDefaultModel),
  defaultModelPath: native.defaultModelPath,
  convert: wrap(native.convert),
  runCli: wrap(native.runCli),
  resolveExecution,
  saveKvCache,
  loadKvCache,
  loadContext,
  createServer,
  Weights,
  Model: native.Model,
  Tokenizer: native.Tokenizer,
  StreamDecoder: native.StreamDecoder,
  ChatTemplate,
  mapError,
}
