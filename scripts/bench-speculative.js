#!/usr/bin/env node
'use strict'
// Speculative decoding: decode tok/s of the target alone and with a draft, here and in mlx-lm
// (`generate_step` and `speculative_generate_step`, in a fresh process on the same libmlx and
// BLAS), greedy, on the prompts of the parity fixtures. Drafts: the MLX 4-bit requantization of
// the target (both engines can load it) and, here only, the Q4_1 GGUF the target was made from
// (mlx-lm cannot load a GGUF as a model). Prints one table; asserts nothing.
//
//   node scripts/bench-speculative.js [--tokens 32] [--draft-tokens 3]
const path = require('node:path')
const fs = require('node:fs')
const { execFileSync } = require('node:child_process')
const mlx = require('..')
const { arg, runtime, peerEnv } = require('./args')

const ROOT = path.join(__dirname, '..')
const FIX = path.join(ROOT, 'fixtures')
const tokens = Number(arg('tokens', '32'))
const k = Number(arg('draft-tokens', '3'))
const TARGET = path.join(FIX, 'smollm2-f32')
const Q4 = path.join(FIX, 'smollm2-q4')
const GGUF = path.join(FIX, 'home/models/SmolLM2-135M-Instruct.Q4_1.gguf')
const prompts = JSON.parse(fs.readFileSync(path.join(FIX, 'ref-f32.json'), 'utf8')).results.map((r) => r.prompt_ids)

const MLX_LM_SIDE = String.raw`
import json, sys, time
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step, speculative_generate_step
target, _ = load(sys.argv[1])
draft, _ = load(sys.argv[2])
prompts, n, k = json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
greedy = lambda x: mx.argmax(x, axis=-1)
def run(spec):
    total, t = 0, 0.0
    for p in prompts:
        gen = speculative_generate_step(mx.array(p), target, draft, num_draft_tokens=k, max_tokens=n, sampler=greedy) if spec \
            else generate_step(mx.array(p), target, max_tokens=n, sampler=greedy)
        count, t0 = 0, None
        for _ in gen:
            count += 1
            if t0 is None:
                t0 = time.perf_counter()
        t += time.perf_counter() - t0
        total += count - 1
    return total / t
run(False)
print(json.dumps({"plain": run(False), "draft": run(True)}))
`

async function ours(draftDir) {
  const target = await mlx.loadModel(TARGET)
  const draft = draftDir && (await mlx.loadModel(draftDir))
  const engine = mlx.createEngine(target, { prefixCacheBytes: 0 })
  let decoded = 0, seconds = 0, drafted = 0, accepted = 0
  const once = async (p) => {
    const o = await engine.open({ promptTokens: p, maxTokens: tokens, eosTokenIds: [], ...(draft ? { draftModel: draft, numDraftTokens: k } : {}) }, { output: 'collect' }).result
    if (o.status !== 'completed') throw new Error(JSON.stringify(o.error))
    return o.result.metrics
  }
  await once(prompts[0])
  for (const p of prompts) {
    const m = await once(p)
    decoded += m.generatedTokens - 1
    seconds += m.decodeMs / 1e3
    drafted += m.draftTokens
    accepted += m.acceptedDraftTokens
  }
  await engine.close()
  target.dispose()
  draft?.dispose()
  return { tps: decoded / seconds, acceptance: drafted ? accepted / drafted : null }
}

;(async () => {
  const plain = await ours(null)
  const q4 = await ours(Q4)
  const gguf = await ours(GGUF)
  const theirs = JSON.parse(execFileSync(path.join(ROOT, '.venv/bin/python'), ['-c', MLX_LM_SIDE, TARGET, Q4, JSON.stringify(prompts), String(tokens), String(k)], { encoding: 'utf8', env: peerEnv() }))
  const f = (x) => x.toFixed(2)
  console.log(`# speculative decoding — target smollm2-f32, ${tokens} tokens × ${prompts.length} prompts, greedy, k = ${k}, ${runtime}`)
  console.log('| engine | draft | decode tok/s | vs its plain | acceptance |')
  console.log('|---|---|---|---|---|')
  console.log(`| mlx-bun | none | ${f(plain.tps)} | 1.00× | — |`)
  console.log(`| mlx-bun | smollm2-q4 (MLX 4-bit) | ${f(q4.tps)} | ${f(q4.tps / plain.tps)}× | ${(q4.acceptance * 100).toFixed(0)} % |`)
  console.log(`| mlx-bun | Q4_1 GGUF | ${f(gguf.tps)} | ${f(gguf.tps / plain.tps)}× | ${(gguf.acceptance * 100).toFixed(0)} % |`)
  console.log(`| mlx-lm | none | ${f(theirs.plain)} | 1.00× | — |`)
  console.log(`| mlx-lm | smollm2-q4 (MLX 4-bit) | ${f(theirs.draft)} | ${f(theirs.draft / theirs.plain)}× | — |`)
  console.log(`mlx-bun / mlx-lm with the same draft: ${f(q4.tps / theirs.draft)}×; plain: ${f(plain.tps / theirs.plain)}×`)
})().catch((e) => {
  console.error(e)
  process.exit(1)
})
