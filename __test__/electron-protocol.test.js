'use strict'
// The Electron example's engine protocol (examples/electron/engine-process.js), end to end on real
// SmolLM2 weights, without Electron: worker_threads' MessageChannel stands in for the
// MessageChannelMain that main.js connects, and electron-child.js stands in for the
// utilityProcess (process.parentPort and MessagePortMain as Electron documents them).
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const { spawn } = require('node:child_process')
const { MessageChannel } = require('node:worker_threads')

const mlx = require('..')
const { serve } = require('../examples/electron/engine-process.js')
const { ROOT, fixture, tmpdir, within } = require('./helpers')

const MODEL = fixture('home/models/SmolLM2-135M-Instruct.Q4_1.gguf')
// A system message of our own: the template's default one would make the prompt twice as long
// (4-bit prefill is slow on MLX's CPU backend).
const MESSAGES = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Capital of France?' }]
const RAW_PROMPT = 'Hello'

/** The window's end of a channel served by the engine: `send`, and `until(match)` that resolves
 * with the first message received (earlier ones included) that `match` accepts. */
function connect(options = {}) {
  const { port1, port2 } = new MessageChannel()
  const server = serve(port1, { mlx, ...options })
  const received = []
  const waiting = new Set()
  port2.on('message', (msg) => {
    received.push(msg)
    for (const w of waiting) if (w.match(msg)) { waiting.delete(w); w.resolve(msg) }
  })
  return {
    server,
    received,
    send: (msg) => port2.postMessage(msg),
    until(match, what) {
      const seen = received.find(match)
      if (seen) return Promise.resolve(seen)
      return within(new Promise((resolve) => waiting.add({ match, resolve })), what)
    },
    textOf: (id) => received.filter((m) => m.type === 'token' && m.id === id).map((m) => m.text).join(''),
    close: () => port2.close(),
  }
}

const isDone = (id) => (m) => (m.type === 'done' || m.type === 'error') && m.id === id

/** What a direct generate() gives for `promptTokens`: its text and how it ended. */
async function direct(model, tokenizer, promptTokens, options) {
  const gen = mlx.generate(model, promptTokens, options)
  const tokens = []
  for await (const { token } of gen) tokens.push(token)
  return { text: tokenizer.decode(tokens, true), tokens, finishReason: gen.finishReason }
}

let engine, model, tokenizer, template
let closedCalls = 0

before(async () => {
  engine = connect({ onClose: () => closedCalls++ })
  engine.send({ type: 'load', id: 'load-1', modelPath: MODEL })
  model = await mlx.loadModel(MODEL)
  tokenizer = mlx.loadTokenizer(MODEL)
  template = mlx.ChatTemplate.load(MODEL)
})

after(async () => {
  // Ends whatever a failed test left running (close is idempotent), so that the process exits.
  await engine.server.close()
  engine.close()
  model.dispose()
})

test('load answers with the model, and a greedy chat generation streams the text of a direct generate()', async () => {
  const loaded = await engine.until((m) => m.id === 'load-1', 'the load')
  assert.deepEqual(loaded, { type: 'loaded', id: 'load-1', modelPath: MODEL, modelType: 'llama' })

  const options = { maxTokens: 6, temperature: 0 }
  engine.send({ type: 'generate', id: 1, messages: MESSAGES, options })
  const done = await engine.until(isDone(1), 'the chat generation')
  // The recipe of mlx-bun's README, on a model of the test's own.
  const want = await direct(model, tokenizer, tokenizer.encode(template.render(MESSAGES, { addGenerationPrompt: true }), false), options)
  assert.equal(done.type, 'done', JSON.stringify(done))
  assert.ok(want.text.length > 0)
  assert.equal(engine.textOf(1), want.text)
  assert.equal(done.finishReason, want.finishReason)
  assert.equal(done.stats.generatedTokens, want.tokens.length)
})

test('cancel stops a generation mid-way: done with finishReason cancelled, and the engine serves on', async () => {
  engine.send({ type: 'generate', id: 2, prompt: 'Once', options: { maxTokens: 100_000, eosTokenIds: [], temperature: 0 } })
  await engine.until((m) => m.type === 'token' && m.id === 2, 'the first token')
  engine.send({ type: 'cancel', id: 2 })
  const done = await engine.until(isDone(2), 'the cancelled generation')
  assert.equal(done.type, 'done', JSON.stringify(done))
  assert.equal(done.finishReason, 'cancelled')
  assert.ok(done.stats.generatedTokens >= 1 && done.stats.generatedTokens < 1000, `${done.stats.generatedTokens} tokens`)

  // The id is free again, and a cancel of a generation that has ended changes nothing.
  engine.send({ type: 'cancel', id: 2 })
  engine.send({ type: 'generate', id: 2, prompt: 'Hello', options: { maxTokens: 3, eosTokenIds: [], temperature: 0 } })
  const again = await engine.until((m) => isDone(2)(m) && m !== done, 'the generation after the cancel')
  assert.deepEqual([again.type, again.finishReason, again.stats.generatedTokens], ['done', 'length', 3])
  assert.deepEqual(engine.received.filter((m) => m.id === 2 && m.type === 'error'), [])
})

