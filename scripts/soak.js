'use strict'
// Soak run (not CI): mixed load on one process for a while, sampling its RSS and the sessions
// the engine still holds, to show that nothing leaks or hangs:
//   node --expose-gc scripts/soak.js [--minutes 60] [--model DIR] [--no-workers]
// Each round: engine sessions opened and read, cancelled, aborted, closed or dropped unread;
// generate() broken off; a worker thread that loads the addon and is terminated mid-generation;
// a child process that calls process.exit() mid-generation. Prints one line per sample and a
// summary (RSS first/last/max after warm-up, live sessions, failures). Asserts nothing itself.
const path = require('node:path')
const { spawn } = require('node:child_process')
const { Worker } = require('node:worker_threads')
const mlx = require('..')
const { makeTinyLlama, tmpdir } = require('../__test__/helpers')

const arg = (name, fallback) => {
  const i = process.argv.indexOf(`--${name}`)
  return i >= 0 ? process.argv[i + 1] : fallback
}
const minutes = Number(arg('minutes', '60'))
// Worker threads terminated mid-generation corrupt the heap while the main thread holds a model
// (a known bug, see the README's reliability notes); --no-workers soaks everything else.
const workers = !process.argv.includes('--no-workers')
const dir = arg('model', null) ?? makeTinyLlama(path.join(tmpdir('soak'), 'tiny'))
const ROOT = path.join(__dirname, '..')

const rand = (n) => Math.floor(Math.random() * n)
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// Which kind of round opened each engine session, so a session that never ends can be traced
// back (sessions of generate() and of workers are not listed: the rest of the live ones).
const CASES = ['read', 'cancel', 'generate aborted', 'generate broken off', 'dropped unread']
const opened = new Map()

async function sessions(engine, model) {
  const prompt = Array.from({ length: 1 + rand(40) }, () => 1 + rand(200))
  const collect = rand(3) === 0
  const s = engine.open({ promptTokens: prompt, maxTokens: 4 + rand(60), eosTokenIds: [] }, collect ? { output: 'collect' } : {})
  const kind = rand(5)
  opened.set(s.id, `${CASES[kind]}${collect ? ' (collect)' : ''}`)
  switch (kind) {
    case 0: // read to the end (stream) or wait for the result (collect)
      try {
        for await (const _ of s.events);
      } catch {
        /* collect sessions have no events */
      }
      return s.result
    case 1:
      await sleep(rand(20))
      return s.cancel('requested')
    case 2: {
      const ac = new AbortController()
      const g = mlx.generate(model, prompt, { maxTokens: 1e6, eosTokenIds: [], signal: ac.signal })
      setTimeout(() => ac.abort(), rand(30))
      for await (const _ of g);
      return s.close()
    }
    case 3: {
      let n = 0
      for await (const _ of mlx.generate(model, prompt, { maxTokens: 1e6, eosTokenIds: [] })) if (++n > rand(10)) break
      return s.close()
    }
    default: // dropped unread: collected and closed by the engine
      return undefined
  }
}

function workerRound() {
  return new Promise((resolve) => {
    const w = new Worker(path.join(ROOT, '__test__', 'worker-child.js'), { workerData: { dir, prompt: [1, 2, 3], maxTokens: 3, mode: 'midway' } })
    w.once('message', () => w.terminate().then(resolve))
    w.once('error', resolve)
  })
}

function childRound() {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [path.join(ROOT, '__test__', 'exit-child.js'), 'exit', dir], { stdio: 'ignore' })
    p.on('exit', (code, signal) => resolve({ code, signal }))
  })
}

/** Prints each session still alive between rounds (all engines of past rounds are closed). */
function reportLive() {
  const { sessions, lost } = mlx.testing.liveSessionStates()
  for (const st of sessions) console.log(`  live ${JSON.stringify({ ...st, opener: opened.get(st.id) ?? 'generate() or a worker' })}`)
  if (lost > 0) console.log(`  ${lost} counted live but referenced by nothing`)
}

async function main() {
  const model = await mlx.loadModel(dir)
  const started = Date.now()
  const samples = []
  let rounds = 0
  let failures = 0
  let childCrashes = 0
  let next = started
  while (Date.now() - started < minutes * 60e3) {
    const engine = mlx.createEngine(model, { maxActive: 4, maxQueued: 16 })
    const work = Array.from({ length: 6 }, () => sessions(engine, model).catch(() => failures++))
    if (workers) work.push(workerRound())
    if (rounds % 5 === 0) work.push(childRound().then((r) => r.code !== 3 && childCrashes++))
    await Promise.all(work)
    await engine.close()
    rounds++
    // Keep the openers of the sessions still alive only.
    const live = new Set(mlx.testing.liveSessionStates().sessions.map((st) => st.id))
    for (const id of opened.keys()) if (!live.has(id)) opened.delete(id)
    if (global.gc) global.gc()
    if (Date.now() >= next) {
      const s = { minute: (Date.now() - started) / 60e3, rssMb: process.memoryUsage().rss / 2 ** 20, live: mlx.testing.liveSessions(), rounds }
      samples.push(s)
      console.log(`${s.minute.toFixed(1)} min  rss ${s.rssMb.toFixed(0)} MB  live sessions ${s.live}  rounds ${rounds}  failures ${failures}  child crashes ${childCrashes}`)
      if (s.live > 0) reportLive()
      next += 60e3
    }
  }
  model.dispose()
  const warm = samples.slice(Math.min(2, samples.length - 1))
  const rss = warm.map((s) => s.rssMb)
  console.log(JSON.stringify({ minutes, rounds, failures, childCrashes, rssFirstMb: Math.round(rss[0]), rssLastMb: Math.round(rss.at(-1)), rssMaxMb: Math.round(Math.max(...rss)), liveSessionsAtEnd: mlx.testing.liveSessions() }))
}
main()
