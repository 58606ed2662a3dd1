'use strict'
// Grammar-constrained decoding on real weights (SmolLM2-135M f32): JSON schemas whose every
// output must parse and validate (ajv), sharing the continuous batch and equal to runs alone; regular
// expressions and Lark grammars; a permissive grammar that must not change greedy tokens; and
// grammars that do not compile.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const Ajv = require('ajv')

const mlx = require('..')
const { fixture } = require('./helpers')

const str = (maxLength = 24) => ({ type: 'string', minLength: 1, maxLength })
const SCHEMAS = [
  ['a person', { type: 'object', properties: { name: str(), age: { type: 'integer', minimum: 0, maximum: 120 } }, required: ['name', 'age'], additionalProperties: false }],
  ['a city and its country', { type: 'object', properties: { city: str(), country: str() }, required: ['city', 'country'], additionalProperties: false }],
  ['a colour', { type: 'object', properties: { color: { enum: ['red', 'green', 'blue'] } }, required: ['color'], additionalProperties: false }],
  ['a yes or no answer', { type: 'boolean' }],
  ['a number between 1 and 10', { type: 'integer', minimum: 1, maximum: 10 }],
  ['a temperature in Celsius', { type: 'object', properties: { celsius: { type: 'number', minimum: -50, maximum: 60 } }, required: ['celsius'], additionalProperties: false }],
  ['three fruits', { type: 'array', items: str(16), minItems: 3, maxItems: 3 }],
  ['up to two hobbies', { type: 'array', items: { enum: ['reading', 'chess', 'running', 'music'] }, minItems: 1, maxItems: 2 }],
  ['a book', { type: 'object', properties: { title: str(), author: str(), year: { type: 'integer', minimum: 1400, maximum: 2030 } }, required: ['title', 'author', 'year'], additionalProperties: false }],
  ['a point', { type: 'object', properties: { x: { type: 'integer', minimum: -100, maximum: 100 }, y: { type: 'integer', minimum: -100, maximum: 100 } }, required: ['x', 'y'], additionalProperties: false }],
  ['a user with an address', {
    type: 'object',
    properties: { name: str(), address: { type: 'object', properties: { street: str(), zip: { type: 'string', pattern: '^[0-9]{5}$' } }, required: ['street', 'zip'], additionalProperties: false } },
    required: ['name', 'address'], additionalProperties: false,
  }],
  ['a product with optional fields', { type: 'object', properties: { sku: { type: 'string', pattern: '^[A-Z]{3}-[0-9]{3}$' }, price: { type: 'number', minimum: 0, maximum: 1000 }, note: str() }, required: ['sku', 'price'], additionalProperties: false }],
  ['a date', { type: 'object', properties: { date: { type: 'string', pattern: '^[0-9]{4}-[0-9]{2}-[0-9]{2}$' } }, required: ['date'], additionalProperties: false }],
  ['an id or a name', { anyOf: [{ type: 'integer', minimum: 0, maximum: 9999 }, str(12)] }],
  ['a shape', {
    anyOf: [
      { type: 'object', properties: { kind: { const: 'circle' }, radius: { type: 'integer', minimum: 1, maximum: 50 } }, required: ['kind', 'radius'], additionalProperties: false },
      { type: 'object', properties: { kind: { const: 'square' }, side: { type: 'integer', minimum: 1, maximum: 50 } }, required: ['kind', 'side'], additionalProperties: false },
    ],
  }],
  ['a list of people', {
    type: 'array', minItems: 1, maxItems: 2,
    items: { type: 'object', properties: { name: str(12), age: { type: 'integer', minimum: 0, maximum: 99 } }, required: ['name', 'age'], additionalProperties: false },
  }],
  ['a matrix of two rows', { type: 'array', minItems: 2, maxItems: 2, items: { type: 'array', minItems: 2, maxItems: 2, items: { type: 'integer', minimum: 0, maximum: 9 } } }],
  ['a status', { type: 'object', properties: { ok: { type: 'boolean' }, code: { type: 'integer', enum: [200, 404, 500] } }, required: ['ok', 'code'], additionalProperties: false }],
  ['a greeting', { type: 'object', properties: { greeting: { type: 'string', pattern: '^(Hello|Hi|Hey), [A-Z][a-z]{1,10}!$' } }, required: ['greeting'], additionalProperties: false }],
  ['a tagged note', { type: 'object', properties: { text: str(32), tags: { type: 'array', items: { enum: ['work', 'home', 'urgent'] }, maxItems: 3 } }, required: ['text', 'tags'], additionalProperties: false }],
  ['a nullable middle name', { type: 'object', properties: { first: str(12), middle: { anyOf: [{ type: 'null' }, str(12)] } }, required: ['first', 'middle'], additionalProperties: false }],
  ['a recipe', {
    type: 'object',
    properties: { dish: str(), minutes: { type: 'integer', minimum: 1, maximum: 240 }, steps: { type: 'array', items: str(40), minItems: 1, maxItems: 3 } },
    required: ['dish', 'minutes', 'steps'], additionalProperties: false,
  }],
]