test('bad requests answer with an error message and a stable code', async () => {
  engine.send({ type: 'generate', id: 'typo', prompt: 'Hi', options: { temprature: 0 } })
  engine.send({ type: 'generate', id: 'both', prompt: 'Hi', messages: MESSAGES })
  engine.send({ type: 'generate', id: 'extra', prompt: 'Hi', maxTokens: 3 })
  engine.send({ type: 'unload' })
  engine.send({ type: 'cancel' })
  engine.send({ type: 'generate', id: 'long', prompt: 'Once', options: { maxTokens: 100_000, eosTokenIds: [], temperature: 0 } })
  engine.send({ type: 'generate', id: 'long', prompt: 'Hi' })
  // Every earlier message has been answered by the time the long generation, sent after them
  // and cancelled after the answer to the last one, is done.
  const dup = await engine.until((m) => m.id === 'long' && m.type === 'error', 'the duplicate id error')
  engine.send({ type: 'cancel', id: 'long' })
  await engine.until(isDone('long'), 'the long generation')
  const errors = Object.fromEntries(['typo', 'both', 'extra'].map((id) => [id, engine.received.find((m) => m.id === id)?.code]))
  assert.deepEqual(errors, { typo: 'INVALID_OPTION', both: 'INVALID_MESSAGE', extra: 'INVALID_MESSAGE' })
  const unnamed = engine.received.filter((m) => m.type === 'error' && m.id === null)
  assert.deepEqual(unnamed.map((m) => [m.code, m.message.split(':')[0]]), [['INVALID_MESSAGE', 'type'], ['INVALID_MESSAGE', 'id']])
  assert.equal(dup.code, 'DUPLICATE_ID')
  assert.match(engine.received.find((m) => m.id === 'typo').message, /temprature/)

  // A fresh engine: nothing loaded yet, then a path that does not exist.
  const fresh = connect()
  try {
    fresh.send({ type: 'generate', id: 'early', prompt: 'Hi' })
    fresh.send({ type: 'load', id: 'bad', modelPath: path.join(tmpdir('electron'), 'missing.gguf') })
    const early = await fresh.until((m) => m.id === 'early', 'the generation before any load')
    const bad = await fresh.until((m) => m.id === 'bad', 'the bad load')
    assert.deepEqual([early.type, early.code], ['error', 'NOT_LOADED'])
    assert.deepEqual([bad.type, bad.code], ['error', 'MODEL_NOT_FOUND'])
    assert.match(bad.message, /missing\.gguf/)
  } finally {
    fresh.close()
  }
})

test('close cancels what runs, releases the model and calls onClose once', async () => {
  engine.send({ type: 'generate', id: 'last', prompt: 'Once', options: { maxTokens: 100_000, eosTokenIds: [], temperature: 0 } })
  await engine.until((m) => m.type === 'token' && m.id === 'last', 'the first token')
  engine.send({ type: 'close' })
  await engine.until((m) => m.type === 'closed', 'closed')
  const last = engine.received.find(isDone('last'))
  assert.deepEqual([last?.type, last?.finishReason], ['done', 'cancelled'])
  assert.ok(engine.received.indexOf(last) < engine.received.findIndex((m) => m.type === 'closed'))
  assert.equal(closedCalls, 1)
})

test('inside a stand-in utilityProcess the file serves the port main.js sends, and close exits 0', async () => {
  // engine-process.js requires 'mlx-bun' as an installed app does; NODE_PATH points that name here.
  const modules = path.join(tmpdir('electron'), 'node_modules')
  fs.mkdirSync(modules)
  fs.symlinkSync(ROOT, path.join(modules, 'mlx-bun'), 'dir')
  const child = spawn(process.execPath, [path.join(__dirname, 'electron-child.js'), MODEL, RAW_PROMPT], {
    env: { ...process.env, NODE_PATH: modules },
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  let out = ''
  child.stdout.on('data', (d) => { out += d })
  // 'close', not 'exit': it comes once stdout has been read to its end.
  const exited = within(new Promise((resolve) => child.on('close', resolve)), 'the stand-in utilityProcess', 20_000)
  let code
  try {
    code = await exited
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  }
  const want = await direct(model, tokenizer, tokenizer.encode(RAW_PROMPT, true), { maxTokens: 4, eosTokenIds: [], temperature: 0 })
  const messages = out.trim().split('\n').map((line) => JSON.parse(line))
  assert.equal(code, 0, out)
  // 'closed' may not cross before the exit (in Electron, main.js reports the exit to the window).
  const types = messages.map((m) => m.type).filter((t) => t !== 'closed')
  assert.deepEqual(types.filter((t, i) => t !== 'token' || types[i - 1] !== 'token'), ['loaded', 'token', 'done', 'exit'])
  // A raw `prompt` is tokenized with the tokenizer's special tokens, as the CLI's plain prompt.
  const done = messages.find((m) => m.type === 'done')
  assert.deepEqual([done.finishReason, done.stats.generatedTokens], ['length', 4])
  assert.equal(messages.filter((m) => m.type === 'token').map((m) => m.text).join(''), want.text)
})
