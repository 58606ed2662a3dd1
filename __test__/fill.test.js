'use strict'
// Fill (engine option `fill`, MLX_BUN_FILL): echo spans copied from the prompt and output are
// appended in one step and verified against the model's own sampling, so every output equals the
// run without fill, while the span counts show the steps it saved. Real weights: SmolLM2-135M f32
// on a code-edit prompt (it copies the rest of a file after the renamed line), Gemma-3-270M f32.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const { spawnSync } = require('node:child_process')

const mlx = require('..')
const { fixture, tmpdir } = require('./helpers')

const { EDIT } = require('../scripts/edit-prompt')

describe('fill: echo spans on SmolLM2 (real weights)', () => {
  let model, tok, plain, echo, prompt
  const run = (engine, extra = {}) => engine.open({ promptTokens: prompt, maxTokens: 48, ...extra }, { output: 'collect' }).result
  before(async () => {
    model = await mlx.loadModel(fixture('smollm2-f32'))
    tok = mlx.loadTokenizer(fixture('smollm2-f32'))
    prompt = Array.from(tok.encode(EDIT))
    plain = mlx.createEngine(model, { prefixCacheBytes: 0 })
    echo = mlx.createEngine(model, { fill: 'echo', prefixCacheBytes: 0 })
  })
  after(async () => {
    await plain.close()
    await echo.close()
    model.dispose()
  })

  test('greedy: the same tokens as plain decoding, with echo spans committed', async () => {
    const want = await run(plain)
    const got = await run(echo)
    assert.equal(got.status, 'completed', JSON.stringify(got.error))
    assert.deepEqual(Array.from(got.output), Array.from(want.output))
    assert.equal(want.result.metrics.fill, undefined)
    const f = got.result.metrics.fill
    assert.ok(f.echo >= 8 && f.verifyAccepted === f.echo && f.events > 0, JSON.stringify(f))
    // Every output token was either sampled or appended from a span.
    assert.equal(f.decodeSteps + f.injected, got.output.length + (got.result.finishReason === 'stop' ? 1 : 0))
    assert.equal(got.result.metrics.generatedTokens, got.output.length)
  })

  test('seeded sampling, and penalties: the same tokens as plain decoding', async () => {
    for (const opts of [{ temperature: 0.3, seed: 5 }, { repetitionPenalty: 1.05, presencePenalty: 0.1 }]) {
      const want = await run(plain, opts)
      const got = await run(echo, opts)
      assert.deepEqual(Array.from(got.output), Array.from(want.output), JSON.stringify(opts))
      assert.ok(got.result.metrics.fill.verifyEvents > 0, JSON.stringify(opts))
    }
  })

  test('fill rows share a batch with rows placed without it (logprobs), each equal to its run alone', async () => {
    const N = 24
    // Logprobs come through a stream; such requests are placed without fill (mlx-bun's rule).
    const streamed = async (engine) => {
      const s = engine.open({ promptTokens: prompt, maxTokens: N, logprobs: true, topLogprobs: 2 })
      const tokens = []
      for await (const e of s.events) if (e.type === 'committed') tokens.push(...e.tokenIds)
      const r = await s.result
      return { output: tokens, result: r.result }
    }
    const alone = await run(plain, { maxTokens: N })
    const outs = await Promise.all([run(echo, { maxTokens: N }), streamed(echo), run(echo, { maxTokens: N }), streamed(echo)])
    for (const [i, o] of outs.entries()) {
      assert.deepEqual(Array.from(o.output), Array.from(alone.output), `row ${i}`)
      assert.equal(o.result.metrics.fill === undefined, i % 2 === 1, `row ${i}`)
    }
  })

  test('with a draft model: fill proposes first, the draft after it (speculative echo); same tokens', async () => {
    const gguf = await mlx.loadModel(fixture('home/models/SmolLM2-135M-Instruct.Q4_1.gguf'))
    try {
      const want = await run(plain, { maxTokens: 32 })
      const got = await run(echo, { maxTokens: 32, draftModel: gguf })
      assert.deepEqual(Array.from(got.output), Array.from(want.output))
      const m = got.result.metrics
      assert.ok(m.fill.echo > 0 && m.draftTokens > 0, JSON.stringify(m))
    } finally {
      gguf.dispose()
    }
  })

  test('a fill row hands its caches to the prefix cache: the next turn starts from them', async () => {
    const engine = mlx.createEngine(model, { fill: 'echo' })
    try {
      const first = await run(engine, { maxTokens: 16 })
      const again = await run(engine, { maxTokens: 16 })
      assert.deepEqual(Array.from(again.output), Array.from(first.output))
      assert.ok(again.result.metrics.cachedTokens > prompt.length / 2, String(again.result.metrics.cachedTokens))
    } finally {
      await engine.close()
    }
  })

  test('the trace writes one JSON line per proposal; grammar requests are placed without fill', async () => {
    const trace = path.join(tmpdir('fill-trace'), 'trace.jsonl')
    const engine = mlx.createEngine(model, { fill: { mode: 'echo', k: 4, maxSpan: 16, trace } })
    try {
      const o = await run(engine, { maxTokens: 24 })
      const lines = fs.readFileSync(trace, 'utf8').trim().split('\n').map((l) => JSON.parse(l))
      assert.equal(lines.length, o.result.metrics.fill.verifyEvents)
      for (const l of lines) {
        assert.equal(l.origin, 'echo')
        assert.ok(l.proposed.length >= 2 && l.proposed.length <= 16)
        assert.equal(l.actual.length, l.proposed.length + 1)
        assert.equal(l.accepted, l.firstMismatch < 0 ? l.proposed.length : l.firstMismatch)
      }
      const g = await run(engine, { maxTokens: 8, grammar: { regex: '[a-z ]+' } })
      assert.equal(g.status, 'completed')
      assert.equal(g.result.metrics.fill, undefined)
    } finally {
      await engine.close()
    }
  })

  test('bad settings are refused; MLX_BUN_FILL sets the default', () => {
    for (const fill of ['on', { maxSpan: 1 }, { k: 2.5 }, { span: 4 }, 3, { trace: 1 }]) {
      assert.throws(() => mlx.createEngine(model, { fill }), { code: 'INVALID_OPTION' }, JSON.stringify(fill))
    }
    const script = `const mlx = require(${JSON.stringify(path.resolve(__dirname, '..'))})
      ;(async () => {
        const m = await mlx.loadModel(${JSON.stringify(fixture('smollm2-f32'))})
        const e = mlx.createEngine(m)
        const o = await e.open({ promptTokens: ${JSON.stringify(prompt)}, maxTokens: 12 }, { output: 'collect' }).result
        console.log(JSON.stringify(o.result.metrics.fill))
        await e.close()
      })()`
    const child = spawnSync(process.execPath, ['-e', script], { env: { ...process.env, MLX_BUN_FILL: 'echo' }, encoding: 'utf8' })
    assert.equal(child.status, 0, child.stderr)
    assert.ok(JSON.parse(child.stdout.split('\n')[0]).decodeSteps > 0, child.stdout)
    const bad = spawnSync(process.execPath, ['-e', `try { require(${JSON.stringify(path.resolve(__dirname, '..'))}).testing.createScriptedEngine({ steps: [] }) } catch (e) { console.log(e.code, e.message) }`], { env: { ...process.env, MLX_BUN_FILL: 'yes' }, encoding: 'utf8' })
    assert.match(bad.stdout, /INVALID_OPTION .*MLX_BUN_FILL=yes/)
  })
})