const ask = (what, schema) => [
  { role: 'system', content: 'You answer with JSON only.' },
  { role: 'user', content: `Give me ${what} as JSON matching this schema: ${JSON.stringify(schema)}` },
]

/** The fixture's model, its tokenizer and an engine: loaded before the suite's tests, closed after. */
function onModel(name) {
  const m = {}
  before(async () => {
    const dir = fixture(name)
    m.model = await mlx.loadModel(dir)
    m.tokenizer = mlx.loadTokenizer(dir)
    m.engine = mlx.createEngine(m.model)
  })
  after(async () => {
    await m.engine.close()
    m.model.dispose()
  })
  return m
}

describe('grammar-constrained decoding on SmolLM2 (real weights)', () => {
  const m = onModel('smollm2-f32')
  const ajv = new Ajv({ strict: true, allErrors: true })

  const run = (messages, grammar, extra = {}) =>
    m.engine.open({ messages, grammar, maxTokens: 160, ...extra }, { output: 'collect' }).result.then((o) => {
      assert.equal(o.status, 'completed', JSON.stringify(o.error))
      return { text: m.tokenizer.decode(Array.from(o.output)), finishReason: o.result.finishReason }
    })

  const check = (what, schema, out) => {
    assert.equal(out.finishReason, 'stop', `${what}: ended by ${out.finishReason}: ${out.text}`)
    let value
    assert.doesNotThrow(() => (value = JSON.parse(out.text)), `${what}: not JSON: ${out.text}`)
    assert.ok(ajv.validate(schema, value), `${what}: ${out.text} fails the schema: ${ajv.errorsText()}`)
  }

  // Every schema through the continuous batch (eight rows at a time, the engine's maxActive), and
  // three of them again alone: a batched grammar row decodes as it would alone.
  test(`${SCHEMAS.length} JSON schemas sharing the continuous batch: every output parses and validates; rows equal their runs alone`, async () => {
    assert.ok(SCHEMAS.length >= 20)
    const before = mlx.testing.batchCounts()
    const outs = await Promise.all(SCHEMAS.map(([what, schema]) => run(ask(what, schema), { jsonSchema: schema })))
    SCHEMAS.forEach(([what, schema], i) => check(what, schema, outs[i]))
    const after = mlx.testing.batchCounts()
    assert.ok(after.rows - before.rows >= 8 * 4, 'grammar rows decoded in shared steps')
    for (const i of [0, 10, SCHEMAS.length - 1]) {
      const [what, schema] = SCHEMAS[i]
      assert.equal((await run(ask(what, schema), { jsonSchema: schema })).text, outs[i].text, what)
    }
  })

  test('grammar rows and plain rows in one batch: the plain rows keep their tokens', async () => {
    const prompt = [{ role: 'user', content: 'Write a haiku about the sea.' }]
    const alone = await m.engine.open({ messages: prompt, maxTokens: 24 }, { output: 'collect' }).result
    const [plain, constrained] = await Promise.all([
      m.engine.open({ messages: prompt, maxTokens: 24 }, { output: 'collect' }).result,
      run(ask(SCHEMAS[0][0], SCHEMAS[0][1]), { jsonSchema: SCHEMAS[0][1] }),
    ])
    assert.deepEqual(Array.from(plain.output), Array.from(alone.output))
    check(SCHEMAS[0][0], SCHEMAS[0][1], constrained)
  })

  test('a grammar that allows every text leaves greedy tokens unchanged, up to the same stop', async () => {
    for (const content of ['What is the capital of France?', 'Write a haiku about the sea.']) {
      const prompt = [{ role: 'user', content }]
      const plain = await m.engine.open({ messages: prompt, maxTokens: 40 }, { output: 'collect' }).result
      const free = await m.engine.open({ messages: prompt, maxTokens: 40, grammar: { regex: '(.|\\n)*' } }, { output: 'collect' }).result
      assert.deepEqual(Array.from(free.output), Array.from(plain.output))
      assert.equal(free.result.finishReason, plain.result.finishReason)
    }
  })

  test('with no stop tokens, the grammar never ends the output with one', async () => {
    const messages = [{ role: 'user', content: 'What is the capital of France?' }]
    const o = await m.engine.open({ messages, maxTokens: 24, eosTokenIds: [], grammar: { regex: '(.|\\n)*' } }, { output: 'collect' }).result
    assert.equal(o.result.finishReason, 'length')
    assert.equal(o.output.length, 24)
    assert.ok(!Array.from(o.output).some((t) => m.tokenizer.eosTokenIds.includes(t)))
  })

  test('regular expressions: the output matches, and the row ends when the expression is complete', async () => {
    const cases = [
      ['Give me a phone number.', '[0-9]{3}-[0-9]{4}'],
      ['Is the sky blue? Answer yes or no.', '(yes|no)'],
      ['Write a time of day.', '([01][0-9]|2[0-3]):[0-5][0-9]'],
    ]
    for (const [q, regex] of cases) {
      const out = await run([{ role: 'user', content: q }], { regex })
      assert.match(out.text, new RegExp(`^${regex}$`))
      assert.equal(out.finishReason, 'stop')
    }
  })

  test('a Lark grammar: arithmetic expressions', async () => {
    const lark = `
      start: expr
      expr: term (("+" | "-") term)*
      term: NUMBER (("*" | "/") NUMBER)*
      NUMBER: /[0-9]{1,3}/
    `
    const out = await run([{ role: 'user', content: 'Write a short arithmetic expression.' }], { lark }, { maxTokens: 24 })
    assert.match(out.text, /^[0-9]{1,3}([+\-*/][0-9]{1,3})*$/)
  })

  test('seeded sampling under a grammar is reproducible and valid', async () => {
    const [what, schema] = SCHEMAS[8]
    const opts = { temperature: 0.8, seed: 7 }
    const a = await run(ask(what, schema), { jsonSchema: schema }, opts)
    const b = await run(ask(what, schema), { jsonSchema: schema }, opts)
    assert.equal(a.text, b.text)
    check(what, schema, a)
  })

  test('generate() takes a grammar too', async () => {
    const ids = m.tokenizer.encode('The colour of a clear sky, as JSON: ')
    const gen = mlx.generate(m.model, ids, { grammar: { jsonSchema: SCHEMAS[2][1] }, maxTokens: 40 })
    const tokens = []
    for await (const t of gen) tokens.push(t.token)
    assert.equal(gen.finishReason, 'stop')
    assert.ok(['red', 'green', 'blue'].includes(JSON.parse(m.tokenizer.decode(tokens)).color))
  })

  test('grammars that do not compile are refused when the request is opened', () => {
    const messages = [{ role: 'user', content: 'hi' }]
    for (const grammar of [{ regex: '(' }, { lark: 'start: undefined_rule' }, { jsonSchema: { type: 'no-such-type' } }, { jsonSchema: { $ref: '#/nope' } }]) {
      assert.throws(() => m.engine.open({ messages, grammar }), { code: 'INVALID_GRAMMAR' }, JSON.stringify(grammar))
      assert.throws(() => mlx.generate(m.model, [1, 2], { grammar }), { code: 'INVALID_GRAMMAR' }, JSON.stringify(grammar))
    }
    for (const grammar of [{}, { jsonSchema: {}, regex: 'a' }, { regex: 3 }, { yaml: 'x' }, 'a*']) {
      assert.throws(() => m.engine.open({ messages, grammar }), { code: 'INVALID_OPTION' }, JSON.stringify(grammar))
    }
  })

  test('grammarJump: forced text is fed in one step, the outputs still validate', async () => {
    const jumping = mlx.createEngine(m.model, { grammarJump: true })
    try {
      const picked = [SCHEMAS[0], SCHEMAS[8], SCHEMAS[10]]
      const before = mlx.testing.batchCounts()
      const outs = await Promise.all(picked.map(([what, schema]) =>
        jumping.open({ messages: ask(what, schema), grammar: { jsonSchema: schema }, maxTokens: 160 }, { output: 'collect' }).result))
      const after = mlx.testing.batchCounts()
      const generated = outs.reduce((n, o) => n + o.result.metrics.generatedTokens, 0)
      outs.forEach((o, i) => check(picked[i][0], picked[i][1], { text: m.tokenizer.decode(Array.from(o.output)), finishReason: o.result.finishReason }))
      // Rows stepped together: fewer row-steps than tokens, as forced tokens ride along.
      assert.ok(after.rows - before.rows < generated - 6, `${after.rows - before.rows} row-steps for ${generated} tokens`)
      const placed = mlx.resolveExecution({ hasVision: false, hasAdapters: false, hasRepetitionPenalty: false, userSeed: false, kvQuant: false, turboQuant: false, hasLogitsExtras: false, hasGrammar: true, wantsLogprobs: false, hasDraft: false }, jumping.capabilities, { pagedKv: false, fill: false, grammarJump: true })
      assert.equal(placed.method, 'speculative')
      assert.equal(placed.grammarJump, true)
      assert.throws(() => mlx.createEngine(m.model, { grammarJump: 1 }), { code: 'INVALID_OPTION' })
      // With logprobs (speculativeLogprobs): every token has them, those of the masked
      // distribution, where a forced token is certain.
      const [what, schema] = SCHEMAS[0]
      const s = jumping.open({ messages: ask(what, schema), grammar: { jsonSchema: schema }, maxTokens: 160, logprobs: true, topLogprobs: 2 })
      const tokens = []
      const lps = []
      for await (const e of s.events) {
        if (e.type !== 'committed') continue
        tokens.push(...e.tokenIds)
        lps.push(...e.logprobs)
      }
      assert.equal(lps.length, tokens.length)
      const certain = lps.filter((l, i) => l.logprob === 0 && l.top.length === 1 && l.top[0].id === tokens[i])
      assert.ok(certain.length >= 1, `${certain.length} certain of ${tokens.length}`)
      assert.ok(lps.every((l) => l.logprob <= 0 && l.top.length >= 1))
      check(what, schema, { text: m.tokenizer.decode(tokens), finishReason: (await s.result).result.finishReason })
    } finally {
      await jumping.close()
    }
  })

  test('placement: grammar rows join the continuous batch and use the prefix cache', () => {
    const c = m.engine.capabilities
    assert.equal(c.grammarBatch, true)
    const placed = mlx.resolveExecution({ hasVision: false, hasAdapters: false, hasRepetitionPenalty: false, userSeed: false, kvQuant: false, turboQuant: false, hasLogitsExtras: false, hasGrammar: true, wantsLogprobs: false, hasDraft: false }, c)
    assert.equal(placed.mechanism, 'continuous')
    assert.equal(placed.promptCache, true)
    assert.deepEqual([...placed.reasons], [])
  })
})

