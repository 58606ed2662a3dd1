'use strict'
// The malformed-input corpus (scripts/malformed-corpus.js): every entry fails with its typed
// error, the process stays alive, and a valid generation afterwards still works.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')

const mlx = require('..')
const { buildCorpus } = require('../scripts/malformed-corpus')
const { makeTinyLlama, tmpdir, collect, ROOT } = require('./helpers')

const CODES = new Set([...fs.readFileSync(path.join(ROOT, 'index.d.ts'), 'utf8').matchAll(/^ {2}\| '([A-Z_]+)'$/gm)].map((m) => m[1]))

function typed(e, code, name) {
  assert.ok(e instanceof Error, `${name}: expected an Error, got ${e}`)
  assert.ok(CODES.has(e.code), `${name}: code ${e.code} is not an ErrorCode (${e.message})`)
  if (code !== 'ANY') assert.equal(e.code, code, `${name}: ${e.code}: ${e.message}`)
  return true
}

describe('malformed-input corpus', () => {
  const dir = tmpdir('corpus')
  const entries = buildCorpus(dir)
  let model
  before(async () => {
    model = await mlx.loadModel(makeTinyLlama(path.join(dir, 'valid')))
  })
  after(async () => {
    assert.equal((await collect(mlx.generate(model, [1, 2], { maxTokens: 4, eosTokenIds: [] }))).tokens.length, 4)
    model.dispose()
  })

  test('the corpus covers every kind of input', () => {
    const kinds = new Set(entries.map((e) => e.kind))
    assert.deepEqual([...kinds].sort(), ['model', 'template', 'tokenizer'])
    assert.ok(entries.length >= 60, `${entries.length} entries`)
  })

  for (const e of entries) {
    test(`${e.name} → ${e.code}`, async () => {
      if (e.kind === 'model') {
        try {
          const m = await mlx.loadModel(e.path)
          // Only a flipped bit that the loader cannot tell from a real value may load; it still runs.
          assert.equal(e.code, 'ANY', `${e.name} loaded`)
          await collect(mlx.generate(m, [1], { maxTokens: 2 }))
          m.dispose()
        } catch (err) {
          typed(err, e.code, e.name)
        }
        try {
          mlx.loadModelConfig(e.path)
        } catch (err) {
          typed(err, 'ANY', `${e.name} (loadModelConfig)`)
        }
      } else if (e.kind === 'tokenizer') {
        assert.throws(() => mlx.loadTokenizer(e.path), (err) => typed(err, e.code, e.name))
      } else {
        assert.throws(() => {
          const template = mlx.ChatTemplate.load(e.path)
          template.render([{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hi' }])
        }, (err) => typed(err, e.code, e.name))
      }
    })
  }
})
