'use strict'
// The HTTP server on real SmolLM2 (f32): `mlx-bun serve` driven by the official clients
// (openai and @anthropic-ai/sdk from npm, openai from PyPI), greedy answers equal to generate()
// on the same rendered prompt; stop strings across tokens; the prefix cache across turns;
// disconnects, admission, limits, keys and malformed requests; tool calls (through createServer).
// Rust behaviour only, so Node runs it alone (scripts/test.sh); create-server.test.js has what
// the addon's createServer does in each runtime.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { spawn, spawnSync, execFileSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

const { default: OpenAI, APIUserAbortError } = require('openai')
const { default: Anthropic } = require('@anthropic-ai/sdk')
const mlx = require('..')
const { ROOT, fixture, cosine, post } = require('./helpers')

const MODEL = 'smollm2-f32'
const QUESTION = [{ role: 'user', content: 'What is the capital of France?' }]

/** Starts `mlx-bun serve` on a free port; resolves with the process and its URL. */
function serve(args) {
  const bin = path.join(ROOT, 'target', 'release', 'mlx-bun')
  const child = spawn(bin, ['serve', '--model', fixture(MODEL), '--port', '0', ...args], { stdio: ['ignore', 'ignore', 'pipe'] })
  let log = ''
  return new Promise((resolve, reject) => {
    child.stderr.on('data', (d) => {
      log += d
      const m = /serving \S+ on (http:\S+)/.exec(log)
      if (m) resolve({ child, url: m[1], log: () => log })
    })
    child.on('exit', (code) => reject(new Error(`mlx-bun serve exited with ${code}: ${log}`)))
  })
}

