'use strict'
// generate(): streaming, stopping, cancelling, sampling and logprobs.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const path = require('node:path')
const { spawnSync } = require('node:child_process')

const mlx = require('..')
const { makeTinyLlama, tmpdir, collect, fixture, TINY } = require('./helpers')

async function collectTokens(gen) {
  const out = []
  for await (const t of gen) out.push(t)
  return out
}

describe('generate on a tiny random llama', () => {
  let model
  before(async () => {
    model = await mlx.loadModel(makeTinyLlama(path.join(tmpdir('gen'), 'tiny')))
  })
  after(() => model.dispose())

  test('streams exactly maxTokens tokens with indices and sets stats', async () => {
    const gen = mlx.generate(model, [1, 2, 3], { maxTokens: 7, eosTokenIds: [] })
    const seen = []
    for await (const t of gen) seen.push(t)
    assert.deepEqual(seen.map((t) => t.index), [0, 1, 2, 3, 4, 5, 6])
    assert.ok(seen.every((t) => Number.isInteger(t.token) && t.token < TINY.vocab))
    assert.equal(gen.finishReason, 'length')
    assert.equal(gen.stats.generatedTokens, 7)
    assert.equal(gen.stats.promptTokens, 3)
    assert.ok(gen.stats.decodeTps > 0 && gen.stats.prefillTps > 0)
  })

  test('greedy is deterministic and equals a run with a longer limit', async () => {
    const a = await collect(mlx.generate(model, [5, 6], { maxTokens: 12, eosTokenIds: [] }))
    const b = await collect(mlx.generate(model, [5, 6], { maxTokens: 20, eosTokenIds: [] }))
    assert.deepEqual(b.tokens.slice(0, 12), a.tokens)
  })

  test('an EOS token ends the stream and is not yielded', async () => {
    const free = await collect(mlx.generate(model, [5, 6], { maxTokens: 12, eosTokenIds: [] }))
    const eos = free.tokens[4]
    const stopped = await collect(mlx.generate(model, [5, 6], { maxTokens: 12, eosTokenIds: [eos] }))
    const firstEos = free.tokens.indexOf(eos)
    assert.deepEqual(stopped.tokens, free.tokens.slice(0, firstEos))
    assert.equal(stopped.gen.finishReason, 'stop')
  })

  test('break cancels and still sets stats', async () => {
    const gen = mlx.generate(model, [1], { maxTokens: 100000, eosTokenIds: [] })
    let n = 0
    for await (const _ of gen) if (++n === 3) break
    assert.equal(gen.finishReason, 'cancelled')
    assert.ok(gen.stats.generatedTokens >= 3 && gen.stats.generatedTokens < 100000)
  })

  test('an AbortSignal ends the iteration as cancelled', async () => {
    const ac = new AbortController()
    const gen = mlx.generate(model, [1], { maxTokens: 100000, eosTokenIds: [], signal: ac.signal })
    let n = 0
    for await (const _ of gen) if (++n === 5) ac.abort()
    assert.equal(gen.finishReason, 'cancelled')
    assert.ok(n >= 5 && n < 100000)
  })

  test('a generation can be iterated only once', async () => {
    const gen = mlx.generate(model, [1], { maxTokens: 2 })
    await collect(gen)
    assert.throws(() => gen[Symbol.asyncIterator](), { code: 'ALREADY_CONSUMED' })
  })

  test('same seed → same tokens; different seed → different tokens', async () => {
    const opts = { maxTokens: 24, temperature: 1.5, eosTokenIds: [] }
    const a = await collect(mlx.generate(model, [9, 8, 7], { ...opts, seed: 11 }))
    const b = await collect(mlx.generate(model, [9, 8, 7], { ...opts, seed: 11 }))
    const c = await collect(mlx.generate(model, [9, 8, 7], { ...opts, seed: 12 }))
    assert.deepEqual(a.tokens, b.tokens)
    assert.notDeepEqual(a.tokens, c.tokens)
  })

  test('topK 1 sampling equals greedy', async () => {
    const greedy = await collect(mlx.generate(model, [3, 4], { maxTokens: 10, eosTokenIds: [] }))
    const k1 = await collect(mlx.generate(model, [3, 4], { maxTokens: 10, eosTokenIds: [], temperature: 0.8, topK: 1, seed: 3 }))
    assert.deepEqual(k1.tokens, greedy.tokens)
  })

  test('logprobs: chosen token is the best alternative under greedy, top list sorted', async () => {
    const out = []
    for await (const t of mlx.generate(model, [2, 3], { maxTokens: 5, eosTokenIds: [], topLogprobs: 4 })) out.push(t)
    for (const t of out) {
      assert.equal(t.logprobs.top.length, 4)
      assert.equal(t.logprobs.top[0].id, t.token)
      assert.ok(Math.abs(t.logprobs.top[0].logprob - t.logprobs.logprob) < 1e-6)
      assert.ok(t.logprobs.logprob <= 0)
      for (let i = 1; i < 4; i++) assert.ok(t.logprobs.top[i - 1].logprob >= t.logprobs.top[i].logprob)
    }
  })

  test('a logit bias forces a token', async () => {
    const { tokens } = await collect(mlx.generate(model, [2, 3], { maxTokens: 6, eosTokenIds: [], logitBias: { 42: 1000 } }))
    assert.deepEqual(tokens, [42, 42, 42, 42, 42, 42])
  })

  test('prefill chunking does not change the tokens', async () => {
    const prompt = Array.from({ length: 40 }, (_, i) => (i * 7) % TINY.vocab)
    const whole = await collect(mlx.generate(model, prompt, { maxTokens: 8, eosTokenIds: [] }))
    const chunked = await collect(mlx.generate(model, prompt, { maxTokens: 8, eosTokenIds: [], prefillChunkSize: 7 }))
    assert.deepEqual(chunked.tokens, whole.tokens)
  })

  test("model.logits of a prompt longer than a prefill chunk (2048) gives the first token's log-probabilities", async () => {
    const prompt = Array.from({ length: 2100 }, (_, i) => (i * 13 + 5) % TINY.vocab)
    const logits = await model.logits(prompt)
    assert.equal(logits.length, TINY.vocab)
    let best = 0
    for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i
    const max = logits[best]
    const lse = max + Math.log(logits.reduce((sum, x) => sum + Math.exp(x - max), 0))
    const [first] = await collectTokens(mlx.generate(model, prompt, { maxTokens: 1, eosTokenIds: [], topLogprobs: 5 }))
    assert.equal(first.token, best)
    for (const { id, logprob } of first.logprobs.top) assert.ok(Math.abs(logits[id] - lse - logprob) < 1e-4, `${id}: ${logits[id] - lse} vs ${logprob}`)
  })

  test('concurrent generations each get their own tokens', async () => {
    const solo = await collect(mlx.generate(model, [10, 11], { maxTokens: 10, eosTokenIds: [] }))
    const solo2 = await collect(mlx.generate(model, [12], { maxTokens: 10, eosTokenIds: [] }))
    const [a, b] = await Promise.all([
      collect(mlx.generate(model, [10, 11], { maxTokens: 10, eosTokenIds: [] })),
      collect(mlx.generate(model, [12], { maxTokens: 10, eosTokenIds: [] })),
    ])
    assert.deepEqual(a.tokens, solo.tokens)
    assert.deepEqual(b.tokens, solo2.tokens)
  })
})

