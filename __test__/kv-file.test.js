'use strict'
// Saved KV caches (`saveKvCache` / `loadKvCache`) on real weights: a conversation saved by one
// process and restored by another goes on exactly as the uninterrupted one does, prefilling only
// what is new; files that are damaged, of another model or of another version are typed errors
// and the process goes on.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { execFileSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

const mlx = require('..')
const { ROOT, fixture, collect, expectCode, tmpdir, makeTinyLlama } = require('./helpers')

// One process: a first turn on a cache, saved; then the second turn on the same, live cache.
const FIRST_PROCESS = `
const mlx = require(${JSON.stringify(ROOT)})
;(async () => {
  const [dir, file, first, second] = process.argv.slice(1).map((a, i) => (i < 2 ? a : JSON.parse(a)))
  const model = await mlx.loadModel(dir)
  const cache = model.makeCache()
  const a = []
  for await (const t of mlx.generate(model, first, { maxTokens: 6, cache })) a.push(t)
  await mlx.saveKvCache(cache, file)
  const saved = cache.offset
  const turn = [...first, ...a.map((t) => t.token), ...second]
  const b = []
  for await (const t of mlx.generate(model, turn, { maxTokens: 8, cache })) b.push(t.token)
  console.log(JSON.stringify({ saved, turn, next: b }))
})()
`

