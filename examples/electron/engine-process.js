'use strict'
// The engine side of the Electron example. main.js starts this file in a utilityProcess (a child
// process Chromium launches, with Node inside), so model loading and MLX work never share a
// process with the window or with Electron's main process; a crash here leaves the window alive.
//
// It answers one MessagePort with a small protocol (README.md, "Protocol"):
//   in:  { type: 'load', id?, modelPath?, options? }      modelPath defaults to defaultModelPath()
//        { type: 'generate', id, messages | prompt, options? }
//        { type: 'cancel', id }                           a no-op once `id` has ended
//        { type: 'close' }
//   out: { type: 'loaded', id, modelPath, modelType }
//        { type: 'token', id, text }                      text of whole UTF-8 characters
//        { type: 'done', id, finishReason, stats }
//        { type: 'error', id, code, message }             id null when the message had none
//        { type: 'closed' }
// `serve` takes any port with `on('message', listener(data))` and `postMessage`, so the protocol
// runs under plain Node with worker_threads' MessageChannel (__test__/electron-protocol.test.js);
// only the last lines of this file touch Electron.

const MESSAGE_KEYS = {
  load: ['type', 'id', 'modelPath', 'options'],
  generate: ['type', 'id', 'messages', 'prompt', 'options'],
  cancel: ['type', 'id'],
  close: ['type'],
}

/** An Error with a stable `code`, as mlx-bun's own errors carry. */
function coded(code, message) {
  return Object.assign(new Error(message), { code })
}

const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v)
const isId = (v) => typeof v === 'string' || Number.isSafeInteger(v)

/** Refuses malformed messages by name rather than guessing what the sender meant. */
function checkMessage(msg) {
  if (!isObject(msg)) throw coded('INVALID_MESSAGE', 'a message must be an object with a `type`')
  const keys = MESSAGE_KEYS[msg.type]
  if (keys === undefined) throw coded('INVALID_MESSAGE', `type: unknown message type ${JSON.stringify(msg.type)} (one of ${Object.keys(MESSAGE_KEYS).join(', ')})`)
  for (const key of Object.keys(msg)) {
    if (!keys.includes(key)) throw coded('INVALID_MESSAGE', `${key}: not a key of a '${msg.type}' message`)
  }
  if (msg.id !== undefined && !isId(msg.id)) throw coded('INVALID_MESSAGE', 'id: must be a string or a safe integer')
  if (msg.id === undefined && (msg.type === 'generate' || msg.type === 'cancel')) throw coded('INVALID_MESSAGE', `id: a '${msg.type}' message needs one`)
  if (msg.options !== undefined && !isObject(msg.options)) throw coded('INVALID_MESSAGE', 'options: must be an object')
}

/**
 * Serves the protocol on `port` until a `close` message or `close()`. `mlx` is the mlx-bun module
 * (default `require('mlx-bun')`; the repository's tests pass their own build); `onClose` runs once
 * everything is released (the utilityProcess exits there). Returns `{ close }`.
 */
