#!/usr/bin/env node
'use strict'
// Time to first token with the prefix cache: a history of H tokens is already cached, the request
// adds a new turn of 32 tokens. Cold = the whole prompt prefilled; hit = only the new turn.
// mlx-lm's side does what its server's prompt cache does: the cache left by the history, then
// generate_step over the new tokens (mlx_lm.models.cache.make_prompt_cache), in a fresh process on
// the same libmlx and BLAS. Prints one table; asserts nothing.
//
// Then eight sessions opened together with a 600-token common prefix, with the prefix cache (the
// later ones start from the first one's caches) and without.
//
//   node scripts/bench-prefix.js [--model fixtures/smollm2-f32] [--histories 256,1000,4000] [--repeats 3]
const path = require('node:path')
const { execFileSync } = require('node:child_process')
const mlx = require('..')
const { arg, runtime, peerEnv } = require('./args')

const ROOT = path.join(__dirname, '..')
const modelDir = path.resolve(arg('model', path.join(ROOT, 'fixtures/smollm2-f32')))
const histories = arg('histories', '256,1000,4000').split(',').map(Number)
const repeats = Number(arg('repeats', '3'))
const TURN = 32

const MLX_LM_SIDE = String.raw`
import json, sys, time
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
model_path, histories, turn, repeats = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model, tok = load(model_path)
vocab = model.args.vocab_size
ids = lambda n, salt: [(i * 7919 + 13 + salt) % vocab for i in range(n)]
greedy = lambda x: mx.argmax(x, axis=-1)
def ttft(tokens, cache):
    t0 = time.perf_counter()
    for _ in generate_step(mx.array(tokens), model, max_tokens=1, sampler=greedy, prompt_cache=cache):
        return time.perf_counter() - t0
out = {}
ttft(ids(64, 1), make_prompt_cache(model))
for h in histories:
    cold, hit = [], []
    for r in range(repeats):
        history, new = ids(h, 0), ids(turn, 100 + r)
        cold.append(ttft(history + new, make_prompt_cache(model)))
        cache = make_prompt_cache(model)
        ttft(history, cache)
        hit.append(ttft(new, cache))
    out[h] = {"cold": sorted(cold)[len(cold) // 2] * 1e3, "hit": sorted(hit)[len(hit) // 2] * 1e3}
print(json.dumps(out))
`

const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]

async function ours(model, vocab) {
  const ids = (n, salt) => Array.from({ length: n }, (_, i) => (i * 7919 + 13 + salt) % vocab)
  const cold = mlx.createEngine(model, { prefixCacheBytes: 0 })
  const ttft = async (engine, tokens, cachedTokens) => {
    const o = await engine.open({ promptTokens: tokens, maxTokens: 1 }, { output: 'collect' }).result
    if (o.status !== 'completed') throw new Error(JSON.stringify(o.error))
    if (cachedTokens !== undefined && o.result.metrics.cachedTokens !== cachedTokens) {
      throw new Error(`expected ${cachedTokens} cached tokens, got ${o.result.metrics.cachedTokens}`)
    }
    return o.result.metrics.prefillMs
  }
  await ttft(cold, ids(64, 1))
  const out = {}
  for (const h of histories) {
    const c = [], hit = []
    for (let r = 0; r < repeats; r++) {
      const history = ids(h, 0), turn = ids(TURN, 100 + r)
      c.push(await ttft(cold, [...history, ...turn]))
      const engine = mlx.createEngine(model)
      await ttft(engine, history)
      hit.push(await ttft(engine, [...history, ...turn], h))
      await engine.close()
    }
    out[h] = { cold: median(c), hit: median(hit) }
  }
  await cold.close()
  return out
}

/** Wall time of eight sessions sharing a 600-token prefix, opened together. */
async function shared(model, vocab, prefixCacheBytes) {
  const engine = mlx.createEngine(model, { maxActive: 8, prefixCacheBytes })
  const common = Array.from({ length: 600 }, (_, i) => (i * 31 + 7) % vocab)
  const t = performance.now()
  await Promise.all(
    Array.from({ length: 8 }, (_, i) => engine.open({ promptTokens: [...common, 100 + i, 200 + i, 300 + i], maxTokens: 12 }, { output: 'collect' }).result),
  )
  const ms = performance.now() - t
  await engine.close()
  return ms
}

;(async () => {
  const model = await mlx.loadModel(modelDir)
  const mine = await ours(model, model.config.vocabSize)
  const together = [await shared(model, model.config.vocabSize, 2e9), await shared(model, model.config.vocabSize, 0)]
  model.dispose()
  const py = path.join(ROOT, '.venv/bin/python')
  const theirs = JSON.parse(execFileSync(py, ['-c', MLX_LM_SIDE, modelDir, JSON.stringify(histories), String(TURN), String(repeats)], { encoding: 'utf8', env: peerEnv() }))
  const f = (x) => x.toFixed(0).padStart(7)
  console.log(`${runtime}, model ${modelDir}, new turn ${TURN} tokens, median of ${repeats}; TTFT in ms`)
  console.log('history | mlx-bun cold | mlx-bun hit | hit/cold | mlx-lm cold | mlx-lm hit | hit/cold | hit: mlx-bun/mlx-lm')
  for (const h of histories) {
    const a = mine[h], b = theirs[h]
    console.log(`${String(h).padStart(7)} | ${f(a.cold)} | ${f(a.hit)} | ${(a.hit / a.cold).toFixed(3)} | ${f(b.cold)} | ${f(b.hit)} | ${(b.hit / b.cold).toFixed(3)} | ${(a.hit / b.hit).toFixed(2)}×`)
  }
  console.log(`8 sessions, 600-token common prefix: ${f(together[0])} ms shared, ${f(together[1])} ms without the cache (${(together[1] / together[0]).toFixed(2)}×)`)
})().catch((e) => {
  console.error(e)
  process.exit(1)
})
