'use strict'
// Embeddings (mlx-bun's embedOne / embedMany): the last hidden state at an appended end-of-text
// token, L2-normalised, against mlx-lm 0.32.2's `model.model(ids)[0, -1]` (scripts/fixtures.sh)
// on real SmolLM2 (f32) and on a tiny random Qwen3 whose longest row spans two prefill chunks.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')

const mlx = require('..')
const { fixture, readJson, cosine } = require('./helpers')

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0))

function assertClose(ours, theirs, what) {
  const c = cosine(ours, theirs)
  assert.ok(c >= 0.99999, `${what}: cosine ${c}`)
  assert.ok(Math.abs(norm(ours) - 1) < 1e-5, `${what}: norm ${norm(ours)}`)
}

describe('embeddings on SmolLM2 (real weights, f32)', () => {
  const spec = readJson('spec-embed.json')
  const ref = readJson('ref-embed.json')
  let model, tok
  before(async () => {
    model = await mlx.loadModel(fixture('smollm2-f32'))
    tok = mlx.loadTokenizer(fixture('smollm2-f32'))
  })
  after(() => model.dispose())

  test("embedOne and embedMany give mlx-lm's vectors for mlx-lm's ids", async () => {
    const plain = spec.embed.map((e, i) => ({ ...e, i })).filter((e) => !e.instruction)
    const many = await mlx.embedMany(model, tok, plain.map((e) => e.text))
    assert.equal(many.length, plain.length)
    for (const [k, e] of plain.entries()) {
      assert.equal(many[k].tokens, ref.embeddings[e.i].ids.length, `text ${e.i}: ids`)
      assertClose(many[k].vector, ref.embeddings[e.i].vector, `text ${e.i}`)
    }
    for (const [i, e] of spec.embed.entries()) {
      // The ids themselves: the text in the query format, no special tokens, then <|endoftext|>.
      const ids = [...tok.encode(mlx.withInstruction(e.text, e.instruction), false), tok.tokenToId('<|endoftext|>')]
      assert.deepEqual(ids, ref.embeddings[i].ids, `text ${i}: ids`)
      const one = await mlx.embedOne(model, tok, e.text, e.instruction)
      assert.ok(one.vector instanceof Float32Array)
      assert.equal(one.tokens, ids.length)
      assertClose(one.vector, ref.embeddings[i].vector, `embedOne ${i}`)
    }
  })

  test('embedMany equals embedOne row by row, in the order given', async () => {
    const texts = [spec.embed[4].text, 'short', spec.embed[0].text, '', spec.embed[3].text]
    const many = await mlx.embedMany(model, tok, texts, 'Classify the topic')
    for (const [i, t] of texts.entries()) {
      const one = await mlx.embedOne(model, tok, t, 'Classify the topic')
      assert.equal(many[i].tokens, one.tokens)
      assertClose(many[i].vector, one.vector, `row ${i}`)
    }
    assert.deepEqual(await mlx.embedMany(model, tok, []), [])
  })

  test('arguments are checked; ids outside the vocabulary are refused', async () => {
    const code = (c) => (e) => e.code === c
    assert.throws(() => mlx.embedOne(model, tok, 42), code('INVALID_OPTION'))
    assert.throws(() => mlx.embedOne({}, tok, 'x'), code('INVALID_OPTION'))
    assert.throws(() => mlx.embedOne(model, {}, 'x'), code('INVALID_OPTION'))
    assert.throws(() => mlx.embedMany(model, tok, 'x'), code('INVALID_OPTION'))
    assert.throws(() => mlx.embedMany(model, tok, ['x'], 7), code('INVALID_OPTION'))
    await assert.rejects(model.embedPooled([[1, 2], []]), code('INVALID_PROMPT'))
    await assert.rejects(model.embedPooled([[1, 49152]]), code('INVALID_PROMPT'))
  })

  test('withInstruction and isEmbeddingModel', () => {
    assert.equal(mlx.withInstruction('Where is Paris?', 'Find the answer'), 'Instruct: Find the answer\nQuery:Where is Paris?')
    assert.equal(mlx.withInstruction('a document'), 'a document')
    assert.equal(mlx.withInstruction('a document', ''), 'a document')
    assert.equal(mlx.isEmbeddingModel(model), true)
    assert.equal(mlx.isEmbeddingModel(tok), false)
  })
})

test('tiny Qwen3: embedPooled over ids equals mlx-lm, a 2100-id row (two prefill chunks) in the batch', async () => {
  const ref = readJson('ref-tiny-embed.json')
  const model = await mlx.loadModel(fixture('tiny/qwen3'))
  try {
    const rows = ref.embeddings.map((e) => e.ids)
    assert.ok(rows.some((r) => r.length > 2048))
    const batch = await model.embedPooled(rows)
    for (const [i, e] of ref.embeddings.entries()) {
      assertClose(batch[i], e.vector, `row ${i} (${e.ids.length} ids) in the batch`)
      const [alone] = await model.embedPooled([Uint32Array.from(e.ids)])
      assertClose(alone, e.vector, `row ${i} alone`)
    }
  } finally {
    model.dispose()
  }
})