function serve(port, { mlx = require('mlx-bun'), onClose } = {}) {
  let current = null // { model, tokenizer, template }
  let loading = Promise.resolve() // the chain of loads; never rejects
  const running = new Map() // id -> { controller, task }
  let closing = null

  const post = (msg) => port.postMessage(msg)
  const fail = (id, err) => post({ type: 'error', id: id ?? null, code: err?.code ?? 'INTERNAL_ERROR', message: String(err?.message ?? err) })

  async function load(msg) {
    const previous = current
    current = null
    // Weights are released once that model's running generations end (Model.dispose).
    previous?.model.dispose()
    const modelPath = msg.modelPath ?? mlx.defaultModelPath()
    if (typeof modelPath !== 'string') throw coded('INVALID_MESSAGE', 'modelPath: must be a string')
    const model = await mlx.loadModel(modelPath, msg.options)
    try {
      const tokenizer = mlx.loadTokenizer(modelPath)
      const template = mlx.ChatTemplate.load(modelPath)
      current = { model, tokenizer, template }
    } catch (e) {
      model.dispose()
      throw e
    }
    post({ type: 'loaded', id: msg.id ?? null, modelPath, modelType: model.config.modelType })
  }

  function promptTokens({ tokenizer, template }, { messages, prompt }) {
    if ((messages === undefined) === (prompt === undefined)) throw coded('INVALID_MESSAGE', 'a generate message needs `messages` or `prompt`, not both')
    if (prompt !== undefined) {
      if (typeof prompt !== 'string') throw coded('INVALID_MESSAGE', 'prompt: must be a string')
      return tokenizer.encode(prompt, true)
    }
    if (!Array.isArray(messages)) throw coded('INVALID_MESSAGE', 'messages: must be an array of { role, content }')
    if (template === null) throw coded('TEMPLATE_ERROR', 'this model has no chat template: send `prompt` instead of `messages`')
    // As mlx-bun's chat path does: the template writes the special tokens itself.
    return tokenizer.encode(template.render(messages, { addGenerationPrompt: true }), false)
  }

  async function run(msg, controller) {
    const { id } = msg
    await loading
    if (current === null) throw coded('NOT_LOADED', 'no model is loaded: send { type: "load" } first')
    const { model, tokenizer } = current
    const options = msg.options ?? {}
    if ('signal' in options) throw coded('INVALID_MESSAGE', 'options.signal: cancel with { type: "cancel", id }')
    const gen = mlx.generate(model, promptTokens(current, msg), { ...options, signal: controller.signal })
    // One decoder per generation: it holds back the bytes of a character split across tokens.
    const decoder = tokenizer.createDecoder()
    for await (const { token } of gen) {
      const text = decoder.push([token])
      if (text) post({ type: 'token', id, text })
    }
    const tail = decoder.flush()
    if (tail) post({ type: 'token', id, text: tail })
    post({ type: 'done', id, finishReason: gen.finishReason, stats: gen.stats })
  }

  function generate(msg) {
    if (running.has(msg.id)) throw coded('DUPLICATE_ID', `id: generation ${JSON.stringify(msg.id)} is still running`)
    // Registered before the load is awaited, so that a cancel sent meanwhile is not lost: the
    // generation then starts with an aborted signal and ends at once as 'cancelled'.
    const controller = new AbortController()
    const task = run(msg, controller)
      .catch((e) => fail(msg.id, e))
      .finally(() => running.delete(msg.id))
    running.set(msg.id, { controller, task })
  }

  function close() {
    closing ??= (async () => {
      for (const { controller } of running.values()) controller.abort()
      await Promise.all([...running.values()].map((r) => r.task))
      await loading
      current?.model.dispose()
      current = null
      post({ type: 'closed' })
      port.close?.()
      onClose?.()
    })()
    return closing
  }

  function handle(msg) {
    checkMessage(msg)
    if (closing) throw coded('ENGINE_CLOSED', 'the engine is closing')
    switch (msg.type) {
      case 'load':
        // Loads run one after another, so the last one sent is the model that stays.
        loading = loading.then(() => load(msg)).catch((e) => fail(msg.id, e))
        break
      case 'generate':
        generate(msg)
        break
      case 'cancel':
        running.get(msg.id)?.controller.abort()
        break
      case 'close':
        close()
        break
    }
  }

  port.on('message', (msg) => {
    try {
      handle(msg)
    } catch (e) {
      fail(isObject(msg) && isId(msg.id) ? msg.id : null, e)
    }
  })
  return { close }
}

/**
 * Electron's MessagePortMain as the port `serve` takes: its 'message' events carry
 * `{ data, ports }` instead of the data itself. Call `port.start()` after `serve`: a
 * MessagePortMain queues messages until then.
 */
function fromElectronPort(port) {
  return {
    on: (event, listener) => port.on(event, event === 'message' ? (e) => listener(e.data) : listener),
    postMessage: (msg) => port.postMessage(msg),
    close: () => port.close(),
  }
}

/** What runs inside the utilityProcess: main.js sends one port; `close` ends the process. */
function serveParentPort(parentPort) {
  parentPort.once('message', (e) => {
    const [port] = e.ports
    serve(fromElectronPort(port), { onClose: () => process.exit(0) })
    port.start()
  })
}

if (process.parentPort) serveParentPort(process.parentPort)

module.exports = { serve, fromElectronPort }