describe('fill on Gemma-3-270M (real weights, sliding-window caches)', () => {
  test('greedy: the same tokens as plain decoding, with echo spans committed', async () => {
    const dir = fixture('gemma3-f32')
    const model = await mlx.loadModel(dir)
    const tok = mlx.loadTokenizer(dir)
    const line = 'The quick brown fox jumps over the lazy dog near the river bank.'
    const prompt = Array.from(tok.encode(`${line}\n${line}\n${line}\nThe quick brown`))
    const plain = mlx.createEngine(model)
    const echo = mlx.createEngine(model, { fill: 'echo' })
    try {
      const open = (e) => e.open({ promptTokens: prompt, maxTokens: 16 }, { output: 'collect' }).result
      const want = await open(plain)
      const got = await open(echo)
      assert.deepEqual(Array.from(got.output), Array.from(want.output))
      assert.ok(got.result.metrics.fill.echo > 4, JSON.stringify(got.result.metrics.fill))
    } finally {
      await plain.close()
      await echo.close()
      model.dispose()
    }
  })
})

describe("fill: strict rows from a chat template's tool calls (SmolLM2, a ChatML tools template)", () => {
  const source = fs.readFileSync(path.join(__dirname, 'tools-template.jinja'), 'utf8')
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }]
  const call = (id, city) => ({ id, type: 'function', function: { name: 'get_weather', arguments: { city } } })
  // One example call is enough for the model to answer the next question with a call.
  const messages = [
    { role: 'user', content: 'What is the weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [call('call_0', 'Paris')] },
    { role: 'user', content: 'What is the weather in London?' },
  ]
  let model, tok, template
  before(async () => {
    model = await mlx.loadModel(fixture('smollm2-f32'))
    tok = mlx.loadTokenizer(fixture('smollm2-f32'))
    template = mlx.ChatTemplate.fromString(source)
  })
  after(() => model.dispose())
  const run = async (fill, extra = {}) => {
    const e = mlx.createEngine(model, { fill, chatTemplate: template })
    try {
      return await e.open({ messages, chat: { tools }, maxTokens: 30, ...extra }, { output: 'collect' }).result
    } finally {
      await e.close()
    }
  }
  const parsed = (o) => JSON.parse(/<tool_call>(.*)<\/tool_call>/s.exec(tok.decode(o.output))[1])

  test('the scaffold, the name and the key are appended as the template writes them; the call is the same', async () => {
    const plain = await run('off')
    const strict = await run('strict')
    const f = strict.result.metrics.fill
    assert.deepEqual(parsed(strict), parsed(plain))
    assert.deepEqual(parsed(plain), { name: 'get_weather', arguments: { city: 'London' } })
    // Asserted spans are cut from the template's own rendering of a call: the tokens up to the
    // end of the call are those of plain decoding, most of them appended rather than decoded.
    const end = Array.from(plain.output).length
    assert.deepEqual(Array.from(strict.output).slice(0, end), Array.from(plain.output))
    assert.ok(f.strict >= 15 && f.echo === 0 && f.verifyEvents === 0, JSON.stringify(f))
    assert.ok(f.decodeSteps < end / 2, JSON.stringify(f))
    // Rows fire only after the model itself wrote a distinctive token: the first token of the
    // reply is always the model's.
    assert.equal(strict.output[0], plain.output[0])
  })

  test('no rows without tools, or where the template renders no tool calls', async () => {
    const noTools = await run('strict', { chat: {} })
    assert.equal(noTools.result.metrics.fill.strict, 0)
    const e = mlx.createEngine(model, { fill: 'strict' }) // SmolLM2's own template: no tool calls
    try {
      const o = await e.open({ messages: messages.slice(2), chat: { tools }, maxTokens: 12 }, { output: 'collect' }).result
      assert.equal(o.result.metrics.fill.strict, 0)
    } finally {
      await e.close()
    }
  })

  test('the server fills the same way (createServer option fill)', async () => {
    const { default: OpenAI } = require('openai')
    const ctx = mlx.loadContext(fixture('smollm2-f32'), { chatTemplate: source })
    const server = mlx.createServer(ctx, 0, { log: 'off', fill: 'strict' })
    try {
      const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused' })
      const r = await client.chat.completions.create({ model: 'smollm2-f32', messages: messages.map((m) => (m.tool_calls ? { ...m, tool_calls: m.tool_calls.map((c) => ({ ...c, function: { ...c.function, arguments: JSON.stringify(c.function.arguments) } })) } : m)), tools, max_tokens: 30, temperature: 0 })
      const c = r.choices[0].message.tool_calls[0]
      assert.deepEqual([c.function.name, JSON.parse(c.function.arguments)], ['get_weather', { city: 'London' }])
    } finally {
      await server.close()
    }
  })
})
