'use strict'
// mlx-bun: the JavaScript face of the native engine. Everything heavy runs in Rust; this file
// assembles mlx-bun's API over lib/: the addon and its runtime (native), errors with a `code`
// (errors), option keys checked by name (options), sessions iterated per token (sessions),
// models on disk (hub) and the memory contract (fit).
const { coded, mapError, wrap } = require('./lib/errors')
const { native, nativeRuntimeDir } = require('./lib/native')
const { checkKeys, optionObject, jsonSafe } = require('./lib/options')
const { GenerationSession, InferenceEngine, Generation } = require('./lib/sessions')
const { Registry, downloadModel } = require('./lib/hub')
const { fit, thisMachine, skuMatrix, COEXIST_FRACTION } = require('./lib/fit')

// Static factories are not redefinable on native classes; expose mapped ones on subclasses.
class Weights extends native.Weights {
  static open = wrap((path) => native.Weights.open(path))
}
class ChatTemplate extends native.ChatTemplate {
  /** mlx-bun's `load(dir, { disableThinking })`: with it, the template reports no reasoning switch. */
  static load = wrap((path, options) => {
    checkKeys('template', optionObject(options))
    const template = native.ChatTemplate.load(path)
    if (template !== null && options?.disableThinking === true) {
      Object.defineProperties(template, { thinkingFormat: { value: null }, supportsThinking: { value: false } })
    }
    return template
  })
  static fromString = wrap((source, bosToken, eosToken) => native.ChatTemplate.fromString(source, bosToken, eosToken))
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
  /** The sessions not yet ended, each described, and `lost`: counted live, referenced by nothing. */
  liveSessionStates: () => native.liveSessionStatesNative(),
  /** Panics inside a synchronous binding (for the panic-isolation tests). */
  panicInBinding: wrap((message) => native.panicNative(message)),
  batchCounts: () => native.batchCountsNative(),
  /** Bytes of the MLX arrays alive in the process (weights, caches, activations). */
  mlxActiveMemory: () => native.mlxActiveMemoryNative(),
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

function embedArgs(model, tokenizer, instruction) {
  if (!(model instanceof native.Model)) throw coded('INVALID_OPTION', 'model: must be a model (createModel, loadModel)')
  if (!(tokenizer instanceof native.Tokenizer)) throw coded('INVALID_OPTION', 'tokenizer: must be a tokenizer (loadTokenizer)')
  if (instruction !== undefined && instruction !== null && typeof instruction !== 'string') throw coded('INVALID_OPTION', 'instruction: must be a string')
}

/**
 * mlx-bun's `embedMany(model, tokenizer, texts, instruction?)`: one `{ vector, tokens }` per text
 * (the last hidden state at an appended end-of-text token, L2-normalised), computed in padded
 * batches on the engine thread.
 */
function embedMany(model, tokenizer, texts, instruction) {
  embedArgs(model, tokenizer, instruction)
  if (!Array.isArray(texts) || texts.some((t) => typeof t !== 'string')) throw coded('INVALID_OPTION', 'texts: must be an array of strings')
  return wrap(native.embedNative)(model, tokenizer, texts, instruction ?? null)
}

/** mlx-bun's `embedOne(model, tokenizer, text, instruction?)`: `embedMany` of one text. */
function embedOne(model, tokenizer, text, instruction) {
  embedArgs(model, tokenizer, instruction)
  if (typeof text !== 'string') throw coded('INVALID_OPTION', 'text: must be a string')
  return wrap(native.embedNative)(model, tokenizer, [text], instruction ?? null).then((r) => r[0])
}

/** mlx-bun's `withInstruction(text, instruction?)`: Qwen3-Embedding's query format. */
function withInstruction(text, instruction) {
  if (typeof text !== 'string') throw coded('INVALID_OPTION', 'text: must be a string')
  if (instruction !== undefined && instruction !== null && typeof instruction !== 'string') throw coded('INVALID_OPTION', 'instruction: must be a string')
  return native.withInstructionNative(text, instruction ?? null)
}

/** Every model this package loads pools its last hidden state (mlx-bun: Qwen3 models only). */
const isEmbeddingModel = (model) => model instanceof native.Model

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
  const { chatTemplate, memoryBudgetBytes, ...load } = options
  let source = null
  if (chatTemplate instanceof native.ChatTemplate) source = chatTemplate.source
  else if (typeof chatTemplate === 'string') source = chatTemplate
  else if (chatTemplate != null) throw coded('INVALID_OPTION', 'chatTemplate: must be a ChatTemplate or a template source string')
  return withReady(wrap(native.loadContextNative)(dir, id ?? null, load, source, memoryBudgetBytes ?? null))
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

/**
 * mlx-bun's `ensureNativeRuntime()`: checks that the MLX runtime loads, and says where it is and
 * what it runs on (`{ dir, backend, device, version }`). A runtime with a file missing fails
 * earlier, when the package loads, with `NATIVE_RUNTIME_MISSING` naming the file.
 */
async function ensureNativeRuntime(options) {
  checkKeys('runtime', optionObject(options))
  const info = await wrap(native.runtimeInfoNative)()
  return { dir: nativeRuntimeDir(), backend: info.backend, device: info.device, version: info.version }
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
  embedOne,
  embedMany,
  isEmbeddingModel,
  withInstruction,
  loadContext,
  createServer,
  Weights,
  Model: native.Model,
  Tokenizer: native.Tokenizer,
  StreamDecoder: native.StreamDecoder,
  ChatTemplate,
  mapError,
  nativeRuntimeDir,
  ensureNativeRuntime,
  Registry,
  downloadModel,
  fit,
  thisMachine,
  skuMatrix,
  COEXIST_FRACTION,
}
