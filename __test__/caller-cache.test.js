'use strict'
// Caller-owned KV caches (mlx-bun's `model.makeCache()` + `generate(model, prompt, { cache })`) on
// real weights (SmolLM2-135M f32): the prompt's first `cache.offset` tokens are taken as cached,
// the rest is prefilled, the generation appends to the cache; every output equals a cold run.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')

const mlx = require('..')
const { fixture, collect, expectCode } = require('./helpers')

const invalid = (f, pattern) => assert.throws(f, (e) => expectCode(e, 'INVALID_OPTION', pattern))

describe('caller-owned caches on SmolLM2 (real weights)', () => {
  let model, tok
  before(async () => {
    model = await mlx.loadModel(fixture('smollm2-f32'))
    tok = mlx.loadTokenizer(fixture('smollm2-f32'))
  })
  after(() => model.dispose())

  test('two turns on one cache: each prefills only what is new and equals a cold run', async () => {
    const cache = model.makeCache()
    assert.equal(cache.offset, 0)
    const first = Array.from(tok.encode('The three largest cities of France are', true))
    const a = await collect(mlx.generate(model, first, { maxTokens: 8, cache }))
    assert.deepEqual(a.tokens, (await collect(mlx.generate(model, first, { maxTokens: 8 }))).tokens)
    assert.equal(a.gen.stats.cachedTokens, 0)
    // The prompt and every token forwarded (the last one sampled is not).
    assert.equal(cache.offset, a.gen.stats.cacheTokens)
    assert.equal(cache.offset, first.length + a.tokens.length - (a.gen.finishReason === 'length' ? 1 : 0))
    const second = [...first, ...a.tokens, ...Array.from(tok.encode(' and the largest of Spain is', false))]
    const held = cache.offset
    const b = await collect(mlx.generate(model, second, { maxTokens: 8, cache }))
    assert.equal(b.gen.stats.cachedTokens, held)
    assert.deepEqual(b.tokens, (await collect(mlx.generate(model, second, { maxTokens: 8 }))).tokens)
    assert.ok(cache.offset > second.length)
    // Engine requests take the same option.
    const engine = mlx.createEngine(model)
    try {
      const third = [...second, ...b.tokens, ...Array.from(tok.encode(' Italy', false))]
      const before = cache.offset
      const o = await engine.open({ promptTokens: third, maxTokens: 4, cache }, { output: 'collect' }).result
      assert.equal(o.status, 'completed')
      assert.equal(o.result.metrics.cachedTokens, before)
      const cold = await collect(mlx.generate(model, third, { maxTokens: 4 }))
      assert.deepEqual(Array.from(o.output), cold.tokens)
    } finally {
      await engine.close()
    }
    cache.dispose()
    invalid(() => mlx.generate(model, second, { cache }), /^cache: was disposed/)
  })

  test('a cache must be shorter than the prompt, of this model, used by one generation at a time', async () => {
    const cache = model.makeCache()
    const prompt = Array.from(tok.encode('Hello there, how are you', true))
    await collect(mlx.generate(model, prompt, { maxTokens: 2, cache }))
    invalid(() => mlx.generate(model, prompt.slice(0, cache.offset), { cache }), /^cache: holds \d+ positions/)
    const longer = [...prompt, 42, 43, 44]
    const running = mlx.generate(model, longer, { maxTokens: 4, cache })
    invalid(() => mlx.generate(model, [...longer, 1], { cache }), /in use/)
    await collect(running)
    // Free again once that generation ended.
    await collect(mlx.generate(model, [...longer, 45, 46, 47, 48, 49], { maxTokens: 1, cache }))
    invalid(() => mlx.generate(model, prompt, { cache: {} }), /makeCache/)
    const other = await mlx.loadModel(fixture('tiny/llama'))
    try {
      invalid(() => mlx.generate(other, [1, 2, 3], { cache }), /another model/)
    } finally {
      other.dispose()
    }
  })
})
