'use strict'
// Worker threads may load the addon, generate and end (vitest's default pool does): the end of a
// worker must leave the engine working for later workers and the main thread. The gate that
// keeps MLX idle at exit was once closed by whichever environment loaded the addon first, so the
// end of a first worker stalled every later generation. The main thread loads the addon only
// after the workers here, as an application whose first user is a worker would.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const path = require('node:path')
const { Worker } = require('node:worker_threads')

const { makeTinyLlama, tmpdir, collect } = require('./helpers')

const dir = makeTinyLlama(path.join(tmpdir('workers'), 'tiny'))
const PROMPT = [1, 2, 3]
const MAX_TOKENS = 8

/** Runs worker-child.js; resolves with the tokens it posts first, once it is terminated. A worker
 * whose generation stalls is terminated too, so that the test fails instead of hanging. */
function inWorker(mode) {
  return new Promise((resolve, reject) => {
    const w = new Worker(path.join(__dirname, 'worker-child.js'), { workerData: { dir, prompt: PROMPT, maxTokens: MAX_TOKENS, mode } })
    const stall = setTimeout(() => w.terminate().then(() => reject(new Error(`a ${mode} worker stalled for 20 s`))), 20_000)
    w.once('error', reject)
    w.once('message', async (m) => {
      clearTimeout(stall)
      await w.terminate()
      if (m.error) reject(new Error(m.error))
      else resolve(m)
    })
  })
}

test('workers that end one after another, then the main thread, all generate', { timeout: 60_000 }, async () => {
  const first = await inWorker('complete')
  const second = await inWorker('complete')
  const third = await inWorker('complete')
  const mlx = require('..')
  const model = await mlx.loadModel(dir)
  const { tokens } = await collect(mlx.generate(model, PROMPT, { maxTokens: MAX_TOKENS, temperature: 0 }))
  assert.equal(tokens.length, MAX_TOKENS)
  assert.deepEqual([first, second, third], [tokens, tokens, tokens])
})

test('a worker terminated mid-generation releases its generation', { timeout: 60_000 }, async () => {
  const partial = await inWorker('midway')
  assert.equal(partial.length, MAX_TOKENS)
  // The endless generation decoded on a core of its own; once released the process idles.
  await new Promise((r) => setTimeout(r, 500))
  const before = process.cpuUsage()
  await new Promise((r) => setTimeout(r, 1000))
  const used = process.cpuUsage(before)
  assert.ok((used.user + used.system) / 1000 < 400, `the process used ${(used.user + used.system) / 1000} ms of CPU in 1 s after the worker ended`)
  const mlx = require('..')
  const model = await mlx.loadModel(dir)
  const { tokens } = await collect(mlx.generate(model, PROMPT, { maxTokens: MAX_TOKENS, eosTokenIds: [], temperature: 0 }))
  assert.deepEqual(tokens, partial)
})
