'use strict'
// Exiting while a generation is in flight must never crash: Node's process.exit() once crashed
// ~24 % of runs inside MLX before the exit gate existed.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const { spawn } = require('node:child_process')
const path = require('node:path')

const { makeTinyLlama, tmpdir } = require('./helpers')

const RUNS = 50
const dir = makeTinyLlama(path.join(tmpdir('exit'), 'tiny'))

function child(mode) {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [path.join(__dirname, 'exit-child.js'), mode, dir], { stdio: ['ignore', 'ignore', 'pipe'] })
    let stderr = ''
    p.stderr.on('data', (d) => (stderr += d))
    p.on('exit', (code, signal) => resolve({ code, signal, stderr }))
  })
}

async function runMany(mode, expectedCode) {
  const failures = []
  for (let i = 0; i < RUNS; i += 2) {
    for (const r of await Promise.all([child(mode), child(mode)])) {
      if (r.code !== expectedCode) failures.push(r)
    }
  }
  assert.deepEqual(failures, [], `${failures.length}/${RUNS} runs did not exit cleanly`)
}

test(`process.exit() during generation: ${RUNS} runs, no crash`, { timeout: 300_000 }, () => runMany('exit', 3))
test(`end of script during generation: ${RUNS} runs, no crash`, { timeout: 300_000 }, () => runMany('end', 0))
