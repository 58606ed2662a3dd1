'use strict'
// Numerical parity with Python mlx-lm 0.32.2 on the same libmlx and BLAS (references made by
// scripts/fixtures.sh). SmolLM2 from (a) the GGUF itself, (b) an MLX 4-bit folder and (c) an f32
// folder, both written from that GGUF by our own `convert`.
const { test, describe } = require('node:test')
const assert = require('node:assert/strict')

const mlx = require('..')
const { fixture, readJson, collect } = require('./helpers')

const GGUF = 'home/models/SmolLM2-135M-Instruct.Q4_1.gguf'

/** mlx-lm does not stop at EOS in the reference run; we do, and never yield the EOS. */
function expected(result, eos) {
  const stop = result.tokens.findIndex((t) => eos.includes(t))
  return stop < 0 ? result.tokens : result.tokens.slice(0, stop)
}

async function checkGreedy(modelPath, refName) {
  const ref = readJson(refName)
  const model = await mlx.loadModel(fixture(modelPath))
  try {
    for (const [i, r] of ref.results.entries()) {
      const { tokens } = await collect(mlx.generate(model, r.prompt_ids, { maxTokens: r.tokens.length }))
      assert.deepEqual(tokens, expected(r, ref.eos_token_ids), `prompt ${i} (${r.source})`)
    }
  } finally {
    model.dispose()
  }
  return ref
}

