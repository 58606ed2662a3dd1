#!/usr/bin/env node
'use strict'
// Fill (echo): decode tok/s with and without `fill: 'echo'` on the code-edit prompt (the reply
// copies most of a file) and on the parity prompts (prose: little to copy, so this is its
// overhead), greedy, for SmolLM2 f32 and its Q4_1 GGUF, with mlx-bun's defaults (k 8, maxSpan
// 32) and with shorter matches and spans (k 4, maxSpan 16); mlx-lm's `generate_step` on the same
// prompt ids and f32 weights (a fresh process, same libmlx and BLAS) is the peer. Outputs with
// and without fill are checked equal. Prints one table; asserts nothing else.
//
//   node scripts/bench-fill.js [--tokens 96] [--repeats 2]
const path = require('node:path')
const fs = require('node:fs')
const { execFileSync } = require('node:child_process')
const mlx = require('..')
const { arg, runtime, peerEnv } = require('./args')
const { EDIT } = require('./edit-prompt')

const ROOT = path.join(__dirname, '..')
const FIX = path.join(ROOT, 'fixtures')
const tokens = Number(arg('tokens', '96'))
const repeats = Number(arg('repeats', '2'))
const F32 = path.join(FIX, 'smollm2-f32')
const GGUF = path.join(FIX, 'home/models/SmolLM2-135M-Instruct.Q4_1.gguf')
const edit = Array.from(mlx.loadTokenizer(F32).encode(EDIT))
const prose = JSON.parse(fs.readFileSync(path.join(FIX, 'ref-f32.json'), 'utf8')).results.map((r) => r.prompt_ids)

const MLX_LM_SIDE = String.raw`
import json, sys, time
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
model, _ = load(sys.argv[1])
prompts, n, repeats = json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
greedy = lambda x: mx.argmax(x, axis=-1)
def run(p):
    count, t0 = 0, None
    for _ in generate_step(mx.array(p), model, max_tokens=n, sampler=greedy):
        count += 1
        if t0 is None:
            t0 = time.perf_counter()
    return (count - 1) / (time.perf_counter() - t0)
run(prompts[0])
print(json.dumps([max(run(p) for _ in range(repeats)) for p in prompts]))
`

/** Decode tok/s (best of the repeats) per prompt, the outputs, and the last run's fill stats. */
async function ours(dir, fill, prompts) {
  const model = await mlx.loadModel(dir)
  const engine = mlx.createEngine(model, { prefixCacheBytes: 0, fill })
  const once = async (p) => {
    const o = await engine.open({ promptTokens: p, maxTokens: tokens, eosTokenIds: [] }, { output: 'collect' }).result
    if (o.status !== 'completed') throw new Error(JSON.stringify(o.error))
    return o
  }
  await once(prompts[0])
  const rows = []
  for (const p of prompts) {
    let best = 0, last
    for (let i = 0; i < repeats; i++) {
      last = await once(p)
      const m = last.result.metrics
      best = Math.max(best, (m.generatedTokens - 1) / (m.decodeMs / 1e3))
    }
    rows.push({ tps: best, output: Array.from(last.output), fill: last.result.metrics.fill })
  }
  await engine.close()
  model.dispose()
  return rows
}

const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length

;(async () => {
  const theirs = JSON.parse(execFileSync(path.join(ROOT, '.venv/bin/python'), ['-c', MLX_LM_SIDE, F32, JSON.stringify([edit, ...prose]), String(tokens), String(repeats)], { encoding: 'utf8', env: peerEnv() }))
  const f = (x) => x.toFixed(2)
  console.log(`# fill (echo) — ${tokens} tokens, greedy, best of ${repeats}, ${runtime}`)
  console.log('| weights | prompt | mlx-lm tok/s | plain tok/s | echo tok/s (k 8, span 32) | × plain | echo tok/s (k 4, span 16) | × plain | × mlx-lm | tokens appended (k 8 / k 4) | same output |')
  console.log('|---|---|---|---|---|---|---|---|---|---|---|')
  for (const [name, dir] of [['smollm2-f32', F32], ['Q4_1 GGUF', GGUF]]) {
    for (const [label, prompts, peer] of [['code edit', [edit], theirs.slice(0, 1)], [`prose ×${prose.length}`, prose, theirs.slice(1)]]) {
      const plain = await ours(dir, 'off', prompts)
      const echo = await ours(dir, 'echo', prompts)
      const short = await ours(dir, { mode: 'echo', k: 4, maxSpan: 16 }, prompts)
      const same = [echo, short].every((runs) => plain.every((r, i) => JSON.stringify(r.output) === JSON.stringify(runs[i].output)))
      const p = mean(plain.map((r) => r.tps))
      const e = mean(echo.map((r) => r.tps))
      const s = mean(short.map((r) => r.tps))
      const appended = (runs) => runs.reduce((a, r) => a + r.fill.echo, 0)
      const lm = dir === F32 ? mean(peer) : null
      console.log(`| ${name} | ${label} | ${lm ? f(lm) : '—'} | ${f(p)} | ${f(e)} | ${f(e / p)}× | ${f(s)} | ${f(s / p)}× | ${lm ? f(s / lm) + '×' : '—'} | ${appended(echo)} / ${appended(short)} of ${prompts.length * tokens} | ${same ? 'yes' : 'NO'} |`)
    }
  }
})().catch((e) => {
  console.error(e)
  process.exit(1)
})
