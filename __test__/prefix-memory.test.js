'use strict'
// What the prefix cache counts is what MLX holds beyond the weights. In a process of its own:
// the check reads MLX's memory for the whole process.
const { test } = require('node:test')
const assert = require('node:assert/strict')

const mlx = require('..')
const { fixture, within, eventually } = require('./helpers')

const dir = fixture('smollm2-f32')

test('the prefix cache holds what it counts: rows of a batch that wait, leave or end keep no stack alive', { timeout: 300_000 }, async () => {
  // A row that sits out a step is copied out of the batch's stacked caches. A copy left lazy held
  // the whole stack (every row's keys and values) for as long as the row waited or its caches
  // stayed in the prefix cache, which counted the row alone: memory the budgets did not see.
  const model = await mlx.loadModel(dir)
  const tok = mlx.loadTokenizer(dir)
  const engine = mlx.createEngine(model)
  try {
    const base = mlx.testing.mlxActiveMemory()
    const prompt = (i) => Array.from(tok.encode(`Question ${i}: write a long story about dragon number ${i}.`))
    const one = async (i, leaveAfter) => {
      const s = engine.open({ promptTokens: prompt(i), maxTokens: leaveAfter === null ? 6 : 400, eosTokenIds: [] })
      let n = 0
      for await (const e of s.events) if (e.type === 'committed' && leaveAfter !== null && ++n > leaveAfter) break
      await s.result
    }
    // Every client stays; then a quarter leave early.
    for (const leave of [() => null, (i) => (i % 4 === 0 ? i % 3 : null)]) {
      await within(Promise.all(Array.from({ length: 32 }, (_, i) => one(i % 8, leave(i)))), 'a round of 32 sessions', 240_000)
      assert.ok(await eventually(() => engine.stats.idle && engine.stats.liveSessions === 0, 10_000), 'the engine went idle')
      const held = mlx.testing.mlxActiveMemory() - base
      const counted = engine.stats.prefixCache.bytes
      assert.ok(counted > 0 && Math.abs(held - counted) <= 1e6, `MLX holds ${held} bytes beyond the weights; the prefix cache counts ${counted}`)
    }
  } finally {
    await engine.close()
    model.dispose()
  }
})
