'use strict'
// createServer in the addon (the HTTP server of server.test.js, started from JavaScript, run under
// Node and Bun): sampling defaults and generation_config.json, CORS, keys, admission, limits, close.
const { test, describe } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')

const { default: Anthropic } = require('@anthropic-ai/sdk')
const mlx = require('..')
const { fixture, tmpdir, post } = require('./helpers')

const MODEL = 'smollm2-f32'
const QUESTION = [{ role: 'user', content: 'What is the capital of France?' }]

describe('createServer in the addon', () => {
  test("sampling precedence: the request, then the server's default, then generation_config.json", async () => {
    const dir = tmpdir('gen-config')
    for (const f of fs.readdirSync(fixture(MODEL))) fs.symlinkSync(path.join(fixture(MODEL), f), path.join(dir, f))
    fs.writeFileSync(path.join(dir, 'generation_config.json'), JSON.stringify({ temperature: 0 }))
    const model = await mlx.loadModel(fixture(MODEL))
    const tok = mlx.loadTokenizer(fixture(MODEL))
    const ids = []
    for await (const t of mlx.generate(model, tok.encode(mlx.ChatTemplate.load(fixture(MODEL)).render(QUESTION), false), { maxTokens: 8, temperature: 0 })) ids.push(t.token)
    model.dispose()
    const greedy = tok.decode(ids)
    const ask = async (server, extra = {}) => (await post(`${server.url}/v1/chat/completions`, { model: MODEL, messages: QUESTION, max_tokens: 8, ...extra })).json.choices[0].message.content
    const byConfig = mlx.createServer(mlx.loadContext(dir, MODEL), 0, { log: 'off' })
    const byFlag = mlx.createServer(mlx.loadContext(fixture(MODEL)), 0, { log: 'off', defaultTemperature: 0 })
    const hot = mlx.createServer(mlx.loadContext(dir, MODEL), 0, { log: 'off', defaultTemperature: 2, defaultTopK: 50 })
    try {
      assert.equal(await ask(byConfig), greedy, 'generation_config.json: temperature 0')
      assert.equal(await ask(byFlag), greedy, 'the server default: temperature 0')
      assert.equal(await ask(hot, { temperature: 0 }), greedy, 'the request wins over the server default')
      const [a, b] = [await ask(hot, { seed: 3 }), await ask(hot, { seed: 3 })]
      assert.equal(a, b, 'the same seed samples the same tokens')
      assert.notEqual(a, greedy, 'the server default (temperature 2) wins over generation_config.json')
    } finally {
      await Promise.all([byConfig.close(), byFlag.close(), hot.close()])
    }
  })

  test('CORS only for the origins listed', async () => {
    const ctx = mlx.loadContext(fixture(MODEL))
    const open = mlx.createServer(ctx, 0, { log: 'off', corsOrigins: ['http://app.local'] })
    const closed = mlx.createServer(ctx, 0, { log: 'off' })
    const preflight = (s, origin) =>
      fetch(`${s.url}/v1/chat/completions`, { method: 'OPTIONS', headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'content-type,anthropic-version' } })
    try {
      const ok = await preflight(open, 'http://app.local')
      assert.equal(ok.headers.get('access-control-allow-origin'), 'http://app.local')
      assert.match(ok.headers.get('access-control-allow-headers'), /\*|anthropic-version/)
      assert.equal((await preflight(open, 'http://evil.example')).headers.get('access-control-allow-origin'), null)
      assert.equal((await preflight(closed, 'http://app.local')).headers.get('access-control-allow-origin'), null)
    } finally {
      await Promise.all([open.close(), closed.close()])
    }
  })

  test('keys, admission, body limit and close', async () => {
    const ctx = mlx.loadContext(fixture(MODEL), 'smol')
    await ctx.ready
    assert.equal(ctx.id, 'smol')
    const s = mlx.createServer(ctx, 0, { apiKey: 'sekret', batch: 1, maxQueued: 0, bodyLimit: 4096, log: 'off', shutdownGraceMs: 200 })
    assert.match(s.url, /^http:\/\/127\.0\.0\.1:\d+$/)
    const body = { model: 'smol', messages: QUESTION, max_tokens: 2, temperature: 0 }
    const chat = `${s.url}/v1/chat/completions`
    const denied = await post(chat, body)
    assert.equal(denied.status, 401)
    assert.equal(denied.json.error.type, 'invalid_api_key')
    assert.equal((await post(chat, body, { authorization: 'Bearer wrong' })).status, 401)
    assert.equal((await fetch(`${s.url}/health`)).status, 200, '/health needs no key')
    assert.equal((await post(chat, body, { authorization: 'Bearer sekret' })).status, 200)
    const a = new Anthropic({ baseURL: s.url, apiKey: 'sekret' }) // sends x-api-key
    assert.equal((await a.messages.create({ model: 'smol', max_tokens: 2, messages: QUESTION })).type, 'message')
    const big = await post(chat, { ...body, messages: [{ role: 'user', content: 'x'.repeat(5000) }] }, { authorization: 'Bearer sekret' })
    assert.equal(big.status, 413)
    // One slot and no queue: a second request while one runs is told to come back later. The
    // running request streams 500 tokens with the end-of-sequence token banned, and the second
    // is sent once its first token arrived, so neither depends on how fast this CPU decodes.
    const auth = { authorization: 'Bearer sekret' }
    const endless = { ...body, max_tokens: 500, stream: true, logit_bias: { 0: -100, 1: -100, 2: -100 } }
    const stream = await fetch(chat, { method: 'POST', headers: auth, body: JSON.stringify(endless) })
    assert.equal(stream.status, 200)
    const reader = stream.body.getReader()
    let text = ''
    while (!text.includes('"content"')) {
      const { value, done } = await reader.read()
      assert.ok(!done, 'the stream runs until close()')
      text += Buffer.from(value).toString()
    }
    const refused = await post(chat, body, auth)
    assert.equal(refused.status, 429)
    assert.equal(refused.headers.get('retry-after'), '1')
    // close() cancels what is still running after the grace period and frees the port.
    const inflight = (async () => {
      for (;;) {
        const { value, done } = await reader.read()
        if (done) return text
        text += Buffer.from(value).toString()
      }
    })()
    const t0 = Date.now()
    await s.close()
    assert.ok(Date.now() - t0 < 5000, 'close is bounded')
    assert.match(await inflight, /data: \{"error"/)
    await assert.rejects(fetch(`${s.url}/health`))
    assert.throws(() => mlx.createServer(ctx, 0, { kvQuant: 7 }), { code: 'INVALID_OPTION', message: /kvQuant/ })
    assert.throws(() => mlx.createServer(ctx, 0, { hlg: true }), { code: 'UNSUPPORTED_OPTION', message: /hlg/ })
    assert.throws(() => mlx.createServer(ctx, 0, { btach: 2 }), { code: 'INVALID_OPTION', message: /did you mean 'batch'/ })
    assert.throws(() => mlx.createServer(ctx, 70000), { code: 'INVALID_OPTION' })
  })
})
