'use strict'
// Quantized KV caches (kvBits / kvGroupSize / quantizedKvStart / kvConfig) against mlx-lm 0.32.2's
// generate_step with the same kv_bits (references from scripts/fixtures.sh): SmolLM2 f32 (real
// weights) and a tiny random Qwen3 (head_dim 32) over a prompt longer than one 256-position block.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')

const mlx = require('..')
const { fixture, readJson, collect, expectCode, within, tmpdir } = require('./helpers')

async function run(model, ids, options) {
  const steps = []
  for await (const t of mlx.generate(model, ids, { eosTokenIds: [], logprobs: true, ...options })) steps.push(t)
  return { tokens: steps.map((t) => t.token), logprobs: steps.map((t) => t.logprobs.logprob) }
}

function assertLike(ours, ref, what, tolerance) {
  assert.deepEqual(ours.tokens, ref.tokens, `${what}: tokens`)
  const worst = Math.max(...ours.logprobs.map((lp, i) => Math.abs(lp - ref.token_logprobs[i])))
  assert.ok(worst <= tolerance, `${what}: token logprobs differ by up to ${worst}`)
}

describe('quantized KV caches on SmolLM2 f32 (real weights)', () => {
  let model
  before(async () => {
    model = await mlx.loadModel(fixture('smollm2-f32'))
  })
  after(() => model.dispose())

  for (const bits of [8, 4]) {
    test(`kvBits ${bits} (group 64, start 0): 32 greedy tokens on 3 prompts equal mlx-lm's`, async () => {
      const ref = readJson(`ref-f32-kv${bits}.json`)
      assert.deepEqual(ref.kv, { kv_bits: bits, kv_group_size: 64, quantized_kv_start: 0 })
      for (const [i, r] of ref.results.entries()) {
        const ours = await run(model, r.prompt_ids, { maxTokens: 32, kvBits: bits, kvGroupSize: 64, quantizedKvStart: 0 })
        assertLike(ours, r, `prompt ${i}`, 1e-3)
      }
    })
  }

  test('quantization changes the tokens, and waits for quantizedKvStart', async () => {
    const ref4 = readJson('ref-f32-kv4.json').results[0]
    const plain = await run(model, ref4.prompt_ids, { maxTokens: 32 })
    assert.notDeepEqual(plain.tokens, ref4.tokens, 'a 4-bit cache decodes differently from a plain one here')
    // mlx-bun's default start (5000) is beyond this prompt: the cache stays plain.
    assert.deepEqual((await run(model, ref4.prompt_ids, { maxTokens: 32, kvBits: 4 })).tokens, plain.tokens)
  })

  test('kvConfig quantizes the layers it lists (start 0 by default) and overrides kvBits', async () => {
    const ids = readJson('ref-f32-kv8.json').results[1].prompt_ids
    const layers = mlx.loadModelConfig(fixture('smollm2-f32')).text.numHiddenLayers
    const every = Array.from({ length: layers }, (_, layerIdx) => ({ layerIdx, bits: 8, groupSize: 64 }))
    const uniform = await run(model, ids, { maxTokens: 24, kvBits: 8, quantizedKvStart: 0 })
    assert.deepEqual(await run(model, ids, { maxTokens: 24, kvConfig: every, kvBits: 4 }), uniform)
    const some = await run(model, ids, { maxTokens: 24, kvConfig: every.slice(0, 2).map((e) => ({ ...e, bits: 2 })) })
    const plain = await run(model, ids, { maxTokens: 24 })
    assert.ok(some.logprobs.some((lp, i) => lp !== plain.logprobs[i]), 'two 2-bit layers change the numbers')
  })

  test('batched rows with quantized caches equal each run alone; the prefix cache keeps schemes apart', async () => {
    const prompts = readJson('ref-f32-kv8.json').results.map((r) => r.prompt_ids)
    const requests = [
      { promptTokens: prompts[0], maxTokens: 12, eosTokenIds: [], kvBits: 8, quantizedKvStart: 0 },
      { promptTokens: prompts[1], maxTokens: 12, eosTokenIds: [], kvBits: 4, quantizedKvStart: 0 },
      { promptTokens: prompts[2], maxTokens: 12, eosTokenIds: [] },
      { promptTokens: prompts[1], maxTokens: 12, eosTokenIds: [] },
    ]
    const one = async (engine, r) => {
      const o = await within(engine.open(r, { output: 'collect' }).result, 'a collect session', 120_000)
      assert.equal(o.status, 'completed', JSON.stringify(o.error))
      return Array.from(o.output)
    }
    const alone = []
    for (const r of requests) {
      const solo = mlx.createEngine(model, { prefixCacheBytes: 0 })
      alone.push(await one(solo, r))
      await solo.close()
    }
    const engine = mlx.createEngine(model, { maxActive: 4 })
    try {
      const before = mlx.testing.batchCounts().rows
      assert.deepEqual(await Promise.all(requests.map((r) => one(engine, r))), alone)
      assert.ok(mlx.testing.batchCounts().rows > before, 'the rows decoded in one batch')
      // Prompt 1 is now cached twice, plain and 4-bit: each request finds its own.
      assert.notDeepEqual(alone[1], alone[3])
      const hits = engine.stats.prefixCache.hits
      assert.deepEqual(await one(engine, requests[3]), alone[3])
      assert.deepEqual(await one(engine, requests[1]), alone[1])
      assert.equal(engine.stats.prefixCache.hits, hits + 2)
    } finally {
      await engine.close()
    }
  })

  test('bad values are INVALID_OPTION naming the option', async () => {
    const bad = [
      [{ kvBits: 7 }, /^kvBits/],
      [{ kvBits: 8, kvGroupSize: 48 }, /^kvBits/],
      [{ kvGroupSize: 0 }, /^kvGroupSize/],
      [{ kvConfig: [{ layerIdx: 0, bits: 8, groupSize: 64, extra: 1 }] }, /^extra: not a kvConfig option/],
      [{ kvConfig: 8 }, /^kvConfig/],
      [{ quantizedKvStart: -1 }, /^quantizedKvStart/],
    ]
    for (const [options, message] of bad) {
      assert.throws(() => mlx.generate(model, [1, 2], options), (e) => expectCode(e, 'INVALID_OPTION', message), JSON.stringify(options))
    }
    // What only the model can check fails the generation, typed.
    const ofModel = [
      [{ kvConfig: [{ layerIdx: 99, bits: 8, groupSize: 64 }] }, /layerIdx 99 is not a layer/],
      [{ kvBits: 8, kvGroupSize: 128 }, /does not divide the model's head dimension \(64\)/],
    ]
    for (const [options, message] of ofModel) {
      await assert.rejects(collect(mlx.generate(model, [1, 2], options)), (e) => expectCode(e, 'INVALID_OPTION', message))
    }
  })

  test('a quantized cache cannot be saved to a file yet: UNSUPPORTED_OPTION', async () => {
    const cache = model.makeCache()
    await collect(mlx.generate(model, [1, 2, 3, 4], { maxTokens: 2, kvBits: 8, quantizedKvStart: 0, cache }))
    assert.equal(cache.offset, 5)
    const file = path.join(tmpdir('kv-quant'), 'cache.mlxkv')
    await assert.rejects(mlx.saveKvCache(cache, file), (e) => expectCode(e, 'UNSUPPORTED_OPTION', /kvBits/))
    cache.dispose()
  })
})

describe('the server quantizes KV caches per kv_config.json, kvQuant bits, or not at all', () => {
  test('kvQuant: config (the default) applies kv_config.json; 4 applies 4 bits; off and a folder without one: plain', async () => {
    const ref4 = readJson('ref-f32-kv4.json').results[1]
    const dir = tmpdir('kv-config')
    for (const f of fs.readdirSync(fixture('smollm2-f32'))) fs.symlinkSync(path.join(fixture('smollm2-f32'), f), path.join(dir, f))
    const layers = mlx.loadModelConfig(fixture('smollm2-f32')).text.numHiddenLayers
    fs.writeFileSync(path.join(dir, 'kv_config.json'), JSON.stringify(Array.from({ length: layers }, (_, i) => ({ layer_idx: i, bits: 4, group_size: 64 }))))
    const complete = async (server) => {
      const r = await fetch(`${server.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'm', prompt: 'The quick brown fox', max_tokens: 32, temperature: 0 }) })
      assert.equal(r.status, 200)
      return (await r.json()).choices[0].text
    }
    const servers = {
      config: mlx.createServer(mlx.loadContext(dir, 'm'), 0, { log: 'off' }),
      bits: mlx.createServer(mlx.loadContext(fixture('smollm2-f32'), 'm'), 0, { log: 'off', kvQuant: 4 }),
      off: mlx.createServer(mlx.loadContext(dir, 'm'), 0, { log: 'off', kvQuant: 'off' }),
      none: mlx.createServer(mlx.loadContext(fixture('smollm2-f32'), 'm'), 0, { log: 'off' }),
    }
    try {
      assert.equal(await complete(servers.config), ref4.text)
      assert.equal(await complete(servers.bits), ref4.text)
      const plain = await complete(servers.off)
      assert.notEqual(plain, ref4.text)
      assert.equal(await complete(servers.none), plain)
    } finally {
      await Promise.all(Object.values(servers).map((s) => s.close()))
    }
  })
})

describe('quantized KV caches on a tiny random Qwen3', () => {
  let model
  before(async () => {
    model = await mlx.loadModel(fixture('tiny/qwen3'))
  })
  after(() => model.dispose())

  for (const bits of [8, 4]) {
    test(`kvBits ${bits} (group 32): 64 greedy tokens and their logprobs within 1e-4 of mlx-lm, short and 300-token prompts`, async () => {
      const ref = readJson(`ref-tiny-kv${bits}.json`)
      for (const [i, r] of ref.results.entries()) {
        const ours = await run(model, r.prompt_ids, { maxTokens: 64, kvBits: bits, kvGroupSize: 32, quantizedKvStart: 0 })
        assertLike(ours, r, `prompt ${i}`, 1e-4)
      }
    })
  }
})

describe('quantized sliding-window caches on a tiny random Gemma 3 (window 16)', () => {
  // mlx-lm cannot quantize a rotating cache (NotImplementedError); mlx-bun does. The same moves
  // (rotate in place, reorder and trim) on quantized parts: checked against itself across batching,
  // and against the plain cache's tokens being different.
  let model
  before(async () => {
    model = await mlx.loadModel(fixture('tiny/gemma3_text'))
  })
  after(() => model.dispose())

  test('prompts past the window decode with 8- and 4-bit caches; batched rows equal each alone', async () => {
    const prompt = (i) => Array.from({ length: 20 + 9 * i }, (_, j) => ((j * 37 + i * 11) % 250) + 2)
    const requests = [
      { promptTokens: prompt(0), maxTokens: 40, eosTokenIds: [], kvBits: 8, kvGroupSize: 32, quantizedKvStart: 0 },
      { promptTokens: prompt(1), maxTokens: 40, eosTokenIds: [], kvBits: 4, kvGroupSize: 32, quantizedKvStart: 0 },
      { promptTokens: prompt(2), maxTokens: 40, eosTokenIds: [] },
    ]
    const one = async (engine, r) => {
      const o = await within(engine.open(r, { output: 'collect' }).result, 'a collect session', 60_000)
      assert.equal(o.status, 'completed', JSON.stringify(o.error))
      return Array.from(o.output)
    }
    const solo = mlx.createEngine(model, { prefixCacheBytes: 0 })
    const alone = []
    for (const r of requests) alone.push(await one(solo, r))
    const plain = await one(solo, { ...requests[1], kvBits: undefined })
    await solo.close()
    assert.notDeepEqual(alone[1], plain, '4-bit sliding caches change the tokens')
    const engine = mlx.createEngine(model, { maxActive: 3, prefixCacheBytes: 0 })
    assert.deepEqual(await Promise.all(requests.map((r) => one(engine, r))), alone)
    await engine.close()
  })
})
