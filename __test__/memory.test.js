'use strict'
// Memory admission (mlx-bun's memoryBudgetBytes): a model whose weights leave no context is
// refused before it loads; an engine admits a session only while its whole context (prompt and
// maxTokens, by fit()'s formulas) fits beside the running ones, reclaiming prefix-cache entries
// first, then waiting, and refuses one that could never fit with INSUFFICIENT_MEMORY.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')

const mlx = require('..')
const { fixture, expectCode, within, eventually } = require('./helpers')

const dir = fixture('smollm2-f32')
// What fit() bills as the weights: the safetensors files.
const weights = fs.readdirSync(dir).filter((f) => f.endsWith('.safetensors')).reduce((n, f) => n + fs.statSync(path.join(dir, f)).size, 0)
const config = mlx.loadModelConfig(dir)
// A context's bytes beside the weights: its KV cache and one prefill chunk's transient buffers.
const need = (tokens) => mlx.fit(config, weights, tokens, undefined, 2048, 0, 1e15).totalBytes - weights

test('loadContext refuses a model whose weights leave no context in memoryBudgetBytes, before loading it', () => {
  assert.throws(() => mlx.loadContext(dir, { memoryBudgetBytes: weights / 2 }), (e) => expectCode(e, 'INSUFFICIENT_MEMORY', /memoryBudgetBytes/))
  assert.throws(() => mlx.createServer(mlx.loadContext(dir), 0, { memoryBudgetBytes: -1 }), (e) => expectCode(e, 'INVALID_OPTION', /memoryBudgetBytes/))
})

test('an engine with memoryBudgetBytes reclaims the prefix cache, then queues, then refuses; it keeps serving', async () => {
  const model = await mlx.loadModel(dir)
  const prompt = (i) => Array.from({ length: 10 }, (_, j) => 100 + 17 * i + j)
  const request = (i, maxTokens = 30) => ({ promptTokens: prompt(i), maxTokens, eosTokenIds: [] })
  // One 40-token context fits, two do not, nor does the smallest prefix-cache entry beside one.
  const engine = mlx.createEngine(model, { memoryBudgetBytes: Math.floor(weights + need(40) + 1000) })
  // How each session ended, and the states of the sessions opened beside it when its first
  // tokens arrived: the engine's own order, which timestamps taken in JS cannot show (a consumer
  // may see its session's end after the next session's first tokens).
  const run = async (r, beside = []) => {
    const session = engine.open(r)
    beside.push(session)
    let seen = null
    let idle = null
    for await (const e of session.events) {
      if (e.type === 'committed' && seen === null) [seen, idle] = [beside.filter((s) => s !== session).map((s) => s.state), engine.stats.idle]
    }
    assert.equal(idle, false, 'a working engine is not idle')
    return { seen, status: (await session.result).status }
  }
  try {
    const pair = []
    const [first, second] = await within(Promise.all([run(request(0), pair), run(request(1), pair)]), 'two sessions', 120_000)
    assert.deepEqual([first.status, second.status], ['completed', 'completed'])
    assert.deepEqual(second.seen, ['terminal'], 'the second waited for the first to end')
    // The finished sessions left their caches in the prefix cache; the next session reclaims them.
    const before = engine.stats.prefixCache
    assert.ok(before.entries >= 1 && before.bytes > 1000, JSON.stringify(before))
    assert.equal((await run(request(2))).status, 'completed')
    assert.ok(engine.stats.prefixCache.evictions >= before.evictions + 1, 'a prefix-cache entry was reclaimed')
    // A context that could not fit even alone is refused; the engine goes on.
    const refused = await engine.open(request(3, 5000), { output: 'collect' }).result
    assert.equal(refused.status, 'failed')
    assert.equal(refused.error.cause, 'INSUFFICIENT_MEMORY')
    assert.match(refused.error.message, /memoryBudgetBytes/)
    assert.equal((await run(request(4))).status, 'completed')
    assert.ok(await eventually(() => engine.stats.idle, 10_000), 'the engine went idle after its work')
  } finally {
    await engine.close()
    model.dispose()
  }
})

test('the server answers a request whose context cannot fit with 400 INSUFFICIENT_MEMORY, and serves the next', async () => {
  const server = mlx.createServer(mlx.loadContext(dir, 'm'), 0, { log: 'off', memoryBudgetBytes: Math.floor(weights + need(400)) })
  const ask = (max_tokens) => fetch(`${server.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'Hi' }], max_tokens, temperature: 0 }) })
  try {
    const big = await ask(100000)
    assert.equal(big.status, 400)
    assert.equal((await big.json()).error.code, 'INSUFFICIENT_MEMORY')
    assert.equal((await ask(4)).status, 200)
  } finally {
    await server.close()
  }
})
