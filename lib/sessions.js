'use strict'
// Sessions as JavaScript iterates them: the state machine, queue bounds and idle timer live in
// Rust; these classes turn its batched delivery into one event (or token) per `next()`.
const { coded } = require('./errors')
const { native } = require('./native')
const { checkKeys } = require('./options')

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
    const { promptTokens, messages, chat, cache, draftModel, ...options } = request
    if (cache !== undefined && !(cache instanceof native.KvCache)) throw coded('INVALID_OPTION', 'cache: must be a cache made by model.makeCache()')
    if (draftModel !== undefined && !(draftModel instanceof native.Model)) throw coded('INVALID_OPTION', 'draftModel: must be a model (createModel, loadModel)')
    const { output = 'stream', onTokens, signal } = control
    if (typeof output !== 'string') throw coded('INVALID_OPTION', `output: must be 'stream', 'collect' or 'callback'`)
    if (onTokens !== undefined && typeof onTokens !== 'function') throw coded('INVALID_OPTION', 'onTokens: must be a function')
    if (signal !== undefined && (signal === null || typeof signal.addEventListener !== 'function')) {
      throw coded('INVALID_OPTION', 'signal: must be an AbortSignal')
    }
    const session = this.#native.open(promptTokens ?? null, messages ?? null, chat ?? null, options, output, typeof onTokens === 'function', signal?.aborted === true, cache, draftModel)
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

module.exports = { GenerationSession, InferenceEngine, Generation }