describe('saved KV caches on SmolLM2 (real weights)', () => {
  let model, tok, dir
  before(async () => {
    model = await mlx.loadModel(fixture('smollm2-f32'))
    tok = mlx.loadTokenizer(fixture('smollm2-f32'))
    dir = tmpdir('kv-file')
  })
  after(() => model.dispose())

  test('a cache saved by one process and loaded by another continues as the uninterrupted run', async () => {
    const file = path.join(dir, 'chat.kv')
    const first = Array.from(tok.encode('The three largest cities of France are', true))
    const second = Array.from(tok.encode(' and the largest of Spain is', false))
    const out = execFileSync(process.execPath, ['-e', FIRST_PROCESS, fixture('smollm2-f32'), file, JSON.stringify(first), JSON.stringify(second)])
    const { saved, turn, next } = JSON.parse(out.toString().trim().split('\n').pop())
    assert.ok(saved > first.length)
    const cache = await mlx.loadKvCache(model, file)
    assert.equal(cache.offset, saved)
    const gen = mlx.generate(model, turn, { maxTokens: 8, cache })
    const tokens = []
    for await (const t of gen) tokens.push(t.token)
    assert.deepEqual(tokens, next)
    assert.equal(gen.stats.cachedTokens, saved)
    // And it holds the new turn too: saved again, loaded again, the offset is kept.
    await mlx.saveKvCache(cache, file)
    const again = await mlx.loadKvCache(model, file)
    assert.equal(again.offset, cache.offset)
    cache.dispose()
    again.dispose()
  })

  test('an unused cache saves and loads empty; a cache in use cannot be saved', async () => {
    const file = path.join(dir, 'empty.kv')
    const empty = model.makeCache()
    await mlx.saveKvCache(empty, file)
    const loaded = await mlx.loadKvCache(model, file)
    assert.equal(loaded.offset, 0)
    const prompt = Array.from(tok.encode('Hello there, how are you today?', true))
    const cold = await collect(mlx.generate(model, prompt, { maxTokens: 4 }))
    assert.deepEqual((await collect(mlx.generate(model, prompt, { maxTokens: 4, cache: loaded }))).tokens, cold.tokens)
    const running = mlx.generate(model, [...prompt, ...cold.tokens, 11, 12], { maxTokens: 4, cache: loaded })
    await assert.rejects(async () => mlx.saveKvCache(loaded, file), (e) => expectCode(e, 'INVALID_OPTION', /^cache: is in use/))
    await collect(running)
    loaded.dispose()
    await assert.rejects(async () => mlx.saveKvCache(loaded, file), (e) => expectCode(e, 'INVALID_OPTION', /^cache: was disposed/))
    assert.throws(() => mlx.saveKvCache({}, file), (e) => expectCode(e, 'INVALID_OPTION', /^cache:/))
    assert.throws(() => mlx.loadKvCache(model, ''), (e) => expectCode(e, 'INVALID_OPTION', /^path:/))
  })

  test('truncated, garbage, foreign and other-version files are typed errors; the process goes on', async () => {
    const file = path.join(dir, 'good.kv')
    const cache = model.makeCache()
    const prompt = Array.from(tok.encode('Name three colours:', true))
    const said = (await collect(mlx.generate(model, prompt, { maxTokens: 4, cache }))).tokens
    await mlx.saveKvCache(cache, file)
    const good = fs.readFileSync(file)
    const bad = async (bytes, pattern) => {
      const p = path.join(dir, 'bad.kv')
      fs.writeFileSync(p, bytes)
      await assert.rejects(mlx.loadKvCache(model, p), (e) => expectCode(e, 'INVALID_CACHE_FILE', pattern))
    }
    for (const cut of [0, 7, 15, 100, 4096, good.length >> 1, good.length - 1]) await bad(good.subarray(0, cut), /./)
    await bad(Buffer.from('{"this": "is not a cache"}'), /not a saved KV cache/)
    const other = Buffer.from(good)
    other.writeUInt32LE(99, 8)
    await bad(other, /format version 99; this build reads version 1/)
    await assert.rejects(mlx.loadKvCache(model, path.join(dir, 'missing.kv')), (e) => expectCode(e, 'IO_ERROR', /missing\.kv/))
    // Another model: same architecture, other weights.
    const tiny = await mlx.loadModel(makeTinyLlama(path.join(dir, 'tiny')))
    const theirs = path.join(dir, 'tiny.kv')
    const tinyCache = tiny.makeCache()
    await collect(mlx.generate(tiny, [1, 2, 3, 4], { maxTokens: 2, cache: tinyCache }))
    await mlx.saveKvCache(tinyCache, theirs)
    await assert.rejects(mlx.loadKvCache(model, theirs), (e) => expectCode(e, 'INVALID_CACHE_FILE', /another model/))
    await assert.rejects(mlx.loadKvCache(tiny, file), (e) => expectCode(e, 'INVALID_CACHE_FILE', /another model/))
    tiny.dispose()
    // Everything still works.
    const restored = await mlx.loadKvCache(model, file)
    assert.equal(restored.offset, cache.offset)
    const more = [...prompt, ...said, 13, 14, 15]
    assert.deepEqual((await collect(mlx.generate(model, more, { maxTokens: 3, cache: restored }))).tokens,
      (await collect(mlx.generate(model, more, { maxTokens: 3 }))).tokens)
  })

  test('Gemma 3 (sliding-window layers, rotating caches): a restored cache continues as the live one', async () => {
    const gemma = await mlx.loadModel(fixture('gemma3-bf16'))
    const gt = mlx.loadTokenizer(fixture('gemma3-bf16'))
    try {
      const cache = gemma.makeCache()
      const first = Array.from(gt.encode('The capital of France is', true))
      const a = (await collect(mlx.generate(gemma, first, { maxTokens: 4, cache }))).tokens
      const file = path.join(dir, 'gemma.kv')
      await mlx.saveKvCache(cache, file)
      const restored = await mlx.loadKvCache(gemma, file)
      assert.equal(restored.offset, cache.offset)
      await assert.rejects(mlx.loadKvCache(model, file), (e) => expectCode(e, 'INVALID_CACHE_FILE', /another model/))
      const turn = [...first, ...a, ...Array.from(gt.encode(' and the capital of Italy is', false))]
      const live = (await collect(mlx.generate(gemma, turn, { maxTokens: 4, cache }))).tokens
      const back = await collect(mlx.generate(gemma, turn, { maxTokens: 4, cache: restored }))
      assert.deepEqual(back.tokens, live)
      assert.equal(back.gen.stats.cachedTokens, first.length + a.length - 1)
    } finally {
      gemma.dispose()
    }
  })
})