// Gemma's vocabulary is SentencePiece-style (byte fallback, '▁' for spaces), SmolLM2's byte-level
// BPE: llguidance reads the two differently.
describe('grammar-constrained decoding on Gemma-3-270M (real weights)', () => {
  const m = onModel('gemma3-f32')

  test('a JSON schema with spaces in its strings, and a regex', async () => {
    const schema = { type: 'object', properties: { title: { type: 'string', pattern: '^[A-Z][a-z]+( [a-z]+){1,3}$' }, pages: { type: 'integer', minimum: 10, maximum: 999 } }, required: ['title', 'pages'], additionalProperties: false }
    const o = await m.engine.open({ promptTokens: m.tokenizer.encode(`A book, as JSON with a title and a page count: `), grammar: { jsonSchema: schema }, maxTokens: 60 }, { output: 'collect' }).result
    const text = m.tokenizer.decode(Array.from(o.output))
    assert.equal(o.result.finishReason, 'stop', text)
    assert.ok(new Ajv().validate(schema, JSON.parse(text)), text)
    const r = await m.engine.open({ promptTokens: m.tokenizer.encode('The date of the first moon landing was '), grammar: { regex: '[0-9]{4}-[0-9]{2}-[0-9]{2}' }, maxTokens: 20 }, { output: 'collect' }).result
    assert.match(m.tokenizer.decode(Array.from(r.output)), /^[0-9]{4}-[0-9]{2}-[0-9]{2}$/)
  })
})
