'use strict'
// Exiting while a generation is in flight must never crash: Node's process.exit() once crashed
// ~24 % of runs inside MLX before the exit gate existed.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const { spawn } = require('node:child_process')
const path = require('node:path')

const { fixture, makeTinyLlama, tmpdir } = require('./helpers')

const RUNS = 50
// f32 products run on OpenBLAS's threads; bf16 ones of 2^18 elements or more (here the output
// head, 4096×128) split across the engine's two MLX streams.
const dirs = {
  f32: makeTinyLlama(path.join(tmpdir('exit'), 'tiny')),
  bf16: makeTinyLlama(path.join(tmpdir('exit-bf16'), 'tiny'), 1, { bf16: true, dims: { vocab: 4096, hidden: 128 } }),
}

function child(mode, dir) {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [path.join(__dirname, 'exit-child.js'), mode, dir], { stdio: ['ignore', 'ignore', 'pipe'] })
    let stderr = ''
    p.stderr.on('data', (d) => (stderr += d))
    p.on('exit', (code, signal) => resolve({ code, signal, stderr, at: Date.now() }))
  })
}

async function runMany(mode, dir, expectedCode) {
  const failures = []
  for (let i = 0; i < RUNS; i += 2) {
    for (const r of await Promise.all([child(mode, dir), child(mode, dir)])) {
      if (r.code !== expectedCode) failures.push(r)
    }
  }
  assert.deepEqual(failures, [], `${failures.length}/${RUNS} runs did not exit cleanly`)
}

for (const [dtype, dir] of Object.entries(dirs)) {
  test(`${dtype}: process.exit() during generation: ${RUNS} runs, no crash`, { timeout: 300_000 }, () => runMany('exit', dir, 3))
  test(`${dtype}: end of script during generation: ${RUNS} runs, no crash`, { timeout: 300_000 }, () => runMany('end', dir, 0))
}

// The exit waits for the engine's current step, but one step can be a prefill chunk of minutes
// (here SmolLM2 4-bit, ~2 prompt tokens/s on MLX's CPU backend): past 3 s the process ends with
// its exit status instead of hanging until the step is done.
test('process.exit() inside a minutes-long prefill step ends the process within seconds', { timeout: 120_000 }, async () => {
  const r = await child('long-exit', fixture('smollm2-q4'))
  assert.equal(r.code, 3, r.stderr)
  const asked = Number(/exiting at (\d+)/.exec(r.stderr)[1])
  assert.ok(r.at - asked < 20_000, `the exit took ${r.at - asked} ms`)
})
