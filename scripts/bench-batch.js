#!/usr/bin/env node
// Continuous batching benchmark (prints figures, asserts nothing):
//
//   node scripts/bench-batch.js [--model fixtures/smollm2-bf16] [--prompt-tokens 16] [--gen-tokens 32] [--streams 1,2,4,8]
//                               [--f32-matmuls auto|all|int8|none]   (the loadModel option; mlx-lm computes as stored)
//
// Aggregate throughput = generated tokens / wall time from submitting every request to the last
// token, for 1, 2, 4 and 8 concurrent streams (EOS does not stop generation), beside the same
// workload through mlx-lm's batch_generate (scripts/bench_batch_mlx_lm.py, same machine, libmlx
// and BLAS). Then the time to first token of a request that arrives while 7 streams decode.
'use strict'
const { execFileSync } = require('node:child_process')
const path = require('node:path')
const mlx = require('..')

const { arg, runtime, peerEnv } = require('./args')
const ROOT = path.join(__dirname, '..')
const model = arg('model', path.join(ROOT, 'fixtures', 'smollm2-bf16'))
const P = Number(arg('prompt-tokens', 16))
const G = Number(arg('gen-tokens', 32))
const streams = arg('streams', '1,2,4,8').split(',').map(Number)
const f32Matmuls = arg('f32-matmuls', 'auto')

const prompt = (s, vocab) => Array.from({ length: P }, (_, i) => (i * 7919 + 13 + 101 * s) % vocab)

async function ours() {
  const m = await mlx.loadModel(model, { f32Matmuls })
  const vocab = m.config.vocabSize
  const engine = mlx.createEngine(m, { maxActive: Math.max(...streams), prefixCacheBytes: 0 })
  const run = (n, maxTokens) =>
    Promise.all(Array.from({ length: n }, (_, s) => engine.open({ promptTokens: prompt(s, vocab), maxTokens, eosTokenIds: [] }, { output: 'collect' }).result))
  await run(2, 4) // warm-up
  const rows = []
  for (const n of streams) {
    const t0 = performance.now()
    const outs = await run(n, G)
    const seconds = (performance.now() - t0) / 1e3
    const tokens = outs.reduce((a, o) => a + o.committedTokens, 0)
    rows.push({ streams: n, tokens, seconds, tok_s: tokens / seconds })
  }
  // TTFT of a newcomer while 7 streams decode (in steady state: it arrives 300 ms after they all
  // produced a token); median of 3.
  const busyTtfts = []
  for (let trial = 0; trial < 3; trial++) {
    const busy = Array.from({ length: 7 }, (_, s) => engine.open({ promptTokens: prompt(s, vocab), maxTokens: 4 * G, eosTokenIds: [] }))
    const iterators = busy.map((s) => s.events[Symbol.asyncIterator]())
    for (const it of iterators) for (let e = await it.next(); !e.done && e.value.type !== 'committed'; e = await it.next());
    const drain = iterators.map(async (it) => { while (!(await it.next()).done); })
    await new Promise((resolve) => setTimeout(resolve, 300))
    const t0 = performance.now()
    const late = engine.open({ promptTokens: prompt(9, vocab), maxTokens: 2, eosTokenIds: [] })
    for await (const e of late.events) if (e.type === 'committed') break
    busyTtfts.push(performance.now() - t0)
    await Promise.all(busy.map((s) => s.close()))
    await Promise.all(drain)
  }
  const ttftBusy = busyTtfts.sort((a, b) => a - b)[1]
  const t1 = performance.now()
  const alone = engine.open({ promptTokens: prompt(9, vocab), maxTokens: 2, eosTokenIds: [] })
  for await (const e of alone.events) if (e.type === 'committed') break
  const ttftIdle = performance.now() - t1
  await engine.close()
  m.dispose()
  return { rows, ttftBusy, ttftIdle }
}

function theirs() {
  const py = path.join(ROOT, '.venv', 'bin', 'python')
  const out = execFileSync(py, [path.join(__dirname, 'bench_batch_mlx_lm.py'), model, `${P}`, `${G}`, ...streams.map(String)], { env: peerEnv() })
  return out.toString().trim().split('\n').map((l) => JSON.parse(l))
}

;(async () => {
  const { rows, ttftBusy, ttftIdle } = await ours()
  const ref = theirs()
  const single = rows[0].tok_s
  console.log(`\n${path.basename(model)}, prompt ${P}, ${G} tokens per stream, f32Matmuls ${f32Matmuls}, ${runtime}`)
  console.log('| streams | mlx-bun tok/s | × single stream | mlx-lm batch_generate tok/s | mlx-bun / mlx-lm |')
  console.log('|---|---|---|---|---|')
  for (const r of rows) {
    const t = ref.find((x) => x.streams === r.streams)
    console.log(`| ${r.streams} | ${r.tok_s.toFixed(2)} | ${(r.tok_s / single).toFixed(2)}× | ${t.tok_s.toFixed(2)} | ${(r.tok_s / t.tok_s).toFixed(2)}× |`)
  }
  console.log(`\nTTFT of a request arriving while 7 streams decode: ${ttftBusy.toFixed(0)} ms (alone: ${ttftIdle.toFixed(0)} ms)`)
})().catch((e) => {
  console.error(e)
  process.exit(1)
})
