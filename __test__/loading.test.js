'use strict'
// The loading API: loadModelConfig, Weights, createModel, and the default model download.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('node:crypto')
const fs = require('node:fs')
const path = require('node:path')

const mlx = require('..')
const { makeTinyLlama, tmpdir, collect, fixture, TINY } = require('./helpers')

test('Weights + createModel, with and without a config override', async () => {
  const dir = makeTinyLlama(path.join(tmpdir('load'), 'tiny'))
  const cfg = mlx.loadModelConfig(dir)
  assert.equal(cfg.modelType, 'llama')
  assert.equal(cfg.vocabSize, TINY.vocab)
  assert.equal(cfg.quantization, null)
  const w = mlx.Weights.open(dir)
  assert.ok(w.tensorNames.includes('model.embed_tokens.weight'))
  assert.deepEqual(w.info('model.norm.weight'), { dtype: 'f32', shape: [TINY.hidden] })
  const t = w.tensor('model.norm.weight')
  assert.equal(t.data.byteLength, TINY.hidden * 4)
  assert.equal(new Float32Array(t.data.buffer, t.data.byteOffset, TINY.hidden)[0], 1)
  const a = await mlx.createModel(w)
  const b = await mlx.createModel(w, { ...cfg, raw: { ...cfg.raw, eos_token_id: 7 } })
  assert.deepEqual(b.config.eosTokenIds, [7])
  const ta = await collect(mlx.generate(a, [1, 2], { maxTokens: 5, eosTokenIds: [] }))
  const tb = await collect(mlx.generate(b, [1, 2], { maxTokens: 5, eosTokenIds: [] }))
  assert.deepEqual(ta.tokens, tb.tokens)
  w.dispose()
  assert.throws(() => w.tensorNames, { code: 'INVALID_OPTION' })
  a.dispose()
  b.dispose()
})

test("createModel returns the model at once, as mlx-bun's does; work queues behind the load", async () => {
  const dir = makeTinyLlama(path.join(tmpdir('sync'), 'tiny'))
  // Written from mlx-bun's docs: no await on createModel, nor on the synchronous loaders.
  const model = mlx.createModel(mlx.Weights.open(dir), mlx.loadModelConfig(dir))
  assert.ok(model instanceof mlx.Model)
  const expected = (await collect(mlx.generate(await mlx.loadModel(dir), [1, 2], { maxTokens: 5, eosTokenIds: [] }))).tokens
  const engine = mlx.createEngine(model)
  const [direct, viaEngine] = await Promise.all([
    collect(mlx.generate(model, [1, 2], { maxTokens: 5, eosTokenIds: [] })),
    engine.open({ promptTokens: [1, 2], maxTokens: 5, eosTokenIds: [] }, { output: 'collect' }).result,
  ])
  assert.deepEqual(direct.tokens, expected)
  assert.deepEqual(Array.from(viaEngine.output), expected)
  assert.equal(await model.ready, undefined)
  // The same code with await keeps working.
  const awaited = await mlx.createModel(mlx.Weights.open(dir))
  assert.deepEqual((await collect(mlx.generate(awaited, [1, 2], { maxTokens: 5, eosTokenIds: [] }))).tokens, expected)
  await engine.close()
  model.dispose()
  awaited.dispose()
  // Invalid options throw at once, not later.
  assert.throws(() => mlx.createModel(mlx.Weights.open(dir), undefined, { f32Matmuls: 'fast' }), { code: 'INVALID_OPTION' })
})

test('a model used at once waits for its load even when other loads are queued ahead of it', async () => {
  const dir = makeTinyLlama(path.join(tmpdir('queue'), 'tiny'))
  const expected = (await collect(mlx.generate(await mlx.loadModel(dir), [1, 2], { maxTokens: 4, eosTokenIds: [] }))).tokens
  for (let round = 0; round < 3; round++) {
    // A GGUF's conversion keeps the engine thread busy while the next loads and the generation
    // arrive; they reach the thread together, the generation's model behind another load.
    const slow = mlx.createModel(mlx.Weights.open(fixture('home/models/SmolLM2-135M-Instruct.Q4_1.gguf')))
    const ahead = mlx.createModel(mlx.Weights.open(dir))
    const model = mlx.createModel(mlx.Weights.open(dir))
    assert.deepEqual((await collect(mlx.generate(model, [1, 2], { maxTokens: 4, eosTokenIds: [] }))).tokens, expected, `round ${round}`)
    for (const m of [slow, ahead, model]) m.dispose()
  }
})

test('a load that fails rejects model.ready and fails every use of the model with its typed error', async () => {
  const dir = makeTinyLlama(path.join(tmpdir('fail'), 'tiny'))
  const cfg = mlx.loadModelConfig(dir)
  // A config whose MLP width does not match the tensors: only building the model finds out.
  const model = mlx.createModel(mlx.Weights.open(dir), { ...cfg, raw: { ...cfg.raw, intermediate_size: 96 } })
  const [ready, gen, logits] = await Promise.allSettled([model.ready, collect(mlx.generate(model, [1, 2], { maxTokens: 3 })), model.logits([1, 2])])
  for (const r of [ready, gen, logits]) {
    assert.equal(r.status, 'rejected')
    assert.equal(r.reason.code, 'INVALID_TENSOR', r.reason.message)
    assert.match(r.reason.message, /gate_proj/)
  }
  const s = mlx.createEngine(model).open({ promptTokens: [1] }, { output: 'collect' })
  assert.equal((await s.result).error.cause, 'INVALID_TENSOR')
  model.dispose()
  // A model disposed before its load ran frees it: no use of it works, nothing leaks.
  const early = mlx.createModel(mlx.Weights.open(dir))
  early.dispose()
  assert.throws(() => mlx.generate(early, [1], {}), { code: 'MODEL_DISPOSED' })
})

test('pullDefaultModel replaces a damaged copy and verifies the checksum', { timeout: 300_000 }, async () => {
  const home = tmpdir('pull')
  try {
    const target = mlx.defaultModelPath(home)
    assert.equal(target, path.join(home, 'models', 'SmolLM2-135M-Instruct.Q4_1.gguf'))
    fs.mkdirSync(path.dirname(target), { recursive: true })
    fs.writeFileSync(target, 'not a model')
    const got = await mlx.pullDefaultModel({ home })
    assert.equal(got, target)
    const good = fs.readFileSync(fixture('home/models/SmolLM2-135M-Instruct.Q4_1.gguf'))
    const hash = (b) => crypto.createHash('sha256').update(b).digest('hex')
    assert.equal(hash(fs.readFileSync(got)), hash(good))
    // Idempotent: an intact copy is kept as it is.
    const before = fs.statSync(got).mtimeMs
    assert.equal(await mlx.pullDefaultModel({ home }), target)
    assert.equal(fs.statSync(got).mtimeMs, before)
  } finally {
    fs.rmSync(home, { recursive: true, force: true })
  }
})
