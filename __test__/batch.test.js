'use strict'
// Continuous batching: sessions of one model decode together, one graph per step, each row with
// its own cache length, sampler and seed. Row for row the tokens must equal each request run
// alone, whatever joins, leaves, is cancelled or fails around it.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const path = require('node:path')

const mlx = require('..')
const { makeTinyLlama, tmpdir, fixture, readJson, within, TINY } = require('./helpers')

async function collectOne(engine, request) {
  const o = await within(engine.open(request, { output: 'collect' }).result, 'a collect session', 60_000)
  assert.equal(o.status, 'completed', JSON.stringify(o.error))
  return Array.from(o.output)
}

/** Runs each request alone (one at a time), then all at once; returns both token lists. */
async function aloneAndTogether(model, requests) {
  const alone = []
  const solo = mlx.createEngine(model)
  for (const r of requests) alone.push(await collectOne(solo, r))
  await solo.close()
  const before = mlx.testing.batchCounts()
  const engine = mlx.createEngine(model, { maxActive: Math.max(8, requests.length) })
  const together = await Promise.all(requests.map((r) => collectOne(engine, r)))
  await engine.close()
  const after = mlx.testing.batchCounts()
  return { alone, together, batchedRows: after.rows - before.rows }
}

describe('continuous batching on a tiny random llama', () => {
  let model
  const prompt = (i) => Array.from({ length: 2 + 5 * i }, (_, j) => (j * 31 + i * 7 + 1) % TINY.vocab)
  before(async () => {
    model = await mlx.loadModel(makeTinyLlama(path.join(tmpdir('batch'), 'tiny')))
  })
  after(() => model.dispose())

  for (const n of [2, 4, 8]) {
    test(`${n} concurrent greedy sessions with different prompt lengths equal each alone`, async () => {
      const requests = Array.from({ length: n }, (_, i) => ({ promptTokens: prompt(i), maxTokens: 12 + 3 * i, eosTokenIds: [] }))
      const { alone, together, batchedRows } = await aloneAndTogether(model, requests)
      assert.deepEqual(together, alone)
      assert.ok(batchedRows >= n * 8, `decode ran batched (${batchedRows} batched row steps)`)
    })
  }

  test('seeded sampling and logprobs give the same tokens and values in a batch as alone', async () => {
    const sampled = (i) => ({ promptTokens: prompt(i), maxTokens: 16, eosTokenIds: [], temperature: 0.9, topP: 0.95, seed: 11 + i })
    const { alone, together, batchedRows } = await aloneAndTogether(model, [0, 1, 2, 3].map(sampled))
    assert.deepEqual(together, alone)
    assert.ok(batchedRows > 0)

    const withLogprobs = { promptTokens: prompt(2), maxTokens: 8, eosTokenIds: [], logprobs: true, topLogprobs: 3 }
    const read = async (engine) => {
      const events = []
      for await (const e of engine.open(withLogprobs).events) if (e.type === 'committed') events.push(e)
      return events
    }
    const solo = await read(mlx.createEngine(model))
    const engine = mlx.createEngine(model)
    const others = [0, 1, 3].map((i) => engine.open({ promptTokens: prompt(i), maxTokens: 30, eosTokenIds: [] }, { output: 'collect' }).result)
    const inBatch = await read(engine)
    await Promise.all(others)
    // Tokens and top ids are exact; values agree to float rounding: at this toy size BLAS may
    // sum a batched product in another order than a single row's.
    assert.deepEqual(inBatch.map((e) => e.tokenIds), solo.map((e) => e.tokenIds))
    for (const [i, e] of inBatch.entries()) {
      const s = solo[i].logprobs[0]
      const b = e.logprobs[0]
      assert.ok(Math.abs(b.logprob - s.logprob) <= 1e-4, `token ${i}: ${b.logprob} vs ${s.logprob}`)
      assert.deepEqual(b.top.map((t) => t.id), s.top.map((t) => t.id))
      b.top.forEach((t, k) => assert.ok(Math.abs(t.logprob - s.top[k].logprob) <= 1e-4))
    }
  })

  test('a row cancelled, closed or failing mid-decode leaves the other rows unchanged', async () => {
    const requests = [0, 1, 2, 3].map((i) => ({ promptTokens: prompt(i), maxTokens: 24, eosTokenIds: [] }))
    const solo = mlx.createEngine(model)
    const alone = []
    for (const r of requests) alone.push(await collectOne(solo, r))
    const engine = mlx.createEngine(model)
    const keep = [engine.open(requests[0], { output: 'collect' }), engine.open(requests[2], { output: 'collect' })]
    // Row 1 is cancelled after 3 tokens; row 3's callback throws after 5.
    let got1 = 0
    const cancelled = engine.open(requests[1], {
      output: 'callback',
      onTokens: (ids) => {
        got1 += ids.length
        if (got1 >= 3) cancelled.cancel().catch(() => {})
      },
    })
    let got3 = 0
    const failing = engine.open(requests[3], {
      output: 'callback',
      onTokens: (ids) => {
        got3 += ids.length
        if (got3 >= 5) throw new Error('consumer failed')
      },
    })
    const [a, c] = await Promise.all(keep.map((s) => within(s.result, 'a kept row', 60_000)))
    assert.deepEqual(Array.from(a.output), alone[0])
    assert.deepEqual(Array.from(c.output), alone[2])
    assert.equal((await cancelled.result).status, 'cancelled')
    assert.equal((await failing.result).status, 'failed')
  })
})

describe('continuous batching on SmolLM2 (real weights)', () => {
  test('4 concurrent greedy sessions each produce mlx-lm reference tokens', async () => {
    const ref = readJson('ref-f32.json')
    const model = await mlx.loadModel(fixture('smollm2-f32'))
    const N = 12
    const expected = ref.results.map((r) => {
      const stop = r.tokens.findIndex((t) => ref.eos_token_ids.includes(t))
      return (stop < 0 ? r.tokens : r.tokens.slice(0, stop)).slice(0, N)
    })
    const engine = mlx.createEngine(model)
    const before = mlx.testing.batchCounts()
    const requests = [...ref.results, ref.results[1]].map((r) => ({ promptTokens: r.prompt_ids, maxTokens: N }))
    const outs = await Promise.all(requests.map((r) => collectOne(engine, r)))
    assert.ok(mlx.testing.batchCounts().rows - before.rows >= 2 * N, 'decode ran batched')
    assert.deepEqual(outs, [...expected, expected[1]])
    await engine.close()
    model.dispose()
  })
})