async function waitIdle(url) {
  for (let i = 0; i < 100; i++) {
    const s = await (await fetch(`${url}/stats`)).json()
    if (s.live_sessions === 0) return s
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.fail('sessions still live 10 s after their clients left')
}

describe('mlx-bun serve on SmolLM2 (real weights)', () => {
  let server, openai, anthropic, model, tok, template
  /** What generate() makes of a rendered prompt: greedy text. */
  async function reference(tokens, maxTokens) {
    const ids = []
    for await (const t of mlx.generate(model, tokens, { maxTokens, temperature: 0 })) ids.push(t.token)
    return tok.decode(ids)
  }
  const chatPrompt = (messages) => tok.encode(template.render(messages), false)

  before(async () => {
    server = await serve(['--log-format', 'json'])
    openai = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused' })
    anthropic = new Anthropic({ baseURL: server.url, apiKey: 'unused' })
    model = await mlx.loadModel(fixture(MODEL))
    tok = mlx.loadTokenizer(fixture(MODEL))
    template = mlx.ChatTemplate.load(fixture(MODEL))
  })
  after(async () => {
    model.dispose()
    server.child.kill('SIGTERM')
    const code = await new Promise((r) => server.child.on('exit', r))
    assert.equal(code, 0, 'SIGTERM ends the server cleanly')
  })

  test('chat completions, whole and streamed, equal generate() on the rendered prompt', async () => {
    const want = await reference(chatPrompt(QUESTION), 12)
    const r = await openai.chat.completions.create({ model: MODEL, messages: QUESTION, max_tokens: 12, temperature: 0 })
    assert.equal(r.object, 'chat.completion')
    assert.equal(r.choices[0].message.role, 'assistant')
    assert.equal(r.choices[0].message.content, want)
    assert.equal(r.usage.prompt_tokens, chatPrompt(QUESTION).length)
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)

    const stream = await openai.chat.completions.create({ model: MODEL, messages: QUESTION, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true } })
    let text = ''
    let finish = null
    let usage = null
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage
      for (const c of chunk.choices) {
        text += c.delta.content ?? ''
        finish = c.finish_reason ?? finish
      }
    }
    assert.equal(text, want)
    assert.equal(finish, r.choices[0].finish_reason)
    assert.equal(usage.completion_tokens, r.usage.completion_tokens)
    // The second identical request found the first one's prompt in the prefix cache.
    assert.equal(usage.prompt_tokens_details.cached_tokens, usage.prompt_tokens - 1)
  })

  test('a second turn prefills only what is new (the prefix cache)', async () => {
    const first = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Name a color.' }], max_tokens: 6, temperature: 0 })
    const turn = [{ role: 'user', content: 'Name a color.' }, first.choices[0].message, { role: 'user', content: 'Another one?' }]
    const second = await openai.chat.completions.create({ model: MODEL, messages: turn, max_tokens: 6, temperature: 0 })
    assert.ok(second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens, JSON.stringify(second.usage))
    assert.equal(second.choices[0].message.content, await reference(chatPrompt(turn), 6))
    const stats = await (await fetch(`${server.url}/stats`)).json()
    assert.ok(stats.prefix_cache.hits >= 2 && stats.prefix_cache.entries >= 1, JSON.stringify(stats))
  })

  test('completions: text or token prompts, echo, streaming', async () => {
    const prompt = 'The quick brown fox'
    const want = await reference(tok.encode(prompt, true), 8)
    const r = await openai.completions.create({ model: MODEL, prompt, max_tokens: 8, temperature: 0 })
    assert.equal(r.object, 'text_completion')
    assert.equal(r.choices[0].text, want)
    const ids = await openai.completions.create({ model: MODEL, prompt: Array.from(tok.encode(prompt, true)), max_tokens: 8, temperature: 0, echo: true })
    assert.equal(ids.choices[0].text, tok.decode(tok.encode(prompt, true), false) + want)
    let text = ''
    for await (const c of await openai.completions.create({ model: MODEL, prompt, max_tokens: 8, temperature: 0, stream: true, echo: true })) text += c.choices[0]?.text ?? ''
    assert.equal(text, prompt + want)
  })

  test('anthropic messages, whole and streamed, with its stop reasons', async () => {
    const want = await reference(chatPrompt(QUESTION), 10)
    const r = await anthropic.messages.create({ model: MODEL, max_tokens: 10, temperature: 0, messages: QUESTION })
    assert.equal(r.type, 'message')
    assert.equal(r.content[0].text, want)
    assert.ok(['end_turn', 'max_tokens'].includes(r.stop_reason))
    const events = []
    const stream = anthropic.messages.stream({ model: MODEL, max_tokens: 10, temperature: 0, messages: QUESTION })
    stream.on('streamEvent', (e) => events.push(e.type))
    const final = await stream.finalMessage()
    assert.equal(final.content[0].text, want)
    assert.deepEqual([...new Set(events)], ['message_start', 'content_block_start', 'content_block_delta', 'content_block_stop', 'message_delta', 'message_stop'])
    const sys = await anthropic.messages.create({ model: MODEL, max_tokens: 6, temperature: 0, system: 'Be brief.', messages: QUESTION })
    assert.equal(sys.content[0].text, await reference(chatPrompt([{ role: 'system', content: 'Be brief.' }, ...QUESTION]), 6))
  })

  test('stop strings spanning tokens are cut exactly and never emitted', async () => {
    const want = await reference(chatPrompt(QUESTION), 12) // "The capital of France is Paris."
    const stop = 'ital of Fr' // ends inside " France", begins inside " capital"
    assert.ok(want.includes(stop), want)
    const cut = want.slice(0, want.indexOf(stop))
    const r = await openai.chat.completions.create({ model: MODEL, messages: QUESTION, max_tokens: 12, temperature: 0, stop: ['nowhere', stop] })
    assert.equal(r.choices[0].message.content, cut)
    assert.equal(r.choices[0].finish_reason, 'stop')
    let text = ''
    for await (const c of await openai.chat.completions.create({ model: MODEL, messages: QUESTION, max_tokens: 12, temperature: 0, stop, stream: true })) text += c.choices[0]?.delta?.content ?? ''
    assert.equal(text, cut)
    const m = await anthropic.messages.create({ model: MODEL, max_tokens: 12, temperature: 0, messages: QUESTION, stop_sequences: [stop] })
    assert.equal(m.content[0].text, cut)
    assert.equal(m.stop_reason, 'stop_sequence')
    assert.equal(m.stop_sequence, stop)
  })

  test('a reply cut by a stop string leaves its cache for the next turn', async () => {
    const ask = [{ role: 'user', content: 'Which planet is the largest?' }]
    const want = await reference(chatPrompt(ask), 12)
    const stop = want.slice(Math.floor(want.length / 2), Math.floor(want.length / 2) + 3)
    const cut = want.slice(0, want.indexOf(stop))
    const first = await openai.chat.completions.create({ model: MODEL, messages: ask, max_tokens: 12, temperature: 0, stop })
    assert.equal(first.choices[0].message.content, cut)
    assert.equal(first.choices[0].finish_reason, 'stop')
    const turn = [...ask, { role: 'assistant', content: cut }, { role: 'user', content: 'And the smallest?' }]
    const second = await openai.chat.completions.create({ model: MODEL, messages: turn, max_tokens: 6, temperature: 0 })
    // Nothing else asked this question: only the cut reply's own cache holds its prompt.
    assert.ok(second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens, JSON.stringify(second.usage))
    assert.equal(second.choices[0].message.content, await reference(chatPrompt(turn), 6))
  })

  test('logprobs: each token with its alternatives', async () => {
    const r = await openai.chat.completions.create({ model: MODEL, messages: QUESTION, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2 })
    const lp = r.choices[0].logprobs.content
    assert.equal(lp.length, r.usage.completion_tokens)
    assert.equal(lp.map((t) => t.token).join(''), r.choices[0].message.content)
    for (const t of lp) {
      assert.equal(t.top_logprobs.length, 2)
      assert.equal(t.top_logprobs[0].token, t.token, 'greedy picks the most likely token')
      assert.ok(t.logprob <= 0)
    }
  })

  test('response_format: json_object and json_schema answers parse and validate, whole and streamed', async () => {
    const Ajv = require('ajv')
    const schema = {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 20 }, country: { type: 'string', maxLength: 20 }, population: { type: 'integer', minimum: 0, maximum: 50000000 } },
      required: ['city', 'country', 'population'],
      additionalProperties: false,
    }
    const messages = [{ role: 'user', content: 'Describe Paris as JSON with city, country and population.' }]
    const format = { type: 'json_schema', json_schema: { name: 'city', schema, strict: true } }
    const r = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: 80, temperature: 0, response_format: format })
    assert.equal(r.choices[0].finish_reason, 'stop')
    const value = JSON.parse(r.choices[0].message.content)
    assert.ok(new Ajv().validate(schema, value), r.choices[0].message.content)
    const stream = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: 80, temperature: 0, response_format: format, stream: true })
    let streamed = ''
    for await (const c of stream) streamed += c.choices[0]?.delta?.content ?? ''
    assert.equal(streamed, r.choices[0].message.content)
    const any = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: 80, temperature: 0, response_format: { type: 'json_object' } })
    const obj = JSON.parse(any.choices[0].message.content)
    assert.ok(obj !== null && typeof obj === 'object' && !Array.isArray(obj))
  })

  test('--draft-model: speculative decoding behind the same answers, with logprobs and response_format too', async () => {
    const drafted = await serve(['--draft-model', fixture('home/models/SmolLM2-135M-Instruct.Q4_1.gguf'), '--num-draft-tokens', '2'])
    try {
      const client = new OpenAI({ baseURL: `${drafted.url}/v1`, apiKey: 'unused' })
      const want = await reference(chatPrompt(QUESTION), 16)
      const r = await client.chat.completions.create({ model: MODEL, messages: QUESTION, max_tokens: 16, temperature: 0 })
      assert.equal(r.choices[0].message.content, want)
      const lp = await client.chat.completions.create({ model: MODEL, messages: QUESTION, max_tokens: 4, temperature: 0, logprobs: true })
      assert.equal(lp.choices[0].logprobs.content.length, lp.usage.completion_tokens)
      const json = await client.chat.completions.create({ model: MODEL, messages: QUESTION, max_tokens: 12, temperature: 0, response_format: { type: 'json_object' } })
      assert.ok(json.choices[0].message.content.startsWith('{'), json.choices[0].message.content)
    } finally {
      drafted.child.kill('SIGTERM')
      await new Promise((r) => drafted.child.on('exit', r))
    }
    const bad = spawnSync(path.join(ROOT, 'target', 'release', 'mlx-bun'), ['serve', '--model', fixture(MODEL), '--port', '0', '--draft-model', fixture('gemma3-bf16')], { encoding: 'utf8' })
    assert.notEqual(bad.status, 0)
    assert.match(bad.stderr, /vocabulary/)
  })

  test("Python's openai client gets the same answers", async () => {
    const want = await reference(chatPrompt(QUESTION), 8)
    const script = `
import json, sys
from openai import OpenAI
c = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
msgs = [{"role": "user", "content": "What is the capital of France?"}]
whole = c.chat.completions.create(model="${MODEL}", messages=msgs, max_tokens=8, temperature=0)
streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(model="${MODEL}", messages=msgs, max_tokens=8, temperature=0, stream=True) if ch.choices)
print(json.dumps([whole.choices[0].message.content, streamed]))
`
    const out = execFileSync(path.join(ROOT, '.venv', 'bin', 'python'), ['-c', script, server.url], { encoding: 'utf8' })
    assert.deepEqual(JSON.parse(out), [want, want])
  })

  test('clients that leave mid-answer cancel their sessions; the others get their own answers', async () => {
    const prompts = ['Name a fruit.', 'Count to five.', 'What is 2+2?'].map((q) => [{ role: 'user', content: q }])
    const wants = await Promise.all(prompts.map((p) => reference(chatPrompt(p), 8)))
    const leaving = async (messages, stream) => {
      const ac = new AbortController()
      try {
        const r = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: 200, temperature: 0, stream }, { signal: ac.signal })
        if (stream) for await (const c of r) if (c.choices[0]?.delta?.content) break
        else ac.abort()
      } catch (e) {
        assert.ok(e instanceof APIUserAbortError, String(e))
      }
    }
    const staying = prompts.map(async (messages, i) => {
      let text = ''
      for await (const c of await openai.chat.completions.create({ model: MODEL, messages, max_tokens: 8, temperature: 0, stream: true })) text += c.choices[0]?.delta?.content ?? ''
      assert.equal(text, wants[i])
    })
    const gone = [leaving(prompts[0], true), leaving(prompts[1], true)]
    // A whole (unstreamed) answer whose client leaves after 1.5 s: its end-of-text tokens banned,
    // so that it cannot be done by then on any machine (2000 tokens).
    const ac = new AbortController()
    setTimeout(() => ac.abort(), 1500)
    const endless = Object.fromEntries(tok.eosTokenIds.map((id) => [id, -100]))
    gone.push(openai.chat.completions.create({ model: MODEL, messages: prompts[2], max_tokens: 2000, temperature: 0, logit_bias: endless }, { signal: ac.signal }).then(
      () => assert.fail('the aborted request answered'),
      (e) => assert.ok(e instanceof APIUserAbortError, String(e)),
    ))
    await Promise.all([...staying, ...gone])
    const idle = await waitIdle(server.url)
    assert.equal(idle.running, 0)
  })

  test('malformed requests get typed 4xx answers, and the server goes on', async () => {
    const chat = `${server.url}/v1/chat/completions`
    const cases = [
      [chat, '{not json', 400, 'invalid_request_error', /invalid request body/],
      [chat, { model: MODEL, messages: QUESTION, temprature: 1 }, 400, 'invalid_request_error', /unknown field `temprature`/],
      [chat, { model: MODEL, messages: QUESTION, max_tokens: 'x' }, 400, 'invalid_request_error', /invalid type/],
      [chat, { model: MODEL }, 400, 'invalid_request_error', /missing field `messages`/],
      [chat, { model: 'gpt-4', messages: QUESTION }, 404, 'not_found_error', /not served here/],
      [chat, { model: MODEL, messages: QUESTION, max_tokens: 0 }, 400, 'invalid_request_error', /max_tokens/],
      [chat, { model: MODEL, messages: QUESTION, temperature: -1 }, 400, 'invalid_request_error', /temperature/],
      [chat, { model: MODEL, messages: [] }, 400, 'invalid_request_error', /messages: must not be empty/],
      [chat, { model: MODEL, messages: [{ role: 'wizard', content: 'hi' }] }, 400, 'invalid_request_error', /unknown role/],
      [chat, { model: MODEL, messages: QUESTION, n: 2 }, 400, 'invalid_request_error', /n is not supported/],
      [chat, { model: MODEL, messages: QUESTION, response_format: { type: 'yaml' } }, 400, 'invalid_request_error', /type must be/],
      [chat, { model: MODEL, messages: QUESTION, response_format: { type: 'json_schema' } }, 400, 'invalid_request_error', /json_schema is required/],
      [chat, { model: MODEL, messages: QUESTION, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'nope' } } } }, 400, 'invalid_request_error', /grammar/],
      [chat, { model: MODEL, messages: QUESTION, logit_bias: { abc: 1 } }, 400, 'invalid_request_error', /logit_bias/],
      [chat, { model: MODEL, messages: QUESTION, logit_bias: { 99999999: 1 } }, 400, 'invalid_request_error', /outside the vocabulary/],
      [`${server.url}/v1/completions`, { model: MODEL, prompt: [1, 2, 99999999] }, 400, 'invalid_request_error', /outside the vocabulary/],
      [`${server.url}/v1/nothing`, {}, 404, 'not_found_error', /no route/],
    ]
    for (const [url, body, status, type, message] of cases) {
      const r = await post(url, body)
      assert.equal(r.status, status, JSON.stringify(body))
      assert.equal(r.json.error.type, type, JSON.stringify(r.json))
      assert.match(r.json.error.message, message)
    }
    const m = await post(`${server.url}/v1/messages`, { model: MODEL, messages: QUESTION })
    assert.equal(m.status, 400)
    assert.equal(m.json.type, 'error')
    assert.match(m.json.error.message, /missing field `max_tokens`/)
    await assert.rejects(anthropic.messages.create({ model: MODEL, max_tokens: 4, messages: [{ role: 'system', content: 'x' }] }), (e) => e.status === 400 && e.error.type === 'error')
    assert.equal((await fetch(chat)).status, 405)
    const ok = await openai.chat.completions.create({ model: MODEL, messages: QUESTION, max_tokens: 2, temperature: 0 })
    assert.equal(ok.choices.length, 1)
    assert.match(server.log(), /"path":"\/v1\/chat\/completions","status":200,"prompt_tokens":\d+,"cached_tokens":\d+,"generated_tokens":2/)
  })

  test('embeddings: the openai client (base64 on the wire by default, or float) gets embedMany\'s vectors', async () => {
    const texts = ['The quick brown fox jumps over the lazy dog.', 'Paris is the capital of France.']
    const ours = await mlx.embedMany(model, tok, texts)
    const close = (got, want, what) => assert.ok(cosine(got, want) >= 0.99999, `${what}: cosine ${cosine(got, want)}`)
    for (const encoding_format of [undefined, 'float']) {
      const r = await openai.embeddings.create({ model: MODEL, input: texts, ...(encoding_format && { encoding_format }) })
      assert.equal(r.model, MODEL)
      assert.deepEqual(r.data.map((d) => d.index), [0, 1])
      r.data.forEach((d, i) => close(d.embedding, ours[i].vector, `${encoding_format ?? 'base64'} ${i}`))
      assert.deepEqual(r.usage, { prompt_tokens: ours[0].tokens + ours[1].tokens, total_tokens: ours[0].tokens + ours[1].tokens })
    }
    // Token ids are the text's: the end-of-text token is appended to them too.
    const byIds = await openai.embeddings.create({ model: MODEL, input: Array.from(tok.encode(texts[1], false)), encoding_format: 'float' })
    close(byIds.data[0].embedding, ours[1].vector, 'token ids')
    // `dimensions`: the first components, normalised again.
    const short = await openai.embeddings.create({ model: MODEL, input: texts[0], dimensions: 64, encoding_format: 'float' })
    assert.equal(short.data[0].embedding.length, 64)
    close(short.data[0].embedding, ours[0].vector.slice(0, 64), 'dimensions 64')
    assert.ok(Math.abs(Math.hypot(...short.data[0].embedding) - 1) < 1e-5)
    for (const bad of [{ dimensions: 0 }, { dimensions: 100000 }, { input: [] }, { encoding_format: 'int8' }, { instruction: 'x' }]) {
      await assert.rejects(openai.embeddings.create({ model: MODEL, input: 'x', ...bad }), (e) => e.status === 400, JSON.stringify(bad))
    }
    await assert.rejects(openai.embeddings.create({ model: 'gpt-4', input: 'x' }), (e) => e.status === 404)
  })

  test('health and models', async () => {
    assert.deepEqual(await (await fetch(`${server.url}/health`)).json(), { status: 'ok', model: MODEL })
    const list = await openai.models.list()
    assert.deepEqual(list.data.map((m) => m.id), [MODEL])
    assert.equal((await openai.models.retrieve(MODEL)).id, MODEL)
    await assert.rejects(openai.models.retrieve('gpt-4'), (e) => e.status === 404)
  })

  test('GET /fit: the served model on this machine, by the same fit() as the package', async () => {
    const dir = fixture(MODEL)
    const config = mlx.loadModelConfig(dir)
    const weights = fs.readdirSync(dir).filter((f) => f.endsWith('.safetensors')).reduce((n, f) => n + fs.statSync(path.join(dir, f)).size, 0)
    const get = async (query) => {
      const r = await fetch(`${server.url}/fit${query}`)
      return { status: r.status, json: await r.json() }
    }
    const snake = (r) => ({ fits: r.fits, weights_bytes: r.weightsBytes, kv_bytes: r.kvBytes, transient_bytes: r.transientBytes, total_bytes: r.totalBytes,
      usable_bytes: r.usableBytes, max_safe_context: r.maxSafeContext, predicted_decode_tps: r.predictedDecodeTps })
    const here = mlx.thisMachine()
    const d = await get('')
    assert.equal(d.status, 200)
    assert.equal(d.json.model, MODEL)
    assert.deepEqual(d.json.machine, { chip: here.chip, ram_bytes: here.ramBytes, bandwidth_gbs: here.bandwidthGBs, bandwidth_source: here.bandwidthSource })
    assert.equal(d.json.context_tokens, 8192)
    assert.deepEqual(d.json.report, snake(mlx.fit(config, weights, 8192)))
    assert.equal(d.json.sku_matrix_ctx, 32768)
    assert.deepEqual(d.json.sku_matrix[0], { sku: 'M1', ram_gb: 8, fits: true, max_context: 8192, decode_tps: mlx.skuMatrix(config, weights, 32768)[0].decodeTps })
    const q = await get('?ctx=2048&kvBits=4')
    assert.equal(q.json.context_tokens, 2048)
    assert.deepEqual(q.json.report, snake(mlx.fit(config, weights, 2048, here, 2048, 0, undefined, { kvBits: 4 })))
    for (const [query, message] of [['?ctx=abc', /ctx/], ['?kvBits=7', /kvBits/], ['?context=5', /unknown query parameter/]]) {
      const r = await get(query)
      assert.equal(r.status, 400, query)
      assert.match(r.json.error.message, message)
    }
  })
})

