'use strict'
// Exiting while a generation is in flight must never crash: Node's process.exit() once crashed
// ~24 % of runs inside MLX before the exit gate existed.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const { spawn } = require('node:child_process')
const path = require('node:path')

const { makeTinyLlama, tmpdir } = require('./helpers')

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
    p.on('exit', (code, signal) => resolve({ code, signal, stderr }))
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
