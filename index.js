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
native.installExitHook()

const CODED = /^([A-Z][A-Z0-9_]+): ([\s\S]*)$/

/** Moves the `CODE: ` prefix of a native error message into `err.code`. */
function mapError(e) {
  if (e instanceof Error && typeof e.message === 'string') {
    const m = CODED.exec(e.message)
    if (m) {
      e.code = m[1]
      e.message = m[2]
    }
  }
  return e
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
for (const cls of [native.Weights, native.Model, native.Tokenizer, native.StreamDecoder, native.ChatTemplate, native.NativeGeneration]) {
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

/**
 * A running generation: iterate it once with `for await`. `stats` and `finishReason` are set when
 * it ends, including after `break` or an abort.
 */
class Generation {
  #native
  #signal
  #started = false

  constructor(nativeGeneration, signal) {
    this.#native = nativeGeneration
    this.#signal = signal
    this.stats = undefined
    this.finishReason = undefined
  }

  /** Stops generating; the iteration then ends with `finishReason === 'cancelled'`. */
  cancel() {
    this.#native.cancel()
  }

  [Symbol.asyncIterator]() {
    if (this.#started) throw Object.assign(new Error('a Generation can be iterated only once'), { code: 'ALREADY_CONSUMED' })
    this.#started = true
    return this.#iterate()
  }

  #finish(batch) {
    this.stats = batch.stats
    this.finishReason = batch.finishReason
  }

  async *#iterate() {
    const signal = this.#signal
    const onAbort = () => this.#native.cancel()
    if (signal?.aborted) onAbort()
    signal?.addEventListener('abort', onAbort, { once: true })
    let index = 0
    try {
      for (;;) {
        const batch = await this.#native.nextBatch()
        if (batch === null) return
        const { tokens, logprobs } = batch
        for (let i = 0; i < tokens.length; i++) {
          const t = { token: tokens[i], index: index++ }
          if (logprobs) t.logprobs = logprobs[i]
          yield t
        }
        if (batch.error) throw mapError(new Error(batch.error))
        if (batch.stats) return this.#finish(batch)
      }
    } finally {
      signal?.removeEventListener('abort', onAbort)
      if (this.stats === undefined) {
        // Left early (break, return, throw): stop the engine and wait for its final stats so
        // nothing stays pending and native state is released.
        this.#native.cancel()
        for (let batch; (batch = await this.#native.nextBatch().catch(() => null)) !== null; ) {
          if (batch.stats) {
            this.#finish(batch)
            break
          }
        }
      }
    }
  }
}

/**
 * Streams tokens for `promptTokens`. Options follow mlx-bun (see index.d.ts); invalid options
 * throw here, synchronously, with `err.code === 'INVALID_OPTION'`.
 */
function generate(model, promptTokens, options = {}) {
  const { signal, ...rest } = options ?? {}
  return new Generation(model.generate(promptTokens, rest), signal)
}

/** mlx-bun 0.5's placement policy; the result is frozen, as in mlx-bun. */
function resolveExecution(request, capabilities, features) {
  const r = wrap(native.resolveExecutionNative)(request, capabilities, features)
  return Object.freeze({ ...r, reasons: Object.freeze(r.reasons) })
}

module.exports = {
  generate,
  Generation,
  loadModelConfig: wrap(native.loadModelConfig),
  loadModel: wrap(native.loadModel),
  createModel: wrap(native.createModel),
  loadTokenizer: wrap(native.loadTokenizerNative),
  pullDefaultModel: wrap(native.pullDefaultModel),
  defaultModelPath: native.defaultModelPath,
  convert: wrap(native.convert),
  runCli: wrap(native.runCli),
  resolveExecution,
  Weights,
  Model: native.Model,
  Tokenizer: native.Tokenizer,
  StreamDecoder: native.StreamDecoder,
  ChatTemplate,
  mapError,
}
