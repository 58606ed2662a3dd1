'use strict'
// A bug never hangs or kills the host process: a panic fails exactly the work it hit
// (INTERNAL_ERROR) and the engine goes on; no option is ignored; nothing heavy or unbounded runs
// on the JS thread. Hostile files are in corpus.test.js.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const net = require('node:net')
const path = require('node:path')
const { spawn } = require('node:child_process')

const mlx = require('..')
const { makeTinyLlama, writeByteTokenizer, tmpdir, collect, within, fixture, expectCode, ROOT } = require('./helpers')

describe('panics are contained', () => {
  let dir, model, expected
  before(async () => {
    dir = tmpdir('reliability')
    model = await mlx.loadModel(makeTinyLlama(path.join(dir, 'ok')))
    expected = (await collect(mlx.generate(model, [1, 2, 3], { maxTokens: 8, eosTokenIds: [] }))).tokens
  })
  after(() => model.dispose())

  for (const output of ['stream', 'collect']) {
    test(`a panic inside a unit fails that session alone (${output}); its neighbours and the next generation run`, async () => {
      const bad = mlx.testing.createScriptedEngine({ steps: [{ commit: [1] }, { panic: 'boom in a unit' }, { commit: [2] }] })
      const good = mlx.testing.createScriptedEngine({ steps: [{ commit: [7], repeat: 20 }] })
      // A real generation runs through the same engine thread at the same time.
      const real = collect(mlx.generate(model, [1, 2, 3], { maxTokens: 8, eosTokenIds: [] }))
      const neighbour = bad.open({ promptTokens: [1] }, { output: 'collect' })
      const other = good.open({ promptTokens: [1] }, { output: 'collect' })
      const s = bad.open({ promptTokens: [1] }, { output })
      if (output === 'stream') {
        const seen = []
        for await (const e of s.events) seen.push(...e.tokenIds)
        assert.deepEqual(seen, [1])
      }
      const o = await within(s.result, 'the panicking session')
      assert.equal(o.status, 'failed')
      assert.equal(o.error.cause, 'INTERNAL_ERROR')
      assert.match(o.error.message, /boom in a unit/)
      // Every other session ran to its end: the neighbour on the same engine panicked by its own
      // script, the other engine's session and the real generation completed.
      assert.equal((await within(neighbour.result, 'neighbour')).error.cause, 'INTERNAL_ERROR')
      const g = await within(other.result, 'other engine')
      assert.equal(g.status, 'completed')
      assert.deepEqual(Array.from(g.output), Array(20).fill(7))
      assert.deepEqual((await within(real, 'generation')).tokens, expected)
      assert.deepEqual((await collect(mlx.generate(model, [1, 2, 3], { maxTokens: 8, eosTokenIds: [] }))).tokens, expected)
      await within(Promise.all([bad.close(), good.close()]), 'close')
      assert.equal(mlx.testing.liveSessions(), 0)
    })
  }

  test('a panic inside a synchronous binding throws INTERNAL_ERROR; the process lives on', async () => {
    assert.throws(() => mlx.testing.panicInBinding('boom in a binding'), (e) => expectCode(e, 'INTERNAL_ERROR', /boom in a binding/))
    assert.deepEqual((await collect(mlx.generate(model, [1, 2, 3], { maxTokens: 8, eosTokenIds: [] }))).tokens, expected)
  })
})

