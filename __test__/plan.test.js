'use strict'
// resolveExecution from JavaScript: mlx-bun's shapes in and out (the rules are covered by the
// Rust table tests in src/engine/placement.rs).
const { test } = require('node:test')
const assert = require('node:assert/strict')

const { resolveExecution } = require('..')

const plain = {
  hasVision: false, hasAdapters: false, hasRepetitionPenalty: false, userSeed: false, kvQuant: false,
  turboQuant: false, hasLogitsExtras: false, hasGrammar: false, wantsLogprobs: false, hasDraft: false,
}
const caps = { method: 'autoregressive', continuous: true, quantizedBatch: false, grammarBatch: false, checkpoints: false }

test('a plain request is placed on the continuous lane', () => {
  const e = resolveExecution(plain, caps)
  assert.deepEqual({ ...e, reasons: [...e.reasons] }, {
    method: 'autoregressive', mechanism: 'continuous', pagedKv: false, promptCache: true, checkpoint: false,
    fill: false, compiledDecode: false, grammarJump: false, reasons: [],
  })
  assert.ok(Object.isFrozen(e) && Object.isFrozen(e.reasons))
})

test('fallbacks carry their reasons in order', () => {
  const e = resolveExecution({ ...plain, hasVision: true, hasDraft: true }, { ...caps, continuous: false }, { pagedKv: true, fill: true })
  assert.equal(e.mechanism, 'serial')
  assert.equal(e.method, 'autoregressive')
  assert.deepEqual([...e.reasons], [
    'continuous-unavailable', 'media-requires-serial', 'paged-kv-requires-serial',
    'draft-incompatible-with-request', 'paged-kv-bypassed-for-media-or-adapters', 'fill-incompatible-with-request',
  ])
})

test('a draft goes speculative when the lane groups it', () => {
  const e = resolveExecution({ ...plain, hasDraft: true }, { ...caps, groupedMethods: ['autoregressive', 'speculative'] })
  assert.equal(e.method, 'speculative')
  assert.equal(e.mechanism, 'continuous')
})

test('an unknown method is a typed error', () => {
  assert.throws(() => resolveExecution(plain, { ...caps, method: 'magic' }), { code: 'INVALID_OPTION' })
})

test("an engine reports what it can do, and its requests are placed against that", async () => {
  const mlx = require('..')
  const { makeTinyLlama, tmpdir } = require('./helpers')
  const model = await mlx.loadModel(makeTinyLlama(require('node:path').join(tmpdir('caps'), 'tiny')))
  const engine = mlx.createEngine(model)
  try {
    const c = engine.capabilities
    assert.equal(c.method, 'autoregressive')
    assert.equal(c.continuous, true)
    // Grammar rows, grammar proposals, fill rows, fill before a draft and rows with quantized KV caches join the
    // batch, and speculative rows carry logprobs; nothing else mlx-bun's placement knows is claimed: this engine has
    // none of it yet.
    const claimed = Object.entries(c).filter(([k, v]) => v === true && k !== 'continuous').map(([k]) => k)
    assert.deepEqual(claimed.sort(), ['grammarBatch', 'quantizedBatch', 'sharedFill', 'sharedGrammarProposals', 'sharedSpeculativeEcho', 'speculativeLogprobs'])
    // A kvBits request shares the batch.
    assert.equal(resolveExecution({ ...plain, kvQuant: true }, c).mechanism, 'continuous')
    assert.deepEqual([...c.groupedMethods], ['autoregressive', 'speculative'])
    const placed = resolveExecution(plain, c)
    assert.equal(placed.mechanism, 'continuous')
    assert.equal(placed.promptCache, true)
  } finally {
    await engine.close()
    model.dispose()
  }
  const scripted = mlx.testing.createScriptedEngine({ steps: [] })
  assert.equal(scripted.capabilities.continuous, false)
  assert.deepEqual([...resolveExecution(plain, scripted.capabilities).reasons], ['continuous-unavailable'])
  await scripted.close()
})