describe('tool calls (SmolLM2 with a ChatML tools template)', () => {
  const source = require('node:fs').readFileSync(path.join(__dirname, 'tools-template.jinja'), 'utf8')
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }]
  const call = (id, city) => ({ id, type: 'function', function: { name: 'get_weather', arguments: JSON.stringify({ city }) } })
  // One example call is enough for the model to answer the next question with a call.
  const asking = [
    { role: 'user', content: 'What is the weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [call('call_0', 'Paris')] },
    { role: 'user', content: 'What is the weather in London?' },
  ]
  let ctx, s, openai, model, tok, template
  before(async () => {
    ctx = mlx.loadContext(fixture(MODEL), { chatTemplate: source })
    s = mlx.createServer(ctx, 0, { log: 'off' })
    openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused' })
    model = await mlx.loadModel(fixture(MODEL))
    tok = mlx.loadTokenizer(fixture(MODEL))
    template = mlx.ChatTemplate.fromString(source)
  })
  after(async () => {
    await s.close()
    model.dispose()
  })
  /** The prompt the server renders: calls' arguments as objects (templates write them with tojson). */
  const prompt = (messages) =>
    tok.encode(template.render(messages.map((m) => (m.tool_calls ? { ...m, tool_calls: m.tool_calls.map((c) => ({ ...c, function: { ...c.function, arguments: JSON.parse(c.function.arguments) } })) } : m)), { tools }), false)
  /** generate()'s greedy text for that prompt. */
  async function raw(messages, maxTokens) {
    const ids = []
    for await (const t of mlx.generate(model, prompt(messages), { maxTokens, temperature: 0 })) ids.push(t.token)
    return tok.decode(ids)
  }

  test('a call the model writes comes back as tool_calls, whole and streamed', async () => {
    const text = await raw(asking, 30)
    const m = /^<tool_call>(.*)<\/tool_call>\s*$/s.exec(text)
    assert.ok(m, `the model wrote a call: ${text}`)
    const written = JSON.parse(m[1])
    const r = await openai.chat.completions.create({ model: MODEL, messages: asking, tools, max_tokens: 30, temperature: 0 })
    const choice = r.choices[0]
    assert.equal(choice.finish_reason, 'tool_calls')
    assert.equal(choice.message.content, null)
    assert.equal(choice.message.tool_calls.length, 1)
    assert.equal(choice.message.tool_calls[0].type, 'function')
    assert.equal(choice.message.tool_calls[0].function.name, written.name)
    assert.deepEqual(JSON.parse(choice.message.tool_calls[0].function.arguments), written.arguments)
    const calls = []
    let finish = null
    for await (const c of await openai.chat.completions.create({ model: MODEL, messages: asking, tools, max_tokens: 30, temperature: 0, stream: true })) {
      for (const tc of c.choices[0]?.delta?.tool_calls ?? []) calls.push(tc)
      finish = c.choices[0]?.finish_reason ?? finish
      assert.ok(!c.choices[0]?.delta?.content?.includes('<tool_call>'), 'the call is not streamed as text')
    }
    assert.equal(finish, 'tool_calls')
    assert.deepEqual(calls.map((c) => [c.index, c.function.name, JSON.parse(c.function.arguments)]), [[0, written.name, written.arguments]])
  })

  test('the call and its result fed back reach the model as the template writes them', async () => {
    const back = [...asking, { role: 'assistant', content: null, tool_calls: [call('call_1', 'London')] }, { role: 'tool', tool_call_id: 'call_1', content: 'rainy, 12 C' }]
    const r = await openai.chat.completions.create({ model: MODEL, messages: back, tools, max_tokens: 12, temperature: 0 })
    assert.equal(r.choices[0].message.content, await raw(back, 12))
    assert.equal(r.usage.prompt_tokens, prompt(back).length)
  })

  test('anthropic tool use: tool_use blocks out, tool_result blocks back in', async () => {
    const anthropic = new Anthropic({ baseURL: s.url, apiKey: 'unused' })
    const atools = tools.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters }))
    const use = (id, city) => ({ type: 'tool_use', id, name: 'get_weather', input: { city } })
    const ask = [
      { role: 'user', content: 'What is the weather in Paris?' },
      { role: 'assistant', content: [use('toolu_0', 'Paris')] },
      { role: 'user', content: [{ type: 'text', text: 'What is the weather in London?' }] },
    ]
    const written = JSON.parse(/<tool_call>(.*)<\/tool_call>/s.exec(await raw(asking, 30))[1])
    const r = await anthropic.messages.create({ model: MODEL, max_tokens: 30, temperature: 0, tools: atools, messages: ask })
    assert.equal(r.stop_reason, 'tool_use')
    const calls = r.content.filter((b) => b.type === 'tool_use')
    assert.deepEqual(calls.map((b) => [b.name, b.input]), [[written.name, written.arguments]])
    const streamed = await anthropic.messages.stream({ model: MODEL, max_tokens: 30, temperature: 0, tools: atools, messages: ask }).finalMessage()
    assert.equal(streamed.stop_reason, 'tool_use')
    assert.deepEqual(streamed.content.filter((b) => b.type === 'tool_use').map((b) => [b.name, b.input]), [[written.name, written.arguments]])
    const back = [
      ...ask,
      { role: 'assistant', content: [use('toolu_1', 'London')] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'rainy, 12 C' }] },
    ]
    const answer = await anthropic.messages.create({ model: MODEL, max_tokens: 12, temperature: 0, tools: atools, messages: back })
    const same = [...asking, { role: 'assistant', content: null, tool_calls: [call('call_1', 'London')] }, { role: 'tool', tool_call_id: 'call_1', content: 'rainy, 12 C' }]
    assert.equal(answer.content[0].text, await raw(same, 12))
  })

  test('tool_choice that forces a call: the reply is a call valid against its schema (OpenAI and Anthropic)', async () => {
    const Ajv = require('ajv')
    const valid = new Ajv().compile(tools[0].function.parameters)
    // A question the model answers in words; a second tool, to name one of two.
    const words = [{ role: 'user', content: 'Tell me a short joke.' }]
    const both = [...tools, { type: 'function', function: { name: 'get_time', description: 'The time', parameters: { type: 'object', properties: { zone: { type: 'string', enum: ['UTC', 'CET'] } }, required: ['zone'] } } }]
    const free = await openai.chat.completions.create({ model: MODEL, messages: words, tools: both, max_tokens: 24, temperature: 0 })
    assert.equal(free.choices[0].finish_reason !== 'tool_calls', true, 'unforced, the model answers in words')
    for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
      const r = await openai.chat.completions.create({ model: MODEL, messages: words, tools: both, tool_choice, max_tokens: 60, temperature: 0 })
      const c = r.choices[0]
      assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c))
      const calls = c.message.tool_calls.map((t) => [t.function.name, JSON.parse(t.function.arguments)])
      assert.ok(calls.length >= 1)
      if (tool_choice !== 'required') assert.deepEqual(calls.map(([n]) => n), ['get_weather'])
      for (const [name, args] of calls) {
        if (name === 'get_weather') assert.ok(valid(args), JSON.stringify(args))
        else assert.ok(['UTC', 'CET'].includes(args.zone), JSON.stringify(args))
      }
    }
    const atools = both.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters }))
    const anthropic = new Anthropic({ baseURL: s.url, apiKey: 'unused' })
    const a = await anthropic.messages.create({ model: MODEL, max_tokens: 60, temperature: 0, tools: atools, tool_choice: { type: 'tool', name: 'get_time' }, messages: words })
    assert.equal(a.stop_reason, 'tool_use', JSON.stringify(a.content))
    const use = a.content.filter((b) => b.type === 'tool_use')
    assert.deepEqual(use.map((b) => b.name), ['get_time'])
    assert.ok(['UTC', 'CET'].includes(use[0].input.zone))
    // What cannot be forced is a 400 naming it.
    const missing = await post(`${s.url}/v1/chat/completions`, { model: MODEL, messages: words, tools, tool_choice: { type: 'function', function: { name: 'nope' } } })
    assert.equal(missing.status, 400)
    assert.match(missing.json.error.message, /nope/)
    const twice = await post(`${s.url}/v1/chat/completions`, { model: MODEL, messages: words, tools, tool_choice: 'required', response_format: { type: 'json_object' } })
    assert.equal(twice.status, 400)
    assert.equal(twice.json.error.code, 'unsupported_parameter')
  })

  test("tools are refused where the template has no tool format; a forced call needs tools", async () => {
    const plain = mlx.loadContext(fixture(MODEL))
    const p = mlx.createServer(plain, 0, { log: 'off' })
    try {
      const r = await post(`${p.url}/v1/chat/completions`, { model: MODEL, messages: QUESTION, tools })
      assert.equal(r.status, 400)
      assert.match(r.json.error.message, /renders no tools/)
    } finally {
      await p.close()
    }
    const forced = await post(`${s.url}/v1/chat/completions`, { model: MODEL, messages: asking, tool_choice: 'required' })
    assert.equal(forced.status, 400)
    assert.match(forced.json.error.message, /no tools/)
  })
})