describe('no option is silently ignored', () => {
  let dir, model
  before(async () => {
    dir = tmpdir('options')
    model = await mlx.loadModel(writeByteTokenizer(makeTinyLlama(path.join(dir, 'ok'))))
  })
  after(() => model.dispose())

  // Every option index.d.ts declares for generate() is accepted (with a valid value).
  const declared = (iface) => {
    const dts = fs.readFileSync(path.join(ROOT, 'index.d.ts'), 'utf8')
    const body = dts.slice(dts.indexOf(`export interface ${iface} `)).split('\n}')[0]
    return [...body.matchAll(/^ {2}(\w+)\??:/gm)].map((m) => m[1])
  }
  const valid = {
    maxTokens: 2, prefillChunkSize: 8, eosTokenIds: [], temperature: 0.5, topP: 0, topK: 3, minP: 0.1, minTokensToKeep: 2,
    repetitionPenalty: 1.1, repetitionContextSize: 4, presencePenalty: 0.1, presenceContextSize: 4, frequencyPenalty: 0.1,
    frequencyContextSize: 4, logitBias: { 3: 1 }, seed: 5, logprobs: true, topLogprobs: 2, signal: new AbortController().signal,
    cache: () => model.makeCache(),
    grammar: { regex: '[a-z]{1,2}' },
    draftModel: () => model,
    numDraftTokens: 2,
    kvBits: 8,
    kvGroupSize: 32,
    quantizedKvStart: 0,
    kvConfig: [],
  }
  // Options this tiny model (head dimension 16) cannot take: refused by name, not ignored.
  const refusedHere = { kvBits: /^kvGroupSize: group size 64 does not divide the model's head dimension \(16\)/ }

  test('every generate() option in index.d.ts is accepted', async () => {
    const keys = declared('GenerateOptions')
    assert.ok(keys.length >= 19, keys.join())
    for (const key of keys) {
      assert.ok(Object.hasOwn(valid, key), `no valid value for declared option ${key}`)
      const value = typeof valid[key] === 'function' ? valid[key]() : valid[key]
      const run = collect(mlx.generate(model, [1, 2], { maxTokens: 2, [key]: value }))
      if (refusedHere[key]) {
        await assert.rejects(run, (e) => expectCode(e, 'INVALID_OPTION', refusedHere[key]), key)
        continue
      }
      const { tokens } = await run
      assert.ok(tokens.length <= 2, key)
    }
  })

  test("topP 0 is mlx-bun's default: off, the same tokens as topP 1", async () => {
    const run = (topP) => collect(mlx.generate(model, [1, 2], { maxTokens: 12, eosTokenIds: [], temperature: 1, seed: 3, topP }))
    assert.deepEqual((await run(0)).tokens, (await run(1)).tokens)
    assert.deepEqual((await run(0)).tokens, (await run(undefined)).tokens)
  })

  // mlx-bun's options that this engine does not implement yet.
  const notYet = ['xtcProbability', 'xtcThreshold', 'adapters', 'promptEmbeddings', 'imageMask', 'visionPixels']
  for (const key of notYet) {
    test(`${key} → UNSUPPORTED_OPTION naming it (generate and engine requests)`, () => {
      assert.throws(() => mlx.generate(model, [1], { [key]: 1 }), (e) => expectCode(e, 'UNSUPPORTED_OPTION', new RegExp(`^${key}:`)))
      const engine = mlx.createEngine(model)
      assert.throws(() => engine.open({ promptTokens: [1], [key]: 1 }), (e) => expectCode(e, 'UNSUPPORTED_OPTION', new RegExp(`^${key}:`)))
      return engine.close()
    })
  }

  test('a misspelt key → INVALID_OPTION naming it and the key it resembles', async () => {
    assert.throws(() => mlx.generate(model, [1], { temprature: 0.5 }), (e) => expectCode(e, 'INVALID_OPTION', /^temprature: .*did you mean 'temperature'/))
    assert.throws(() => mlx.generate(model, [1], { maxtokens: 5 }), (e) => expectCode(e, 'INVALID_OPTION', /did you mean 'maxTokens'/))
    assert.throws(() => mlx.generate(model, [1], { banana: 1 }), (e) => expectCode(e, 'INVALID_OPTION', /^banana: not a generate option$/))
    assert.throws(() => mlx.createEngine(model, { maxActiv: 2 }), (e) => expectCode(e, 'INVALID_OPTION', /did you mean 'maxActive'/))
    const engine = mlx.createEngine(model)
    assert.throws(() => engine.open({ promptTokens: [1], maxTokns: 2 }), (e) => expectCode(e, 'INVALID_OPTION', /did you mean 'maxTokens'/))
    assert.throws(() => engine.open({ promptTokens: [1] }, { outptu: 'collect' }), (e) => expectCode(e, 'INVALID_OPTION', /did you mean 'output'/))
    assert.throws(() => engine.open({ promptTokens: [1], signal: new AbortController().signal }), (e) => expectCode(e, 'INVALID_OPTION', /^signal: not a request option/))
    assert.throws(() => engine.open({ messages: [], chat: { enableThinkng: true } }), (e) => expectCode(e, 'INVALID_OPTION', /did you mean 'enableThinking'/))
    await engine.close()
    await assert.rejects(mlx.loadModel(path.join(dir, 'ok'), { f32Matmul: 'all' }), (e) => expectCode(e, 'INVALID_OPTION', /did you mean 'f32Matmuls'/))
    // An undefined value is an absent option, as object spreads produce them.
    assert.equal((await collect(mlx.generate(model, [1], { maxTokens: 1, kvBits: undefined, temprature: undefined }))).tokens.length, 1)
  })
})

test('engine.close() marks the engine closed at once: open() right after an un-awaited close() throws ENGINE_CLOSED', async () => {
  for (let i = 0; i < 20; i++) {
    const engine = mlx.testing.createScriptedEngine({ steps: [{ commit: [1], repeat: 1000 }] })
    const running = engine.open({ promptTokens: [1] }, { output: 'collect' })
    const closing = engine.close()
    assert.equal(engine.closed, true)
    assert.throws(() => engine.open({ promptTokens: [1] }), (e) => expectCode(e, 'ENGINE_CLOSED'))
    await within(closing, 'close()')
    await within(running.result, 'the session that was running')
  }
})

test('pullDefaultModel fails with DOWNLOAD_FAILED when the index never answers, instead of hanging', async () => {
  const held = []
  // Accepts connections and never says a word.
  const server = net.createServer((socket) => held.push(socket))
  await new Promise((r) => server.listen(0, '127.0.0.1', r))
  const { port } = server.address()
  const home = tmpdir('pull')
  const started = Date.now()
  const child = spawn(process.execPath, ['-e', `
    require(${JSON.stringify(ROOT)}).pullDefaultModel({ home: ${JSON.stringify(home)} })
      .then(() => console.log('resolved'), (e) => console.log(e.code + ' ' + e.message))`], {
    env: { ...process.env, MLX_BUN_PYPI_URL: `http://127.0.0.1:${port}/simple`, MLX_BUN_HTTP_TIMEOUT_MS: '1500' },
  })
  let out = ''
  child.stdout.on('data', (d) => (out += d))
  try {
    const code = await within(new Promise((r) => child.on('exit', r)), 'the pull', 30_000)
    assert.equal(code, 0)
    assert.match(out, /^DOWNLOAD_FAILED .*127\.0\.0\.1/)
    assert.ok(Date.now() - started < 20_000, `took ${Date.now() - started} ms`)
  } finally {
    child.kill('SIGKILL')
    server.close()
    for (const s of held) s.destroy()
  }
})

test("a GGUF's conversion never runs on the JS thread: Weights.open reads the header, createModel converts elsewhere", async () => {
  // Gemma-3-270M's Q4_K_M tensors are repacked (Q6_K dequantized) on load (about 1 s here).
  const file = fixture('gemma-3-270m-q4_k_m.gguf')
  let last = Date.now()
  let gap = 0
  const timer = setInterval(() => {
    gap = Math.max(gap, Date.now() - last)
    last = Date.now()
  }, 5)
  const started = Date.now()
  const weights = mlx.Weights.open(file)
  const config = mlx.loadModelConfig(file)
  const model = mlx.createModel(weights)
  await model.ready
  clearInterval(timer)
  const total = Date.now() - started
  assert.equal(config.modelType, 'gemma3_text')
  assert.ok(gap < total / 3, `the JS thread was blocked for ${gap} ms of ${total} ms`)
  assert.equal((await collect(mlx.generate(model, [2, 100], { maxTokens: 2, eosTokenIds: [] }))).tokens.length, 2)
  assert.ok(weights.has('model.embed_tokens.weight'))
  model.dispose()
})
