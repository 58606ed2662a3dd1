'use strict'
// Parity with Python mlx-lm 0.32.2 on tiny random-weight models of every architecture we support
// (llama, llama with Llama 3 RoPE, mistral all-sliding and mixed, qwen2, qwen3, gemma3_text, phi3,
// phi3 with partial rotary + su RoPE), each as an f32 folder and an MLX 4-bit g32 copy. Folders and
// references are made by scripts/tiny_models.py into <fixtures>/tiny.
const { test, describe } = require('node:test')
const assert = require('node:assert/strict')

const mlx = require('..')
const { fixture, readJson, collect } = require('./helpers')

function loadRef() {
  try {
    return readJson('tiny/ref-tiny.json')
  } catch (e) {
    e.message += ' -- the tiny models come from: LD_PRELOAD=<libopenblas.so.0> .venv/bin/python scripts/tiny_models.py <fixtures>/tiny'
    throw e
  }
}
const ref = loadRef()
const MAX_TOKENS = 64

function firstDiff(a, b) {
  const n = Math.max(a.length, b.length)
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i
  return -1
}

async function greedy(model, ids, extra = {}) {
  const { tokens } = await collect(mlx.generate(model, ids, { maxTokens: MAX_TOKENS, eosTokenIds: [], ...extra }))
  return tokens
}

function assertTokens(ours, theirs, what) {
  const i = firstDiff(ours, theirs)
  assert.ok(i < 0, `${what}: first difference at step ${i}: ours ${ours[i]} vs mlx-lm ${theirs[i]} (ours ${JSON.stringify(ours)}, mlx-lm ${JSON.stringify(theirs)})`)
}

describe('architectures: parity with mlx-lm on tiny random models', () => {
  test('reference file is complete', () => {
    assert.equal(ref.mlx_lm_version, '0.32.2')
    assert.equal(ref.max_tokens, MAX_TOKENS)
    const names = ref.models.map((m) => m.name)
    for (const arch of ['llama', 'mistral', 'qwen2', 'qwen3', 'gemma3_text', 'phi3', 'phi3_su']) {
      assert.ok(names.includes(arch), `${arch} missing from ref-tiny.json`)
      assert.ok(names.includes(`${arch}-q4`), `${arch}-q4 missing from ref-tiny.json`)
    }
  })

  for (const m of ref.models) {
    // Generous timeout: bun test's default (5 s) is tight on a loaded 2-core machine.
    test(`${m.name} (${m.model_type}${m.quantized ? ', 4-bit' : ', f32'})`, { timeout: 120_000 }, async () => {
      const model = await mlx.loadModel(fixture(`tiny/${m.path}`))
      try {
        assert.equal(model.config.modelType, m.model_type)
        for (const [i, p] of m.prompts.entries()) {
          const what = `${m.name} prompt ${i} (${p.ids.length} ids)`
          assert.equal(p.tokens.length, MAX_TOKENS)
          assertTokens(await greedy(model, p.ids), p.tokens, what)
          if (p.tokens_chunk8) {
            assertTokens(await greedy(model, p.ids, { prefillChunkSize: 8 }), p.tokens_chunk8, `${what}, prefillChunkSize 8`)
          }
          if (!m.quantized) {
            assert.ok(Array.isArray(p.last_logits), `${what}: f32 reference has no last_logits`)
            const ours = await model.logits(p.ids)
            assert.equal(ours.length, p.last_logits.length)
            let max = 0
            let at = -1
            for (let j = 0; j < ours.length; j++) {
              const d = Math.abs(ours[j] - p.last_logits[j])
              if (!(d <= max)) [max, at] = [d, j]
            }
            assert.ok(max <= 1e-4, `${what}: max |logit diff| ${max} at id ${at} (ours ${ours[at]}, mlx-lm ${p.last_logits[at]})`)
          }
        }
      } finally {
        model.dispose()
      }
    })
  }
})