describe('parity with mlx-lm', () => {
  test('(c) f32 folder: 64 greedy tokens on 3 prompts, logits within 1e-4', async () => {
    const ref = await checkGreedy('smollm2-f32', 'ref-f32.json')
    assert.equal(ref.mlx_lm_version, '0.32.2')
    assert.equal(ref.mlx_version, '0.32.2')
    assert.ok(ref.results.every((r) => r.tokens.length === 64))
    const model = await mlx.loadModel(fixture('smollm2-f32'))
    for (const r of ref.results) {
      const ours = await model.logits(r.prompt_ids)
      assert.equal(ours.length, r.last_logits.length)
      let max = 0
      for (let i = 0; i < ours.length; i++) max = Math.max(max, Math.abs(ours[i] - r.last_logits[i]))
      assert.ok(max <= 1e-4, `max |logit diff| ${max}`)
    }
    model.dispose()
  })

  test("the default matmul layout is the stored one on every CPU: f32Matmuls 'auto' equals 'none' bit for bit", async () => {
    // A transposed f32 layout rounds like the stored one on some OpenBLAS kernels only (not on
    // AVX-512 ones), so the default never depends on it: the numbers are mlx-lm's wherever we run.
    const ref = readJson('ref-f32.json')
    const run = async (f32Matmuls) => {
      const model = await mlx.loadModel(fixture('smollm2-f32'), { f32Matmuls })
      try {
        const logits = []
        for (const r of ref.results) logits.push(Array.from(await model.logits(r.prompt_ids)))
        const steps = []
        for await (const t of mlx.generate(model, ref.results[2].prompt_ids, { maxTokens: 16, eosTokenIds: [], topLogprobs: 2 })) steps.push(t)
        return { logits, tokens: steps.map((t) => t.token), logprobs: steps.map((t) => t.logprobs) }
      } finally {
        model.dispose()
      }
    }
    const [auto, stored] = [await run('auto'), await run('none')]
    assert.equal(auto.tokens.length, 16)
    assert.deepEqual(auto, stored)
  })

  test("f32Matmuls 'all' computes a bf16 model's matmuls in f32: close to MLX's bf16 kernel, not bit for bit", async () => {
    const ref = readJson('ref-gemma-bf16.json')
    const [bf16, f32] = [await mlx.loadModel(fixture('gemma3-bf16'), { f32Matmuls: 'none' }), await mlx.loadModel(fixture('gemma3-bf16'), { f32Matmuls: 'all' })]
    try {
      for (const r of ref.results) {
        const [x, y] = [await bf16.logits(r.prompt_ids), await f32.logits(r.prompt_ids)]
        let [max, ax, ay] = [0, 0, 0]
        for (let i = 0; i < x.length; i++) {
          max = Math.max(max, Math.abs(x[i] - y[i]))
          if (x[i] > x[ax]) ax = i
          if (y[i] > y[ay]) ay = i
        }
        // bf16 rounding differences compound through the layers (measured: up to 0.5).
        assert.ok(max > 0 && max <= 1, `max |logit diff| ${max}`)
        assert.equal(ay, ax)
      }
    } finally {
      bf16.dispose()
      f32.dispose()
    }
    await assert.rejects(mlx.loadModel(fixture('gemma3-bf16'), { f32Matmuls: 'fast' }), { code: 'INVALID_OPTION' })
  })

  test("f32Matmuls 'all' multiplies a 4-bit model with f32 scales: another kernel, the same model, nearer the f32 one", async () => {
    const corr = (x, y) => {
      const mean = (v) => v.reduce((a, b) => a + b, 0) / v.length
      const [mx, my] = [mean(x), mean(y)]
      let [sxy, sxx, syy] = [0, 0, 0]
      for (let i = 0; i < x.length; i++) {
        sxy += (x[i] - mx) * (y[i] - my)
        sxx += (x[i] - mx) ** 2
        syy += (y[i] - my) ** 2
      }
      return sxy / Math.sqrt(sxx * syy)
    }
    const ref = readJson('ref-q4.json')
    const models = [await mlx.loadModel(fixture('smollm2-q4'), { f32Matmuls: 'none' }), await mlx.loadModel(fixture('smollm2-q4'), { f32Matmuls: 'all' }), await mlx.loadModel(fixture('smollm2-f32'))]
    try {
      // The first prompt (4 tokens): MLX's bf16 4-bit kernel prefills about a token a second here.
      const [x, y, exact] = await Promise.all(models.map((m) => m.logits(ref.results[0].prompt_ids)))
      assert.ok(x.some((v, i) => v !== y[i]), 'MLX runs its f32 kernel, not the bf16 one')
      assert.ok(corr(x, y) > 0.95, `the same model: correlation ${corr(x, y)}`)
      // The f32 kernel's outputs lie nearer the f32 model's than the bf16 kernel's (measured: on
      // each of the two text prompts, 1.660 against 1.622 summed; KL against the f32 model 0.44
      // against 0.55 over the three of an earlier reference).
      const [stored, fast] = [corr(x, exact), corr(y, exact)]
      assert.ok(fast > stored, `correlation with the f32 model: f32 scales ${fast}, bf16 ${stored}`)
    } finally {
      for (const m of models) m.dispose()
    }
  })

  test("f32Matmuls 'int8' rounds x to 8 bits in the GGUF's products where our x86_64 kernel runs: the same model within a small KL, and 'all' elsewhere", async () => {
    // Our kernel's int8 form runs on Linux x86_64 CPUs with AVX2 and FMA (elsewhere 'int8' is 'all').
    const cpu = process.platform === 'linux' && process.arch === 'x64' ? require('node:fs').readFileSync('/proc/cpuinfo', 'utf8') : ''
    const kernel = /\bavx2\b/.test(cpu) && /\bfma\b/.test(cpu) && /\bf16c\b/.test(cpu)
    const logSoftmax = (l) => {
      const mx = Math.max(...l)
      const lse = mx + Math.log(l.reduce((s, v) => s + Math.exp(v - mx), 0))
      return l.map((v) => v - lse)
    }
    const kl = (p, q) => {
      const [a, b] = [logSoftmax(p), logSoftmax(q)]
      return a.reduce((k, v, i) => k + Math.exp(v) * (v - b[i]), 0)
    }
    const ref = readJson('ref-exact.json')
    const models = [await mlx.loadModel(fixture(GGUF), { f32Matmuls: 'all' }), await mlx.loadModel(fixture(GGUF), { f32Matmuls: 'int8' }), await mlx.loadModel(fixture('smollm2-f32'))]
    try {
      for (const [i, r] of ref.results.entries()) {
        const [all, int8, exact] = await Promise.all(models.map((m) => m.logits(r.prompt_ids)))
        if (!kernel) {
          assert.deepEqual(int8, all, `prompt ${i}: 'all' where the int8 form does not run`)
          continue
        }
        // The f32 folder is this GGUF's weights unquantized, so KL against it measures x's
        // rounding alone: 1.5e-3 to 1.0e-2 at these prompts' last positions ('all' 5e-6 to 5e-5;
        // `mlx-bun eval kl` over 254 positions: mean 2.8e-3). Wrong values in the kernel give KL
        // of 1 and more.
        const [withAll, withInt8] = [kl(exact, all), kl(exact, int8)]
        assert.ok(withInt8 < 0.05, `prompt ${i}: KL against the f32 model ${withInt8}`)
        assert.ok(withInt8 > withAll, `prompt ${i}: x rounded to 8 bits (KL ${withInt8}, 'all' ${withAll})`)
      }
    } finally {
      for (const m of models) m.dispose()
    }
  })

  test('(b) MLX 4-bit g64 folder: greedy tokens on 2 prompts', async () => {
    await checkGreedy('smollm2-q4', 'ref-q4.json')
  })

  test('(a) GGUF loaded quantized without loss = mlx-lm on its exact MLX repack', async () => {
    await checkGreedy(GGUF, 'ref-exact.json')
    await checkGreedy('smollm2-exact', 'ref-exact.json')
  })

  test('GGUF quantization is carried losslessly into the MLX layout', () => {
    const cfg = mlx.loadModelConfig(fixture(GGUF))
    assert.deepEqual(cfg.quantization.default, { bits: 4, groupSize: 32, mode: 'affine' })
    assert.deepEqual(cfg.quantization.perLayer['model.embed_tokens'], { bits: 8, groupSize: 32 })
    const w = mlx.Weights.open(fixture(GGUF))
    assert.deepEqual(w.info('model.layers.0.self_attn.q_proj.weight'), { dtype: 'u32', shape: [576, 72] })
    assert.deepEqual(w.info('model.layers.0.self_attn.q_proj.scales'), { dtype: 'f16', shape: [576, 18] })
    assert.equal(w.has('lm_head.weight'), false)
  })

  test('tokenizer ids and chat templates equal the Python tokenizer (GGUF and folder)', () => {
    const ref = readJson('ref-f32.json')
    for (const source of [fixture(GGUF), fixture('smollm2-f32')]) {
      const tok = mlx.loadTokenizer(source)
      const tpl = mlx.ChatTemplate.load(source)
      for (const t of ref.tokenize) {
        assert.deepEqual(Array.from(tok.encode(t.text, true)), t.ids_with_special, t.text)
        assert.deepEqual(Array.from(tok.encode(t.text, false)), t.ids_no_special, t.text)
        assert.equal(tok.decode(t.ids_no_special), t.decoded, t.text)
      }
      const spec = readJson('spec-f32.json')
      for (const [i, t] of ref.templates.entries()) {
        const { messages, add_generation_prompt } = spec.templates[i]
        assert.equal(tpl.render(messages, { addGenerationPrompt: add_generation_prompt }), t.rendered)
      }
      // The chat prompt of the generation test tokenizes to mlx-lm's prompt ids.
      const chat = ref.results[0]
      assert.deepEqual(Array.from(tok.encode(tpl.render(spec.prompts[0].messages), false)), chat.prompt_ids)
      assert.deepEqual(Array.from(tok.encode(spec.prompts[1].text)), ref.results[1].prompt_ids)
    }
  })
})
