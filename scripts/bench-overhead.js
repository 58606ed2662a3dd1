#!/usr/bin/env node
'use strict'
// Per-token engine cost at high token rates (issue 22 item 6): a tiny random model (2 layers,
// hidden 64, vocabulary 256) decodes ~1 000 tokens/s on the CPU, so what each token costs outside
// MLX's kernels — graph building, scheduling, delivery into JavaScript — is visible here as it
// would be on Metal. Greedy, end-of-sequence ignored, 16-token prompt. Prints tokens/s and µs per
// token for mlx-lm's generate_step (the same libmlx and BLAS), `mlx-bun bench` (Rust only), and
// the addon read through generate()'s iterator and through an engine session's events.
// Asserts nothing.
//
//   node scripts/bench-overhead.js [--model fixtures/tiny/llama] [--tokens 2000] [--repeats 3]
const path = require('node:path')
const { execFileSync } = require('node:child_process')
const mlx = require('..')
const { arg, runtime, peerEnv } = require('./args')

const ROOT = path.join(__dirname, '..')
const model = path.resolve(arg('model', path.join(ROOT, 'fixtures/tiny/llama')))
const tokens = Number(arg('tokens', '2000'))
const repeats = Number(arg('repeats', '3'))
const prompt = Array.from({ length: 16 }, (_, i) => (i * 7919 + 13) % 256)

const MLX_LM_SIDE = String.raw`
import json, sys, time
from pathlib import Path
import mlx.core as mx
from mlx_lm.utils import load_model
from mlx_lm.generate import generate_step
model, _ = load_model(Path(sys.argv[1]))
n, repeats, prompt = int(sys.argv[2]), int(sys.argv[3]), mx.array(json.loads(sys.argv[4]))
def run(n):
    first, count = None, 0
    for _ in generate_step(prompt, model, max_tokens=n, sampler=lambda x: mx.argmax(x, axis=-1)):
        count += 1
        if first is None:
            first = time.perf_counter()
    return (count - 1) / (time.perf_counter() - first)
run(32)
print(json.dumps([run(n) for _ in range(repeats)]))
`

const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]

/** Tokens per second after the first token, of `repeats` runs after a warm-up. */
async function timed(run) {
  await run(32)
  const out = []
  for (let i = 0; i < repeats; i++) {
    let first, count = 0
    await run(tokens, (n) => {
      first ??= performance.now()
      count += n
    })
    out.push((count - 1) / ((performance.now() - first) / 1e3))
  }
  return out
}

;(async () => {
  const theirs = JSON.parse(execFileSync(path.join(ROOT, '.venv/bin/python'), ['-c', MLX_LM_SIDE, model, String(tokens), String(repeats), JSON.stringify(prompt)], { encoding: 'utf8', env: peerEnv() }))
  const cli = JSON.parse(execFileSync(path.join(ROOT, 'target/release/mlx-bun'), ['bench', '--model', model, '--prompt-tokens', '16', '--gen-tokens', String(tokens), '--repeats', String(repeats)], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }))
  const m = await mlx.loadModel(model)
  const gen = await timed(async (n, got = () => {}) => {
    for await (const _ of mlx.generate(m, prompt, { maxTokens: n, eosTokenIds: [] })) got(1)
  })
  const engine = mlx.createEngine(m)
  const events = await timed(async (n, got = () => {}) => {
    for await (const e of engine.open({ promptTokens: prompt, maxTokens: n, eosTokenIds: [] }).events) if (e.type === 'committed') got(e.tokenIds.length)
  })
  await engine.close()
  m.dispose()
  const base = median(theirs)
  console.log(`${runtime}, ${model}, ${tokens} tokens, median of ${repeats}`)
  console.log('path | tok/s | µs per token | µs per token beyond mlx-lm')
  for (const [name, tps] of [['mlx-lm generate_step', base], ['mlx-bun bench (Rust)', cli.decode_tps.median], ['generate() for await', median(gen)], ['engine session events', median(events)]]) {
    console.log(`${name} | ${tps.toFixed(0)} | ${(1e6 / tps).toFixed(0)} | ${(1e6 / tps - 1e6 / base).toFixed(0)}`)
  }
})().catch((e) => {
  console.error(e)
  process.exit(1)
})
