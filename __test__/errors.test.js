'use strict'
// Bad input → an Error with a stable code and a clear message; the process stays alive and a
// valid generation afterwards still works.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')

const mlx = require('..')
const { makeTinyLlama, tmpdir, collect, writeGguf, fixture, expectCode, TINY } = require('./helpers')

describe('bad input', () => {
  let dir
  let model
  before(async () => {
    dir = tmpdir('errors')
    model = await mlx.loadModel(makeTinyLlama(path.join(dir, 'ok')))
  })
  after(async () => {
    // The engine is still healthy after every failure above.
    const { tokens } = await collect(mlx.generate(model, [1, 2], { maxTokens: 4, eosTokenIds: [] }))
    assert.equal(tokens.length, 4)
    model.dispose()
  })

  test('missing path', async () => {
    await assert.rejects(mlx.loadModel(path.join(dir, 'nope')), (e) => expectCode(e, 'MODEL_NOT_FOUND', /nope/))
    assert.throws(() => mlx.loadModelConfig(path.join(dir, 'nope')), (e) => expectCode(e, 'MODEL_NOT_FOUND'))
  })

  test('truncated safetensors', async () => {
    const d = makeTinyLlama(path.join(dir, 'trunc'))
    const f = path.join(d, 'model.safetensors')
    fs.truncateSync(f, fs.statSync(f).size - 1000)
    await assert.rejects(mlx.loadModel(d), (e) => expectCode(e, 'INVALID_WEIGHTS', /truncated/))
  })

  test('truncated GGUF', async () => {
    const src = fixture('home/models/SmolLM2-135M-Instruct.Q4_1.gguf')
    const f = path.join(dir, 'trunc.gguf')
    const fd = fs.openSync(src, 'r')
    const buf = Buffer.alloc(40 << 20)
    fs.readSync(fd, buf, 0, buf.length, 0)
    fs.closeSync(fd)
    fs.writeFileSync(f, buf)
    await assert.rejects(mlx.loadModel(f), (e) => expectCode(e, 'INVALID_WEIGHTS', /truncated|missing|beyond|outside/i))
  })

  test('config.json missing a field', async () => {
    const d = makeTinyLlama(path.join(dir, 'nofield'))
    const cfg = JSON.parse(fs.readFileSync(path.join(d, 'config.json')))
    delete cfg.num_attention_heads
    fs.writeFileSync(path.join(d, 'config.json'), JSON.stringify(cfg))
    await assert.rejects(mlx.loadModel(d), (e) => expectCode(e, 'INVALID_CONFIG', /num_attention_heads/))
  })

  test('unsupported model_type', async () => {
    const d = makeTinyLlama(path.join(dir, 'arch'))
    const cfg = JSON.parse(fs.readFileSync(path.join(d, 'config.json')))
    cfg.model_type = 'mamba9'
    fs.writeFileSync(path.join(d, 'config.json'), JSON.stringify(cfg))
    await assert.rejects(mlx.loadModel(d), (e) => expectCode(e, 'UNSUPPORTED_MODEL_TYPE', /mamba9/))
  })

  test('a tensor with the wrong shape is named', async () => {
    const d = makeTinyLlama(path.join(dir, 'shape'))
    const cfg = JSON.parse(fs.readFileSync(path.join(d, 'config.json')))
    cfg.intermediate_size = 100
    fs.writeFileSync(path.join(d, 'config.json'), JSON.stringify(cfg))
    await assert.rejects(mlx.loadModel(d), (e) => expectCode(e, 'INVALID_TENSOR', /gate_proj\.weight/))
  })

  test('a missing tensor is named', async () => {
    const d = makeTinyLlama(path.join(dir, 'missing'), 1, { omit: ['model.layers.1.self_attn.k_proj.weight'] })
    await assert.rejects(mlx.loadModel(d), (e) => expectCode(e, 'INVALID_TENSOR', /model\.layers\.1\.self_attn\.k_proj\.weight/))
  })

  test('GGUF with an unsupported quantization type', async () => {
    const f = path.join(dir, 'q4k.gguf')
    const kv = {
      'general.architecture': 'llama',
      'llama.embedding_length': 256,
      'llama.feed_forward_length': 256,
      'llama.block_count': 1,
      'llama.attention.head_count': 4,
      'llama.context_length': 128,
      'tokenizer.ggml.model': 'gpt2',
      'tokenizer.ggml.tokens': ['a', 'b', 'c', 'd'],
    }
    // One IQ2_XXS tensor (type 16), an i-quant the loader does not read.
    writeGguf(f, kv, [{ name: 'token_embd.weight', dims: [256, 4], type: 16, data: Buffer.alloc(4 * 66) }])
    await assert.rejects(mlx.loadModel(f), (e) => expectCode(e, 'UNSUPPORTED_QUANTIZATION', /token_embd\.weight/))
  })

  const badOptions = [
    [{ temperature: -0.5 }, /temperature/],
    [{ topP: -0.1 }, /topP/],
    [{ minTokensToKeep: 1e9 }, /minTokensToKeep.*vocabulary/],
    [{ topP: 1.2 }, /topP/],
    [{ maxTokens: 0 }, /maxTokens/],
    [{ maxTokens: -3 }, /maxTokens/],
    [{ maxTokens: 2.5 }, /maxTokens/],
    [{ topLogprobs: 99 }, /topLogprobs/],
    [{ minP: 3 }, /minP/],
    [{ logitBias: { 999999: 1 } }, /logitBias/],
  ]
  for (const [opts, pattern] of badOptions) {
    test(`invalid option ${JSON.stringify(opts)}`, () => {
      assert.throws(() => mlx.generate(model, [1, 2], opts), (e) => expectCode(e, 'INVALID_OPTION', pattern))
    })
  }

  test('prompt token id ≥ vocab size', () => {
    assert.throws(() => mlx.generate(model, [1, TINY.vocab], {}), (e) => expectCode(e, 'INVALID_PROMPT', /256/))
    assert.throws(() => mlx.generate(model, [1, -1], {}), (e) => expectCode(e, 'INVALID_PROMPT'))
  })

  test('empty prompt', () => {
    assert.throws(() => mlx.generate(model, [], {}), (e) => expectCode(e, 'INVALID_PROMPT', /empty/))
    assert.throws(() => mlx.generate(model, new Uint32Array(0), {}), (e) => expectCode(e, 'INVALID_PROMPT', /empty/))
  })

  test('a disposed model', async () => {
    const m = await mlx.loadModel(makeTinyLlama(path.join(dir, 'disposed')))
    m.dispose()
    assert.throws(() => mlx.generate(m, [1], {}), (e) => expectCode(e, 'MODEL_DISPOSED'))
  })
})
