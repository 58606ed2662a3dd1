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
async function aloneAndTogether(model, requests, options = {}) {
  const alone = []
  const solo = mlx.createEngine(model)
  for (const r of requests) alone.push(await collectOne(solo, r))
  await solo.close()
  const before = mlx.testing.batchCounts()
  const engine = mlx.createEngine(model, { maxActive: Math.max(8, requests.length), ...options })
  const together = await Promise.all(requests.map((r) => collectOne(engine, r)))
  await engine.close()
  const after = mlx.testing.batchCounts()
  return { alone, together, batchedRows: after.rows - before.rows, prefillRows: after.prefillRows - before.prefillRows }
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
      const { alone, together, batchedRows, prefillRows } = await aloneAndTogether(model, requests)
      assert.deepEqual(together, alone)
      assert.ok(batchedRows >= n * 8, `decode ran batched (${batchedRows} batched row steps)`)
      // Sessions reach the engine thread one by one: two may or may not arrive together.
      if (n > 2) assert.ok(prefillRows >= 2, `prompts prefilled batched (${prefillRows} batched row chunks)`)
    })
  }

  test('tiny iteration and preparation budgets prefill in small chunks beside decode, same tokens', async () => {
    const long = (i) => Array.from({ length: 20 + 9 * i }, (_, j) => (j * 13 + i * 5 + 3) % TINY.vocab)
    const requests = [0, 1, 2, 3].map((i) => ({ promptTokens: long(i), maxTokens: 40, eosTokenIds: [] }))
    const { alone, together, batchedRows, prefillRows } = await aloneAndTogether(model, requests, { maxIterationTokens: 1, maxPreparationTokens: 3 })
    assert.deepEqual(together, alone)
    assert.ok(batchedRows > 0, 'decode ran batched')
    // No prompt fits the preparation budget, so none is admitted as a burst: each prefills alone.
    assert.equal(prefillRows, 0)
  })

  test('rows past 256 positions, and a row whose slow consumer makes it sit out steps, keep their tokens and logprobs', async () => {
    // Prompts of 230..290 tokens: the stacked cache is padded below and above 256 columns (where
    // padded rows attend one by one); the slow row leaves the stack and rejoins it.
    const long = (i) => Array.from({ length: 230 + 20 * i }, (_, j) => (j * 17 + i * 3 + 5) % TINY.vocab)
    const requests = [0, 1, 2, 3].map((i) => ({ promptTokens: long(i), maxTokens: 48, eosTokenIds: [], logprobs: true }))
    const run = (engine, request, slow) => {
      const got = { tokens: [], logprobs: [] }
      let waits = 0
      const session = engine.open(request, {
        output: 'callback',
        onTokens: async (ids, logprobs) => {
          got.tokens.push(...ids)
          got.logprobs.push(...logprobs.map((l) => l.logprob))
          if (slow && waits++ < 6) await new Promise((resolve) => setTimeout(resolve, 40))
        },
      })
      return within(session.result, 'a callback session', 60_000).then((o) => {
        assert.equal(o.status, 'completed', JSON.stringify(o.error))
        return got
      })
    }
    const alone = []
    const solo = mlx.createEngine(model)
    for (const r of requests) alone.push(await run(solo, r, false))
    await solo.close()
    const before = mlx.testing.batchCounts()
    const engine = mlx.createEngine(model)
    const together = await Promise.all(requests.map((r, i) => run(engine, r, i === 3)))
    await engine.close()
    const batchedRows = mlx.testing.batchCounts().rows - before.rows
    assert.deepEqual(together.map((t) => t.tokens), alone.map((a) => a.tokens))
    // Batched projections of this tiny model's 64-wide layers may round differently from one
    // row's (BLAS picks another kernel), so logprobs agree to 1e-5 rather than bit for bit; a
    // position attended wrongly moves them by far more.
    together.forEach((t, i) => t.logprobs.forEach((v, j) => assert.ok(Math.abs(v - alone[i].logprobs[j]) < 1e-5, `row ${i} token ${j}: ${v} vs ${alone[i].logprobs[j]}`)))
    assert.ok(batchedRows >= 3 * 48, `decode ran batched (${batchedRows} batched row steps)`)
  })

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
  const N = 12
  let ref, model, expected
  before(async () => {
    ref = readJson('ref-f32.json')
    model = await mlx.loadModel(fixture('smollm2-f32'))
    expected = ref.results.map((r) => {
      const stop = r.tokens.findIndex((t) => ref.eos_token_ids.includes(t))
      return (stop < 0 ? r.tokens : r.tokens.slice(0, stop)).slice(0, N)
    })
  })
  after(() => model.dispose())

  for (const sessions of [2, 4, 8]) {
    test(`${sessions} concurrent greedy sessions each produce mlx-lm reference tokens`, async () => {
      const engine = mlx.createEngine(model)
      const before = mlx.testing.batchCounts()
      const which = Array.from({ length: sessions }, (_, i) => i % ref.results.length)
      const outs = await Promise.all(which.map((i) => collectOne(engine, { promptTokens: ref.results[i].prompt_ids, maxTokens: N })))
      const after = mlx.testing.batchCounts()
      const rows = after.rows - before.rows
      // Rows that arrive later join after their prefill: at least half the steps run batched.
      assert.ok(rows >= (sessions * N) / 2, `decode ran batched (${rows} batched row steps)`)
      if (sessions > 2) {
        const prefilled = after.prefillRows - before.prefillRows
        assert.ok(prefilled >= 2, `prompts prefilled batched (${prefilled} batched row chunks)`)
      }
      assert.deepEqual(outs, which.map((i) => expected[i]))
      await engine.close()
    })
  }

  test('a row cancelled mid-decode leaves the other rows equal to mlx-lm', async () => {
    const engine = mlx.createEngine(model)
    const keep = [0, 1, 2].map((i) => engine.open({ promptTokens: ref.results[i].prompt_ids, maxTokens: N }, { output: 'collect' }))
    let got = 0
    const cancelled = engine.open({ promptTokens: ref.results[1].prompt_ids, maxTokens: N }, {
      output: 'callback',
      onTokens: (ids) => {
        got += ids.length
        if (got >= 3) cancelled.cancel().catch(() => {})
      },
    })
    const outs = await Promise.all(keep.map((s) => within(s.result, 'a kept row', 60_000)))
    assert.deepEqual(outs.map((o) => Array.from(o.output)), expected)
    const o = await cancelled.result
    assert.equal(o.status, 'cancelled')
    assert.ok(o.output === undefined || o.output.length < N)
    await engine.close()
  })
})
