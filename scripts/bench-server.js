#!/usr/bin/env node
'use strict'
// Serving benchmark: `mlx-bun serve` against `mlx_lm.server` (mlx-lm 0.32.2, the same libmlx and
// BLAS) on the same model and machine, one after the other. Streams greedy chat completions from
// N concurrent clients (distinct prompts, so neither prompt cache helps) and prints aggregate
// tok/s and TTFT p50/p99 per concurrency, then the TTFT of turn 5 of a ~1 000-token conversation
// (each server's prompt cache), with ratios (mlx-bun / mlx-lm; TTFT ratios below 1 are better).
//
//   node scripts/bench-server.js [--model fixtures/smollm2-f32] [--clients 1,8,32] [--gen-tokens 32]
const { spawn } = require('node:child_process')
const path = require('node:path')
const { arg, runtime, peerEnv } = require('./args')

const ROOT = path.join(__dirname, '..')
const MODEL_ARG = arg('model', 'fixtures/smollm2-f32')
const MODEL = path.resolve(ROOT, MODEL_ARG)
const CLIENTS = arg('clients', '1,8,32').split(',').map(Number)
const GEN = Number(arg('gen-tokens', '32'))

function start(name, cmd, argv, env, ready) {
  const child = spawn(cmd, argv, { env, stdio: ['ignore', 'ignore', 'pipe'] })
  let log = ''
  return new Promise((resolve, reject) => {
    child.stderr.on('data', (d) => {
      log += d
      if (ready.test(log)) resolve(child)
    })
    child.on('exit', (code) => reject(new Error(`${name} exited with ${code}: ${log.slice(-2000)}`)))
  })
}

/** One streamed chat completion: TTFT (first content) and the tokens generated. */
async function ask(url, model, messages, maxTokens) {
  const t0 = performance.now()
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages, max_tokens: maxTokens, temperature: 0, stream: true, stream_options: { include_usage: true } }),
  })
  if (!r.ok) throw new Error(`${r.status}: ${await r.text()}`)
  let ttft = null
  let text = ''
  let tokens = 0
  let chunks = 0
  let rest = ''
  for await (const bytes of r.body) {
    rest += Buffer.from(bytes).toString('utf8')
    let i
    while ((i = rest.indexOf('\n\n')) >= 0) {
      const event = rest.slice(0, i)
      rest = rest.slice(i + 2)
      const data = event.split('\n').find((l) => l.startsWith('data: '))?.slice(6)
      if (!data || data === '[DONE]') continue
      const c = JSON.parse(data)
      if (c.usage) tokens = c.usage.completion_tokens
      const piece = c.choices?.[0]?.delta?.content
      if (piece) {
        ttft ??= performance.now() - t0
        text += piece
        chunks++
      }
    }
  }
  return { ttft, tokens: tokens || chunks, text }
}

const pct = (xs, p) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))]

async function measure(url, model) {
  const rows = {}
  await ask(url, model, [{ role: 'user', content: 'Warm up.' }], 4)
  for (const n of CLIENTS) {
    const t0 = performance.now()
    const runs = await Promise.all(
      Array.from({ length: n }, (_, i) => ask(url, model, [{ role: 'user', content: `Question ${n}-${i}: tell me one fact about the number ${i * 7 + n}.` }], GEN)),
    )
    const s = (performance.now() - t0) / 1000
    const ttfts = runs.map((r) => r.ttft)
    rows[n] = { tps: runs.reduce((a, r) => a + r.tokens, 0) / s, p50: pct(ttfts, 50), p99: pct(ttfts, 99) }
  }
  // A conversation of 5 turns; the history reaches ~1 000 tokens by turn 5.
  const filler = 'The history of the printing press begins in the fifteenth century, when movable type changed how books were made, sold and read across Europe. '
  const messages = [{ role: 'system', content: filler.repeat(20) }]
  let turn5 = null
  for (let t = 1; t <= 5; t++) {
    messages.push({ role: 'user', content: `Turn ${t}: summarise that in one sentence.` })
    const r = await ask(url, model, messages, 24)
    messages.push({ role: 'assistant', content: r.text })
    turn5 = r.ttft
  }
  rows.turn5 = turn5
  return rows
}

async function main() {
  const id = path.basename(MODEL)
  const ours = await start('mlx-bun serve', path.join(ROOT, 'target/release/mlx-bun'), ['serve', '--model', MODEL, '--port', '8431', '--log-format', 'off', '--batch', String(Math.max(...CLIENTS))], process.env, /serving/)
  let a
  try {
    a = await measure('http://127.0.0.1:8431', id)
  } finally {
    ours.kill('SIGTERM')
  }
  const py = path.join(ROOT, '.venv/bin/python')
  const theirs = await start('mlx_lm.server', py, ['-m', 'mlx_lm', 'server', '--model', MODEL, '--port', '8432', '--decode-concurrency', String(Math.max(...CLIENTS))], peerEnv(), /Starting httpd|Uvicorn running|127\.0\.0\.1:8432/)
  let b
  try {
    await new Promise((r) => setTimeout(r, 1000))
    b = await measure('http://127.0.0.1:8432', MODEL)
  } finally {
    theirs.kill('SIGTERM')
  }
  console.log(`model ${MODEL_ARG}, ${GEN} tokens per request, greedy, streamed; clients on ${runtime}`)
  console.log('clients | mlx-bun tok/s | mlx_lm.server tok/s | ratio | TTFT p50 ms (ours / theirs) | TTFT p99 ms (ours / theirs) | p99 ratio')
  for (const n of CLIENTS) {
    const x = a[n]
    const y = b[n]
    console.log(`${n} | ${x.tps.toFixed(1)} | ${y.tps.toFixed(1)} | ${(x.tps / y.tps).toFixed(2)}x | ${x.p50.toFixed(0)} / ${y.p50.toFixed(0)} | ${x.p99.toFixed(0)} / ${y.p99.toFixed(0)} | ${(x.p99 / y.p99).toFixed(2)}`)
  }
  console.log(`turn 5 TTFT ms: mlx-bun ${a.turn5.toFixed(0)}, mlx_lm.server ${b.turn5.toFixed(0)}, ratio ${(a.turn5 / b.turn5).toFixed(2)}`)
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
