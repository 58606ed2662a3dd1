#!/usr/bin/env node
// Session delivery benchmark (prints figures, asserts nothing). Run it with node or bun:
//
//   node scripts/bench-sessions.js [--tokens 200000] [--model DIR --prompt-tokens 8 --gen-tokens 16 --repeats 2]
//
// 1. Delivery cost: a scripted engine commits one token per engine step, so the time per token
//    is the session machinery (Rust) plus delivery into JavaScript. Collect mode has no per-token
//    JavaScript at all, so stream/callback minus collect is the cost JavaScript adds.
// 2. With --model: decode tok/s of `generate()` against the Rust loop (`mlx-bun bench`, the same
//    engine without JavaScript) on the same prompt, in the same run.
'use strict'
const { execFileSync } = require('node:child_process')
const path = require('node:path')
const mlx = require('..')

const { arg, runtime } = require('./args')
const N = Number(arg('tokens', 200000))

async function timeMode(output) {
  const engine = mlx.testing.createScriptedEngine({ steps: [{ commit: [7], repeat: N }] }, { maxCollectTokens: N })
  let seen = 0
  const t0 = process.hrtime.bigint()
  if (output === 'stream') {
    const s = engine.open({})
    for await (const e of s.events) seen += e.type === 'committed' ? e.tokenIds.length : 0
    await s.result
  } else if (output === 'callback') {
    const s = engine.open({}, { output, onTokens: (ids) => void (seen += ids.length) })
    await s.result
  } else {
    const o = await engine.open({}, { output }).result
    seen = o.output.length
  }
  const us = Number(process.hrtime.bigint() - t0) / 1e3
  await engine.close()
  if (seen !== N) throw new Error(`${output}: ${seen} tokens, expected ${N}`)
  return us / N
}

async function delivery() {
  const rows = []
  for (const mode of ['collect', 'stream', 'callback']) {
    await timeMode(mode) // warm-up
    const runs = [await timeMode(mode), await timeMode(mode), await timeMode(mode)].sort((a, b) => a - b)
    rows.push([mode, runs[1]])
  }
  const collect = rows[0][1]
  console.log(`\nDelivery, ${N} one-token commits, ${runtime} (median of 3)`)
  console.log('| mode | µs/token (total) | µs/token over collect |')
  console.log('|---|---|---|')
  for (const [mode, us] of rows) console.log(`| ${mode} | ${us.toFixed(3)} | ${(us - collect).toFixed(3)} |`)
}

async function decode(model) {
  const P = Number(arg('prompt-tokens', 8))
  const G = Number(arg('gen-tokens', 16))
  const R = Number(arg('repeats', 2))
  const bin = path.join(__dirname, '..', 'target', 'release', 'mlx-bun')
  const raw = JSON.parse(execFileSync(bin, ['bench', '--model', model, '--prompt-tokens', `${P}`, '--gen-tokens', `${G}`, '--repeats', `${R}`]).toString())
  const m = await mlx.loadModel(model)
  const vocab = m.config.vocabSize
  const prompt = Array.from({ length: P }, (_, i) => (i * 7919 + 13) % vocab)
  const run = async (maxTokens) => {
    const g = mlx.generate(m, prompt, { maxTokens, eosTokenIds: [] })
    for await (const _ of g);
    return g.stats.decodeTps
  }
  await run(8)
  const tps = []
  for (let i = 0; i < R; i++) tps.push(await run(G))
  tps.sort((a, b) => a - b)
  const js = tps[Math.floor(tps.length / 2)]
  const rust = raw.decode_tps.median
  console.log(`\nDecode, ${path.basename(model)}, prompt ${P}, ${G} tokens, median of ${R}, ${runtime}`)
  console.log('| path | decode tok/s |')
  console.log('|---|---|')
  console.log(`| Rust loop (mlx-bun bench) | ${rust.toFixed(3)} |`)
  console.log(`| generate() for await | ${js.toFixed(3)} |`)
  console.log(`| ratio generate() / Rust | ${(js / rust).toFixed(3)}× |`)
  m.dispose()
}

;(async () => {
  await delivery()
  const model = arg('model')
  if (model) await decode(model)
})().catch((e) => {
  console.error(e)
  process.exit(1)
})
