'use strict'
// The prefix cache on real weights: a chat's next turn starts from the caches its last turn left
// (SmolLM2-135M f32), sessions arriving with one system prompt prefill it once, Gemma 3's
// rotating caches are never trimmed once wrapped; every output equals a cold run of the same
// prompt on an engine without the cache.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')

const mlx = require('..')
const { fixture, expectCode } = require('./helpers')

const TOPICS = ['rivers', 'mountains', 'cities', 'music', 'stars', 'forests']
/** A system prompt of `rules` rules, about 17 tokens each. */
const system = (rules) =>
  Array.from(
    { length: rules },
    (_, i) => `Rule ${i + 1}: when asked about ${TOPICS[i % TOPICS.length]}, answer briefly and mention example ${(i * 7) % 13}.`,
  ).join(' ')
const SYSTEM = system(30)
const QUESTIONS = [
  'Name a famous river.',
  'Which mountain is the tallest?',
  'Tell me about a big city.',
  'What music do you like?',
  'How far away are the stars?',
  'Why are forests important?',
  'List the longest rivers in Europe.',
  'Describe a quiet mountain village.',
]

const common = (a, b) => {
  let n = 0
  while (n < a.length && n < b.length && a[n] === b[n]) n++
  return n
}

async function run(engine, request) {
  const o = await engine.open(request, { output: 'collect' }).result
  assert.equal(o.status, 'completed', JSON.stringify(o.error))
  return { tokens: Array.from(o.output), metrics: o.result.metrics, finishReason: o.result.finishReason }
}

describe('prefix cache on SmolLM2 (real weights, f32)', () => {
  let model, tok, template, cold
  const encode = (messages) => Array.from(tok.encode(template.render(messages), false))
  before(async () => {
    model = await mlx.loadModel(fixture('smollm2-f32'))
    tok = mlx.loadTokenizer(fixture('smollm2-f32'))
    template = mlx.ChatTemplate.load(fixture('smollm2-f32'))
    cold = mlx.createEngine(model, { prefixCacheBytes: 0 })
  })
  after(async () => {
    await cold.close()
    model.dispose()
  })

  test('five chat turns over an 800-token history: each starts from the last; the first hit and the last equal cold runs', async () => {
    const engine = mlx.createEngine(model)
    try {
      const messages = [{ role: 'system', content: system(36) }]
      let held = null // the tokens the cache holds after the last turn
      let prompt = []
      for (const [turn, question] of QUESTIONS.slice(0, 5).entries()) {
        messages.push({ role: 'user', content: question })
        prompt = encode(messages)
        const request = { promptTokens: prompt, maxTokens: 24, sessionId: 'chat-1' }
        const hot = await run(engine, request)
        // Against a cold run: the first hit and the last (each cold run is a 600- to 800-token
        // prefill; the turns between start the same way).
        if (turn === 1 || turn === 4) {
          const ref = await run(cold, request)
          assert.deepEqual(hot.tokens, ref.tokens, `turn ${turn}`)
          assert.equal(ref.metrics.cachedTokens, 0)
        }
        const expected = held ? Math.min(common(held, prompt), prompt.length - 1) : 0
        assert.equal(hot.metrics.cachedTokens, expected, `turn ${turn}`)
        if (turn > 0) assert.ok(expected > held.length - 29, `turn ${turn} reuses the history (${expected} of ${held.length})`)
        // Prompt and every token forwarded: the output, and the EOS when generation stopped on it.
        const forwarded = [...prompt, ...hot.tokens, ...(hot.finishReason === 'stop' ? [tok.eosTokenId] : [])]
        assert.ok(hot.metrics.cacheTokens <= forwarded.length)
        held = forwarded.slice(0, hot.metrics.cacheTokens)
        messages.push({ role: 'assistant', content: tok.decode(hot.tokens, true) })
      }
      assert.ok(prompt.length >= 800, `history of ${prompt.length} tokens`)
      const s = engine.stats.prefixCache
      assert.equal(s.hits, 4)
      assert.equal(s.misses, 1)
      assert.equal(s.entries, 1)
      assert.ok(s.bytes > 0 && s.bytes <= 2e9)
    } finally {
      await engine.close()
    }
  })

  test('eight sessions arriving with one system prompt prefill it once; the first, second and last equal their runs alone', async () => {
    const engine = mlx.createEngine(model, { maxActive: 8 })
    try {
      const prompts = QUESTIONS.map((q) => encode([{ role: 'system', content: SYSTEM }, { role: 'user', content: q }]))
      const outs = await Promise.all(prompts.map((p) => run(engine, { promptTokens: p, maxTokens: 12 })))
      const shared = prompts.slice(1).map((p) => common(p, prompts[0]))
      assert.ok(Math.min(...shared) >= 450, `shared prefix ${Math.min(...shared)}`)
      assert.equal(outs[0].metrics.cachedTokens, 0)
      for (let i = 1; i < prompts.length; i++) {
        // From the earliest session sharing the most with it (all share the system prompt).
        const best = Math.max(...prompts.slice(0, i).map((p) => common(p, prompts[i])))
        assert.equal(outs[i].metrics.cachedTokens, Math.min(best, prompts[i].length - 1), `session ${i}`)
      }
      // Each later session started from a running one (or, once one had finished, from the
      // caches it left): seven prefills of the shared part saved.
      const s = engine.stats.prefixCache
      assert.ok(s.sharedPrefills >= 1)
      assert.equal(s.sharedPrefills + s.hits, 7)
      // Against runs alone: the first session (nothing to start from), the second and the last
      // (each from a running session's prefill or a cached one, the ways all seven later ones
      // start); a cold run of each of the eight cost a 480-token prefill.
      for (const i of [0, 1, prompts.length - 1]) {
        assert.deepEqual(outs[i].tokens, (await run(cold, { promptTokens: prompts[i], maxTokens: 12 })).tokens, `session ${i}`)
      }
    } finally {
      await engine.close()
    }
  })

  test('namespaces isolate; a session continuation beats a longer foreign prefix; 0 disables', async () => {
    const engine = mlx.createEngine(model)
    try {
      const base = encode([{ role: 'system', content: system(16) }, { role: 'user', content: QUESTIONS[0] }])
      await run(engine, { promptTokens: base, maxTokens: 4, cacheNamespace: 'a' })
      const other = await run(engine, { promptTokens: base, maxTokens: 4, cacheNamespace: 'b' })
      assert.equal(other.metrics.cachedTokens, 0)
      const again = await run(engine, { promptTokens: base, maxTokens: 4, cacheNamespace: 'a' })
      assert.equal(again.metrics.cachedTokens, base.length - 1)
      // A short conversation of session "mine" and a longer one of another session, side by side,
      // leave two entries.
      const mine = base.slice(0, 120)
      await Promise.all([
        run(engine, { promptTokens: mine, maxTokens: 2, cacheNamespace: 'c', sessionId: 'mine' }),
        run(engine, { promptTokens: base, maxTokens: 2, cacheNamespace: 'c', sessionId: 'theirs' }),
      ])
      const next = await run(engine, { promptTokens: [...base, 42], maxTokens: 2, cacheNamespace: 'c', sessionId: 'mine' })
      assert.ok(next.metrics.cachedTokens >= 120 && next.metrics.cachedTokens <= 121, `${next.metrics.cachedTokens}`)
      const foreign = await run(engine, { promptTokens: [...base, 42], maxTokens: 2, cacheNamespace: 'c' })
      assert.equal(foreign.metrics.cachedTokens, base.length)
      assert.equal((await run(cold, { promptTokens: base, maxTokens: 2 })).metrics.cachedTokens, 0)
      assert.equal(cold.stats.prefixCache.entries, 0)
    } finally {
      await engine.close()
    }
  })

  test('options are checked: prefixCacheBytes a non-negative integer, namespaces strings', async () => {
    const invalid = (f, pattern) => assert.throws(f, (e) => expectCode(e, 'INVALID_OPTION', pattern))
    invalid(() => mlx.createEngine(model, { prefixCacheBytes: -1 }), /^prefixCacheBytes/)
    invalid(() => mlx.createEngine(model, { prefixCacheBytes: 1.5 }), /^prefixCacheBytes/)
    invalid(() => mlx.createEngine(model, { prefixCacheByte: 1 }), /prefixCacheBytes/)
    invalid(() => cold.open({ promptTokens: [1, 2], cacheNamespace: 3 }))
    invalid(() => mlx.generate(model, [1, 2], { sessionId: 'x' }))
  })
})

