'use strict'
// `mlx-bun serve` under load on real SmolLM2 (f32): 64 concurrent streaming clients, a quarter
// of them leaving at random points of a long answer. Every client that stays gets exactly its answer alone
// (greedy), the server ends with no live session, its memory returns to where the warm server
// stood, and it goes on serving.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const { spawn } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

const { default: OpenAI, APIUserAbortError } = require('openai')
const mlx = require('..')
const { ROOT, fixture, rng } = require('./helpers')

const MODEL = 'smollm2-f32'
const CLIENTS = 64
const MAX_TOKENS = 6
const QUESTIONS = ['Name a fruit.', 'What is 2+2?', 'Say hello.', 'Name a planet.'].map((q) => [{ role: 'user', content: q }])
// What the leaving clients ask: a long answer, so they leave while it runs.
const STORY = [{ role: 'user', content: 'Write a long story about a dragon who learns to read.' }]

const rssBytes = (pid) => Number(/VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) * 1024

test('64 streaming clients, a quarter leaving mid-answer', async () => {
  const bin = path.join(ROOT, 'target', 'release', 'mlx-bun')
  const child = spawn(bin, ['serve', '--model', fixture(MODEL), '--port', '0', '--log-format', 'off'], { stdio: ['ignore', 'ignore', 'pipe'] })
  const url = await new Promise((resolve, reject) => {
    let log = ''
    child.stderr.on('data', (d) => {
      log += d
      const m = /serving \S+ on (http:\S+)/.exec(log)
      if (m) resolve(m[1])
    })
    child.on('exit', (code) => reject(new Error(`mlx-bun serve exited with ${code}: ${log}`)))
  })
  try {
    const openai = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 })
    const model = await mlx.loadModel(fixture(MODEL))
    const tok = mlx.loadTokenizer(fixture(MODEL))
    const template = mlx.ChatTemplate.load(fixture(MODEL))
    const wants = []
    for (const q of QUESTIONS) {
      const ids = []
      for await (const t of mlx.generate(model, tok.encode(template.render(q), false), { maxTokens: MAX_TOKENS, temperature: 0 })) ids.push(t.token)
      wants.push(tok.decode(ids))
    }
    model.dispose()

    /** Client i streams its question; a leaving one aborts after `leaveAfter` chunks. */
    async function client(i, leaveAfter) {
      const ac = new AbortController()
      let text = ''
      let chunks = 0
      try {
        const stream = await openai.chat.completions.create(
          leaveAfter === null
            ? { model: MODEL, messages: QUESTIONS[i % QUESTIONS.length], max_tokens: MAX_TOKENS, temperature: 0, stream: true }
            : { model: MODEL, messages: STORY, max_tokens: 400, temperature: 0, stream: true },
          { signal: ac.signal },
        )
        for await (const c of stream) {
          text += c.choices[0]?.delta?.content ?? ''
          if (leaveAfter !== null && ++chunks > leaveAfter) {
            ac.abort() // the client's iteration ends here, with or without an error
            return
          }
        }
      } catch (e) {
        if (!(leaveAfter !== null && e instanceof APIUserAbortError)) throw e
        return
      }
      assert.equal(leaveAfter, null, `client ${i} was to leave after ${leaveAfter} chunks; got ${chunks}: ${JSON.stringify(text)}`)
      assert.equal(text, wants[i % QUESTIONS.length], `client ${i}`)
    }
    const round = (leaving) => Promise.all(Array.from({ length: CLIENTS }, (_, i) => client(i, leaving.get(i) ?? null)))
    const idle = async () => {
      for (let i = 0; i < 100; i++) {
        const s = await (await fetch(`${url}/stats`)).json()
        // Idle: its work's freed memory handed back, which is what the RSS checks below measure.
        if (s.live_sessions === 0 && s.running === 0 && s.idle) return
        await new Promise((r) => setTimeout(r, 100))
      }
      assert.fail('sessions still live 10 s after the round')
    }

    await round(new Map()) // warms the server: every client stays
    await idle()
    const warm = rssBytes(child.pid)
    const random = rng(7)
    const leaving = new Map()
    while (leaving.size < CLIENTS / 4) leaving.set(Math.floor(random() * CLIENTS), Math.floor(random() * 4))
    await round(leaving)
    await idle()
    const after = rssBytes(child.pid)
    assert.ok(after <= warm * 1.05, `RSS ${(after / 1e6).toFixed(1)} MB after the round, ${(warm / 1e6).toFixed(1)} MB warm`)
    await client(0, null) // still serving
  } finally {
    child.kill('SIGTERM')
    await new Promise((r) => child.on('exit', r))
  }
})