describe('generate on SmolLM2 (real weights)', () => {
  test('the chat answer streams as readable text', { timeout: 120_000 }, async () => {
    const gguf = fixture('home/models/SmolLM2-135M-Instruct.Q4_1.gguf')
    const [model, tok, tpl] = [await mlx.loadModel(gguf), mlx.loadTokenizer(gguf), mlx.ChatTemplate.load(gguf)]
    const ids = tok.encode(tpl.render([{ role: 'user', content: 'What is the capital of France?' }]), false)
    const dec = tok.createDecoder()
    let text = ''
    const gen = mlx.generate(model, ids, { maxTokens: 12 })
    for await (const t of gen) text += dec.push([t.token])
    text += dec.flush()
    assert.match(text, /Paris/)
    assert.equal(gen.finishReason, 'stop')
    model.dispose()
  })

  // One prefill step of 200 prompt tokens takes over a minute for this 4-bit model on MLX's CPU
  // backend (Linux); the engine checks for a cancel between layers, so an abort ends the
  // generation within seconds rather than after the step. On Metal the step is over sooner.
  test('an abort during a long prefill step ends the generation within seconds', { timeout: 180_000 }, async () => {
    const model = await mlx.loadModel(fixture('smollm2-q4'))
    const ac = new AbortController()
    const prompt = Array.from({ length: 200 }, (_, i) => 100 + i)
    const gen = mlx.generate(model, prompt, { maxTokens: 4, eosTokenIds: [], signal: ac.signal })
    let abortedAt
    setTimeout(() => {
      abortedAt = Date.now()
      ac.abort()
    }, 1500)
    const { tokens } = await collect(gen)
    const waited = Date.now() - abortedAt
    if (process.platform === 'linux') assert.equal(gen.finishReason, 'cancelled')
    if (gen.finishReason === 'cancelled') {
      assert.ok(waited < 20_000, `the generation ended ${waited} ms after the abort`)
      assert.deepEqual(tokens, [])
    }
    const after = await collect(mlx.generate(model, [1, 2, 3], { maxTokens: 2, eosTokenIds: [] }))
    assert.equal(after.tokens.length, 2)
    model.dispose()
  })

  // Node forks to spawn; before a fork the engine gets out of MLX (OpenBLAS's fork handler would
  // hang a BLAS call). Inside a prefill step of ~6 s (900 tokens, f32, MLX's CPU backend) it
  // pauses at the next layer, so the spawn waits for one layer, and the generation goes on as if
  // nothing happened.
  test('a process spawned during a long prefill step waits for one layer; tokens unchanged', { timeout: 180_000 }, async () => {
    const model = await mlx.loadModel(fixture('smollm2-f32'))
    const prompt = Array.from({ length: 900 }, (_, i) => (i * 7919 + 13) % 49152)
    const run = async (spawnAfterMs) => {
      const gen = mlx.generate(model, prompt, { maxTokens: 4, eosTokenIds: [], topLogprobs: 2 })
      let blocked = null
      const spawned = spawnAfterMs === null ? null : new Promise((resolve) => setTimeout(() => {
        const t0 = Date.now()
        spawnSync('true')
        blocked = Date.now() - t0
        resolve()
      }, spawnAfterMs))
      const steps = []
      for await (const t of gen) steps.push(t)
      await spawned
      return { steps, blocked }
    }
    const quiet = await run(null)
    const forked = await run(1000)
    if (process.platform === 'linux') assert.ok(forked.blocked < 4000, `the spawn waited ${forked.blocked} ms`)
    assert.equal(forked.steps.length, 4)
    assert.deepEqual(forked.steps, quiet.steps)
    model.dispose()
  })
})