describe('prefix cache on Gemma-3-270M (real weights, sliding-window layers)', () => {
  let model, tok, template
  before(async () => {
    model = await mlx.loadModel(fixture('gemma3-f32'))
    tok = mlx.loadTokenizer(fixture('gemma3-f32'))
    // Neither fixture carries Gemma's chat template; this is its turn format.
    template = mlx.ChatTemplate.fromString(
      "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n" +
        '{{ m.content | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}',
      '<bos>',
    )
  })
  after(() => model.dispose())

  test('a wrapped rotating cache is never a trimmed hit; multi-turn tokens equal cold runs', async () => {
    const engine = mlx.createEngine(model)
    const cold = mlx.createEngine(model, { prefixCacheBytes: 0 })
    try {
      const messages = [{ role: 'user', content: `${system(28)}\n\n${QUESTIONS[0]}` }]
      const prompt = Array.from(tok.encode(template.render(messages), false))
      assert.ok(prompt.length > 512, `prompt of ${prompt.length} tokens wraps the 512-token window`)
      const first = await run(engine, { promptTokens: prompt, maxTokens: 8 })
      // A prompt sharing only the first 100 tokens would need the cache trimmed back: not once
      // wrapped, so it is a miss, and the entry stays.
      const diverging = await run(engine, { promptTokens: [...prompt.slice(0, 100), 7, 8], maxTokens: 1 })
      assert.equal(diverging.metrics.cachedTokens, 0)
      assert.equal(engine.stats.prefixCache.hits, 0)
      // The next turn extends what the cache holds: no trim needed, a hit.
      const forwarded = [...prompt, ...first.tokens, ...(first.finishReason === 'stop' ? [tok.eosTokenId] : [])]
      const held = forwarded.slice(0, first.metrics.cacheTokens)
      messages.push({ role: 'assistant', content: tok.decode(first.tokens, true) }, { role: 'user', content: QUESTIONS[1] })
      const next = Array.from(tok.encode(template.render(messages), false))
      assert.equal(common(held, next), held.length, 'the next turn starts with every token the cache holds')
      const hot = await run(engine, { promptTokens: next, maxTokens: 8 })
      assert.equal(hot.metrics.cachedTokens, held.length)
      assert.deepEqual(hot.tokens, (await run(cold, { promptTokens: next, maxTokens: 8 })).tokens)
    } finally {
      await engine.close()
      await cold.close()
    }
  })
})
