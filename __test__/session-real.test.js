'use strict'
// Engine sessions on real weights (SmolLM2-135M f32, made by scripts/fixtures.sh): a chat
// `messages` request rendered with the model's own template, and sessions running side by side,
// all checked against Python mlx-lm 0.32.2's greedy tokens for the same prompts; and child
// processes spawned mid-generation.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')

const mlx = require('..')
const { execFileSync } = require('node:child_process')
const { fixture, readJson, within } = require('./helpers')

/** mlx-lm does not stop at EOS in the reference run; we do, and never yield the EOS. */
function expected(tokens, eos, n = tokens.length) {
  const stop = tokens.findIndex((t) => eos.includes(t))
  return (stop < 0 ? tokens : tokens.slice(0, stop)).slice(0, n)
}

async function streamTokens(session) {
  const tokens = []
  for await (const e of session.events) if (e.type === 'committed') tokens.push(...e.tokenIds)
  return tokens
}

describe('engine sessions on SmolLM2 (real weights)', () => {
  let model, engine, ref
  before(async () => {
    ref = readJson('ref-f32.json')
    model = await mlx.loadModel(fixture('smollm2-f32'))
    engine = mlx.createEngine(model)
  })
  after(async () => {
    await engine.close()
    model.dispose()
  })

  test('a messages request is rendered with the model template and generates as mlx-lm does', async () => {
    const r = ref.results.find((x) => x.source === 'messages')
    assert.match(r.rendered, /What is the capital of France\?/)
    const s = engine.open(
      { messages: [{ role: 'user', content: 'What is the capital of France?' }], maxTokens: r.tokens.length },
      { output: 'collect' },
    )
    const o = await s.result
    assert.equal(o.status, 'completed')
    assert.equal(o.result.metrics.promptTokens, r.prompt_ids.length)
    assert.deepEqual(Array.from(o.output), expected(r.tokens, ref.eos_token_ids))
  })

  test('stream, collect and callback sessions side by side each match mlx-lm', async () => {
    const N = 16
    const [a, b, c] = ref.results
    const fromCallback = []
    const sessions = [
      engine.open({ promptTokens: a.prompt_ids, maxTokens: N }),
      engine.open({ promptTokens: b.prompt_ids, maxTokens: N }, { output: 'collect' }),
      engine.open({ promptTokens: c.prompt_ids, maxTokens: N }, { output: 'callback', onTokens: (ids) => void fromCallback.push(...ids) }),
    ]
    const streamed = await streamTokens(sessions[0])
    const outcomes = await Promise.all(sessions.map((s) => s.result))
    assert.deepEqual(outcomes.map((o) => o.status), ['completed', 'completed', 'completed'])
    assert.deepEqual(streamed, expected(a.tokens, ref.eos_token_ids, N))
    assert.deepEqual(Array.from(outcomes[1].output), expected(b.tokens, ref.eos_token_ids, N))
    assert.deepEqual(fromCallback, expected(c.tokens, ref.eos_token_ids, N))
  })

  test('child processes spawned while a session decodes neither stall it nor change its tokens', async () => {
    // OpenBLAS stops its threads before fork(); a BLAS call running on MLX's worker then waited
    // forever. The engine now drains its stream before a fork (Node forks; Bun's spawn does not).
    const r = ref.results[0]
    const N = 24
    const s = engine.open({ promptTokens: r.prompt_ids, maxTokens: N }, { output: 'collect' })
    let done = false
    const result = s.result.finally(() => (done = true))
    let spawned = 0
    const until = Date.now() + 120_000
    while (!done && Date.now() < until) {
      execFileSync(process.execPath, ['-e', ''])
      spawned++
      await new Promise((resolve) => setTimeout(resolve, 5))
    }
    const o = await within(result, 'the session while processes are spawned', 1_000)
    assert.ok(spawned >= 3, `spawned ${spawned}`)
    assert.deepEqual(Array.from(o.output), expected(r.tokens, ref.eos_token_ids, N))
  })

  test('a request with both messages and promptTokens, or neither, is rejected with INVALID_PROMPT', () => {
    const both = { messages: [{ role: 'user', content: 'hi' }], promptTokens: [1] }
    assert.throws(() => engine.open(both), (e) => e.code === 'INVALID_PROMPT')
    assert.throws(() => engine.open({ maxTokens: 4 }), (e) => e.code === 'INVALID_PROMPT')
  })
})
