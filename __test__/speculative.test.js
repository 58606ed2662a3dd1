'use strict'
// Speculative decoding on real weights: SmolLM2-135M f32 as the target, drafted by its Q4_1 GGUF
// (the f32 folder is that GGUF dequantized, so the draft agrees on every greedy token here), by
// the MLX 4-bit requantization of it (a draft that disagrees now and then: some proposals are
// rejected; loaded with f32Matmuls 'all', its products run five times faster on MLX's CPU backend
// than bf16's quantized kernel), by itself, and by a random model with its vocabulary (almost
// nothing accepted).
// Greedy output must be mlx-lm's greedy output for the target, alone and in a batch with plain
// rows.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const path = require('node:path')

const mlx = require('..')
const { fixture, readJson, makeTinyLlama, tmpdir } = require('./helpers')

/** mlx-lm does not stop at EOS in the reference run; we do, and never yield the EOS. */
function expected(tokens, eos, n = tokens.length) {
  const stop = tokens.findIndex((t) => eos.includes(t))
  return (stop < 0 ? tokens : tokens.slice(0, stop)).slice(0, n)
}

describe('speculative decoding on SmolLM2 (real weights)', () => {
  let target, gguf, q4, random, engine, ref, tok
  before(async () => {
    ref = readJson('ref-f32.json')
    tok = mlx.loadTokenizer(fixture('smollm2-f32'))
    target = await mlx.loadModel(fixture('smollm2-f32'))
    gguf = await mlx.loadModel(fixture('home/models/SmolLM2-135M-Instruct.Q4_1.gguf'))
    q4 = await mlx.loadModel(fixture('smollm2-q4'), { f32Matmuls: 'all' })
    random = await mlx.loadModel(makeTinyLlama(path.join(tmpdir('draft'), 'tiny'), 3, { dims: { vocab: target.config.vocabSize } }))
    engine = mlx.createEngine(target)
  })
  after(async () => {
    await engine.close()
    for (const m of [target, gguf, q4, random]) m.dispose()
  })

  const open = (r, extra) => engine.open({ promptTokens: r.prompt_ids, maxTokens: r.tokens.length, ...extra }, { output: 'collect' }).result

  test('greedy with a 4-bit draft: exactly the target greedy tokens for 64 tokens × 3 prompts; counts reported', async () => {
    for (const r of ref.results) {
      const o = await open(r, { draftModel: gguf })
      assert.equal(o.status, 'completed', JSON.stringify(o.error))
      assert.deepEqual(Array.from(o.output), expected(r.tokens, ref.eos_token_ids), r.source)
      const m = o.result.metrics
      assert.ok(m.draftTokens > 0 && m.acceptedDraftTokens <= m.draftTokens)
    }
  })

  test('a draft that disagrees at times: rejected proposals never change the tokens', async () => {
    const r = ref.results[1]
    const o = await open({ ...r, tokens: r.tokens.slice(0, 24) }, { draftModel: q4 })
    assert.deepEqual(Array.from(o.output), expected(r.tokens, ref.eos_token_ids, 24))
    const m = o.result.metrics
    assert.ok(m.acceptedDraftTokens > 0 && m.acceptedDraftTokens < m.draftTokens, `${m.acceptedDraftTokens} of ${m.draftTokens} accepted`)
  })

  test('every proposal accepted (the target drafts itself) or almost none (a random draft): the same tokens', async () => {
    const r = ref.results[0]
    const self = await open(r, { draftModel: target, numDraftTokens: 4 })
    assert.deepEqual(Array.from(self.output), expected(r.tokens, ref.eos_token_ids))
    assert.ok(self.result.metrics.acceptedDraftTokens >= self.result.metrics.draftTokens - 4)
    const noise = await open(r, { draftModel: random, numDraftTokens: 2 })
    assert.deepEqual(Array.from(noise.output), expected(r.tokens, ref.eos_token_ids))
    assert.ok(noise.result.metrics.acceptedDraftTokens < noise.result.metrics.draftTokens / 4)
  })

  test('drafted rows share a batch of 4 with plain rows, each equal to its run alone', async () => {
    const N = 24
    const [a, b, c] = ref.results
    const outs = await Promise.all([
      open({ ...a, tokens: a.tokens.slice(0, N) }, { draftModel: gguf }),
      open({ ...b, tokens: b.tokens.slice(0, N) }),
      open({ ...c, tokens: c.tokens.slice(0, N) }, { draftModel: gguf }),
      open({ ...a, tokens: a.tokens.slice(0, N) }),
    ])
    const want = [a, b, c, a].map((r) => expected(r.tokens, ref.eos_token_ids, N))
    assert.deepEqual(outs.map((o) => Array.from(o.output)), want)
  })

  test('logprobs under speculation: those of plain decoding at each kept position', async () => {
    const r = ref.results[1]
    const read = async (extra) => {
      const s = engine.open({ promptTokens: r.prompt_ids, maxTokens: 16, logprobs: true, topLogprobs: 3, ...extra })
      const out = []
      for await (const e of s.events) if (e.type === 'committed') e.tokenIds.forEach((t, i) => out.push({ t, ...e.logprobs[i] }))
      return out
    }
    const want = await read({})
    const got = await read({ draftModel: q4 })
    assert.deepEqual(got.map((x) => x.t), want.map((x) => x.t))
    got.forEach((x, i) => {
      assert.ok(Math.abs(x.logprob - want[i].logprob) < 1e-3, `${i}: ${x.logprob} vs ${want[i].logprob}`)
      assert.deepEqual(x.top.map((a) => a.id), want[i].top.map((a) => a.id))
    })
  })

  test('a seeded sampled run is reproducible', async () => {
    const r = ref.results[1]
    const opts = { draftModel: gguf, temperature: 0.8, seed: 11, maxTokens: 12 }
    const x = await open(r, opts)
    const y = await open(r, opts)
    assert.deepEqual(Array.from(x.output), Array.from(y.output))
    assert.equal(x.output.length, 12)
  })

  test('grammars under speculation: the tokens constrained decoding gives without a draft, also beside a plain row', async () => {
    const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 120 } }, required: ['name', 'age'], additionalProperties: false }
    const r = ref.results[0]
    for (const grammar of [{ jsonSchema: schema }, { regex: '[A-Z][a-z]+( [a-z]+){1,6}\\.' }]) {
      const want = await open(r, { grammar, maxTokens: 40 })
      assert.equal(want.status, 'completed', JSON.stringify(want.error))
      // Drafts that agree on everything (Q4_1, itself) end inside a proposal where the grammar
      // does; a random one proposes what the grammar forbids.
      const [plain, ...runs] = await Promise.all([open(r, { maxTokens: 8 }), ...[gguf, target, random].map((d) => open(r, { grammar, maxTokens: 40, draftModel: d }))])
      assert.deepEqual(Array.from(plain.output), expected(r.tokens, ref.eos_token_ids, 8))
      for (const got of runs) {
        assert.equal(got.status, 'completed', JSON.stringify(got.error))
        assert.deepEqual(Array.from(got.output), Array.from(want.output), JSON.stringify(grammar))
        assert.equal(got.result.finishReason, want.result.finishReason)
        assert.ok(got.result.metrics.draftTokens > 0)
      }
      assert.ok(runs[0].result.metrics.acceptedDraftTokens > 0)
      if (grammar.jsonSchema) {
        assert.equal(want.result.finishReason, 'stop')
        const value = JSON.parse(tok.decode(Array.from(want.output), true))
        assert.deepEqual(Object.keys(value).sort(), ['age', 'name'])
      }
    }
  })

  test('placement, and what a draft does not take', async () => {
    const placed = mlx.resolveExecution({ hasVision: false, hasAdapters: false, hasRepetitionPenalty: false, userSeed: false, kvQuant: false, turboQuant: false, hasLogitsExtras: false, hasGrammar: false, wantsLogprobs: false, hasDraft: true }, engine.capabilities)
    assert.equal(placed.method, 'speculative')
    assert.equal(placed.mechanism, 'continuous')
    const p = { promptTokens: [1, 2, 3] }
    const tiny = await mlx.loadModel(makeTinyLlama(path.join(tmpdir('draft-small'), 'tiny')))
    try {
      assert.throws(() => engine.open({ ...p, draftModel: tiny }), { code: 'INVALID_OPTION', message: /draftModel: its vocabulary/ })
    } finally {
      tiny.dispose()
    }
    assert.throws(() => engine.open({ ...p, draftModel: {} }), { code: 'INVALID_OPTION' })
    assert.throws(() => engine.open({ ...p, draftModel: gguf, numDraftTokens: 0 }), { code: 'INVALID_OPTION' })
    assert.throws(() => engine.open({ ...p, draftModel: gguf, numDraftTokens: 65 }), { code: 'INVALID_OPTION', message: /numDraftTokens: must be an integer from 1 to 64/ })
    // Penalties: each position is sampled with the proposals before it in the penalty history.
    const r = ref.results[2]
    const penalized = { repetitionPenalty: 1.3, frequencyPenalty: 0.3, maxTokens: 24 }
    const [want, got] = await Promise.all([open(r, penalized), open(r, { ...penalized, draftModel: gguf })])
    assert.deepEqual(Array.from(got.output), Array.from(want.output))
    assert.ok(got.result.metrics.acceptedDraftTokens > 0)
    const gen = mlx.generate(target, ref.results[0].prompt_ids, { draftModel: gguf, maxTokens: 8 })
    const tokens = []
    for await (const t of gen) tokens.push(t.token)
    assert.deepEqual(tokens, expected(ref.results[0].tokens, ref.eos_token_ids, 8))
    assert.ok(gen.stats.draftTokens > 0)
  })
})
