#!/usr/bin/env node
'use strict'
// Grammar overhead: decode throughput of the same requests without a grammar, with a grammar
// that allows every token (same tokens as without: the cost of computing and applying the mask)
// and with a JSON schema (other tokens, the cost of a real grammar; then with grammarJump,
// forced text fed in one step), one request alone and eight at once in the continuous batch. Prints one table; asserts nothing.
//
//   node scripts/bench-grammar.js [--model fixtures/smollm2-f32] [--tokens 64] [--repeats 3]
const path = require('node:path')
const mlx = require('..')
const { arg, runtime } = require('./args')

const ROOT = path.join(__dirname, '..')
const modelDir = path.resolve(arg('model', path.join(ROOT, 'fixtures/smollm2-f32')))
const tokens = Number(arg('tokens', '64'))
const repeats = Number(arg('repeats', '3'))

const SCHEMA = {
  type: 'array', minItems: 40, maxItems: 40,
  items: { type: 'object', properties: { name: { type: 'string', maxLength: 16 }, calories: { type: 'integer', minimum: 0, maximum: 999 } }, required: ['name', 'calories'], additionalProperties: false },
}
// [name, grammar, engine options]
const CASES = [
  ['no grammar', undefined, {}],
  ['grammar allowing everything', { regex: '(.|\\n)*' }, {}],
  ['JSON schema', { jsonSchema: SCHEMA }, {}],
  ['JSON schema, grammarJump', { jsonSchema: SCHEMA }, { grammarJump: true }],
]

async function main() {
  const model = await mlx.loadModel(modelDir)
  const prompt = (i) => [{ role: 'user', content: `List fruits with their calories as JSON (${i}).` }]
  const once = async (engine, batch, grammar) => {
    const t0 = performance.now()
    const outs = await Promise.all(
      Array.from({ length: batch }, (_, i) => engine.open({ messages: prompt(i), maxTokens: tokens, eosTokenIds: [], grammar }, { output: 'collect' }).result),
    )
    const wall = (performance.now() - t0) / 1e3
    const generated = outs.reduce((n, o) => n + o.result.metrics.generatedTokens, 0)
    const decode = outs.reduce((s, o) => s + o.result.metrics.decodeTps, 0) / batch
    return { tps: generated / wall, decode, generated }
  }
  const engines = new Map()
  const engineFor = (options) => {
    const key = JSON.stringify(options)
    if (!engines.has(key)) engines.set(key, mlx.createEngine(model, options))
    return engines.get(key)
  }
  await once(engineFor({}), 1, { jsonSchema: SCHEMA }) // builds the vocabulary index once, warms up
  console.log(`# grammar overhead — ${path.basename(modelDir)}, ${tokens} tokens per request, best of ${repeats}, ${runtime}`)
  console.log('| batch | requests | aggregate tok/s (wall) | decode tok/s per row | vs no grammar |')
  console.log('|---|---|---|---|---|')
  for (const batch of [1, 8]) {
    let base
    for (const [name, grammar, options] of CASES) {
      let best = null
      for (let r = 0; r < repeats; r++) {
        const x = await once(engineFor(options), batch, grammar)
        if (!best || x.tps > best.tps) best = x
      }
      base ??= best
      const ratio = best.tps / base.tps
      console.log(`| ${batch} | ${name} | ${best.tps.toFixed(1)} | ${best.decode.toFixed(1)} | ${ratio.toFixed(3)}× (${((1 - ratio) * 100).toFixed(1)} % slower; ${((1e3 / best.tps - 1e3 / base.tps) * batch).toFixed(2)} ms per row-token) |`)
    }
  }
  for (const e of engines.values()) await e.close()
  model.dispose()
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
