'use strict'
// A corpus of malformed model, tokenizer and template files, as a user's app could meet them
// (truncated downloads, flipped bits, inconsistent configs), each with the error code a caller
// should get. Small files, written fresh each time:
//   node scripts/malformed-corpus.js OUT_DIR      writes the corpus and prints its table
// __test__/corpus.test.js loads every entry under Node and Bun.
const fs = require('node:fs')
const path = require('node:path')
const { makeTinyLlama, writeGguf, rng } = require('../__test__/helpers')

const TOKENIZER = {
  version: '1.0',
  added_tokens: [{ id: 0, content: '<eos>', special: true, single_word: false, lstrip: false, rstrip: false, normalized: false }],
  normalizer: null,
  pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
  post_processor: null,
  decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, vocab: { '<eos>': 0, a: 1, b: 2, ab: 3 }, merges: ['a b'] },
}

const GGUF_KV = {
  'general.architecture': 'llama',
  'llama.embedding_length': 64,
  'llama.feed_forward_length': 128,
  'llama.block_count': 1,
  'llama.attention.head_count': 4,
  'llama.context_length': 128,
  'tokenizer.ggml.model': 'gpt2',
  'tokenizer.ggml.tokens': ['a', 'b', 'c', 'd'],
}

/** Writes every entry under `dir`; returns [{ name, kind, path, code }]. */
function buildCorpus(dir) {
  fs.mkdirSync(dir, { recursive: true })
  const entries = []
  const model = (name, code, edit) => {
    const d = makeTinyLlama(path.join(dir, name))
    edit(d)
    entries.push({ name, kind: 'model', path: d, code })
  }
  const st = (d) => path.join(d, 'model.safetensors')
  const config = (d, f) => {
    const p = path.join(d, 'config.json')
    fs.writeFileSync(p, typeof f === 'function' ? JSON.stringify(f(JSON.parse(fs.readFileSync(p)))) : f)
  }
  const header = (d) => {
    const b = fs.readFileSync(st(d))
    const n = Number(b.readBigUInt64LE(0))
    return { b, n, json: JSON.parse(b.subarray(8, 8 + n)) }
  }
  const rewriteHeader = (d, edit) => {
    const { b, n, json } = header(d)
    let text = Buffer.from(JSON.stringify(edit(json)))
    text = Buffer.concat([text, Buffer.alloc(Math.max(0, n - text.length), 0x20)])
    const len = Buffer.alloc(8)
    len.writeBigUInt64LE(BigInt(text.length))
    fs.writeFileSync(st(d), Buffer.concat([len, text, b.subarray(8 + n)]))
  }

  // safetensors
  model('st-truncated-data', 'INVALID_WEIGHTS', (d) => fs.truncateSync(st(d), fs.statSync(st(d)).size - 4096))
  model('st-truncated-header', 'INVALID_WEIGHTS', (d) => fs.truncateSync(st(d), 64))
  model('st-empty', 'INVALID_WEIGHTS', (d) => fs.writeFileSync(st(d), ''))
  model('st-header-length-huge', 'INVALID_WEIGHTS', (d) => {
    const b = fs.readFileSync(st(d))
    b.writeBigUInt64LE(0xffffffffffffn, 0)
    fs.writeFileSync(st(d), b)
  })
  model('st-header-not-json', 'INVALID_WEIGHTS', (d) => {
    const b = fs.readFileSync(st(d))
    b.fill(0x7b, 8, 40)
    fs.writeFileSync(st(d), b)
  })
  model('st-offsets-beyond-file', 'INVALID_WEIGHTS', (d) => rewriteHeader(d, (h) => {
    const t = h['model.norm.weight']
    t.data_offsets = [t.data_offsets[0], t.data_offsets[1] + (1 << 30)]
    return h
  }))
  model('st-unknown-dtype', 'INVALID_WEIGHTS', (d) => rewriteHeader(d, (h) => {
    h['model.norm.weight'].dtype = 'Q9'
    return h
  }))
  model('st-shape-disagrees-with-bytes', 'INVALID_WEIGHTS', (d) => rewriteHeader(d, (h) => {
    h['model.norm.weight'].shape = [3, 3]
    return h
  }))
  model('st-shape-disagrees-with-config', 'INVALID_TENSOR', (d) => config(d, (c) => ({ ...c, hidden_size: 32, num_attention_heads: 2, num_key_value_heads: 1 })))
  model('st-missing-shard', 'INVALID_WEIGHTS', (d) => fs.writeFileSync(path.join(d, 'model.safetensors.index.json'), JSON.stringify({ weight_map: { 'model.extra.weight': 'model-00002-of-00002.safetensors' } })))
  model('st-no-weights', 'INVALID_WEIGHTS', (d) => fs.rmSync(st(d)))

  // config.json
  model('config-not-json', 'INVALID_CONFIG', (d) => config(d, '{"model_type": "llama", '))
  model('config-wrong-type', 'INVALID_CONFIG', (d) => config(d, (c) => ({ ...c, hidden_size: 'wide' })))
  model('config-negative', 'INVALID_CONFIG', (d) => config(d, (c) => ({ ...c, num_hidden_layers: -2 })))
  model('config-zero-layers', 'INVALID_CONFIG', (d) => config(d, (c) => ({ ...c, num_hidden_layers: 0 })))
  model('config-heads-not-divisible', 'INVALID_CONFIG', (d) => config(d, (c) => ({ ...c, num_key_value_heads: 3 })))
  model('config-quant-group-0', 'INVALID_CONFIG', (d) => config(d, (c) => ({ ...c, quantization: { group_size: 0, bits: 4 } })))
  model('config-quant-bits-1', 'INVALID_CONFIG', (d) => config(d, (c) => ({ ...c, quantization: { group_size: 64, bits: 1 } })))
  model('config-head-dim-0', 'INVALID_CONFIG', (d) => config(d, (c) => ({ ...c, head_dim: 0 })))
  model('config-gemma3-window-pattern-0', 'INVALID_CONFIG', (d) => config(d, (c) => ({ ...c, model_type: 'gemma3_text', sliding_window_pattern: 0 })))
  model('config-sliding-window-0', 'INVALID_CONFIG', (d) => config(d, (c) => ({ ...c, model_type: 'mistral', sliding_window: 0 })))
  model('config-unknown-rope', 'INVALID_CONFIG', (d) => config(d, (c) => ({ ...c, rope_scaling: { type: 'warp', factor: 2 } })))
  model('config-unknown-architecture', 'UNSUPPORTED_MODEL_TYPE', (d) => config(d, (c) => ({ ...c, model_type: 'mamba9' })))
  model('config-missing', 'IO_ERROR', (d) => fs.rmSync(path.join(d, 'config.json')))

  // GGUF
  const gguf = (name, code, kv, tensors, edit) => {
    const f = path.join(dir, `${name}.gguf`)
    writeGguf(f, { ...GGUF_KV, ...kv }, tensors ?? [{ name: 'token_embd.weight', dims: [64, 4], type: 0, data: Buffer.alloc(64 * 4 * 4) }])
    if (edit) fs.writeFileSync(f, edit(fs.readFileSync(f)))
    entries.push({ name, kind: 'model', path: f, code })
  }
  gguf('gguf-bad-magic', 'INVALID_WEIGHTS', {}, null, (b) => Buffer.concat([Buffer.from('GGUX'), b.subarray(4)]))
  gguf('gguf-version-99', 'INVALID_WEIGHTS', {}, null, (b) => (b.writeUInt32LE(99, 4), b))
  gguf('gguf-truncated-metadata', 'INVALID_WEIGHTS', {}, null, (b) => b.subarray(0, 100))
  gguf('gguf-tensor-count-huge', 'INVALID_WEIGHTS', {}, null, (b) => (b.writeBigUInt64LE(1n << 60n, 8), b))
  gguf('gguf-kv-count-huge', 'INVALID_WEIGHTS', {}, null, (b) => (b.writeBigUInt64LE(1n << 60n, 16), b))
  gguf('gguf-tensor-data-beyond-file', 'INVALID_WEIGHTS', {}, [{ name: 'token_embd.weight', dims: [64, 4], type: 0, data: Buffer.alloc(64 * 4 * 4) }], (b) => b.subarray(0, b.length - 512))
  gguf('gguf-too-many-dims', 'INVALID_WEIGHTS', {}, [{ name: 'token_embd.weight', dims: [1, 1, 1, 1, 64], type: 0, data: Buffer.alloc(256) }])
  gguf('gguf-head-count-0', 'INVALID_CONFIG', { 'llama.attention.head_count': 0 })
  gguf('gguf-block-count-huge', 'INVALID_CONFIG', { 'llama.block_count': 2 ** 31 })
  gguf('gguf-width-0', 'INVALID_CONFIG', { 'llama.embedding_length': 0 })
  gguf('gguf-unknown-architecture', 'UNSUPPORTED_MODEL_TYPE', { 'general.architecture': 'rwkv9' })
  gguf('gguf-unknown-tensor', 'INVALID_TENSOR', {}, [{ name: 'blk.0.mystery.weight', dims: [64, 4], type: 0, data: Buffer.alloc(64 * 4 * 4) }])
  gguf('gguf-q-rows-not-heads', 'INVALID_TENSOR', {}, [{ name: 'blk.0.attn_q.weight', dims: [64, 6], type: 0, data: Buffer.alloc(64 * 6 * 4) }])
  gguf('gguf-iq-quant', 'UNSUPPORTED_QUANTIZATION', {}, [{ name: 'token_embd.weight', dims: [256, 4], type: 16, data: Buffer.alloc(4 * 66) }])

  // Flipped bits in a valid GGUF header: whatever they hit, a typed error or a model, never a crash.
  const r = rng(7)
  for (let i = 0; i < 24; i++) {
    gguf(`gguf-bitflip-${i}`, 'ANY', {}, null, (b) => {
      const at = 4 + Math.floor(r() * Math.min(b.length - 4, 400))
      b[at] ^= 1 << Math.floor(r() * 8)
      return b
    })
  }

  // tokenizers and chat templates
  const tok = (name, code, files) => {
    const d = path.join(dir, name)
    fs.mkdirSync(d, { recursive: true })
    for (const [f, text] of Object.entries(files)) fs.writeFileSync(path.join(d, f), text)
    entries.push({ name, kind: name.startsWith('template') ? 'template' : 'tokenizer', path: d, code })
  }
  const okTok = JSON.stringify(TOKENIZER)
  tok('tokenizer-not-json', 'TOKENIZER_ERROR', { 'tokenizer.json': '{"version": "1.0", "model": ' })
  tok('tokenizer-unknown-model', 'TOKENIZER_ERROR', { 'tokenizer.json': JSON.stringify({ ...TOKENIZER, model: { type: 'Quantum' } }) })
  tok('tokenizer-missing', 'TOKENIZER_ERROR', { 'config.json': '{}' })
  tok('template-syntax-error', 'TEMPLATE_ERROR', { 'tokenizer.json': okTok, 'tokenizer_config.json': JSON.stringify({ chat_template: '{% for m in messages %}{{ m.content }' }) })
  tok('template-unknown-filter', 'TEMPLATE_ERROR', { 'tokenizer.json': okTok, 'tokenizer_config.json': JSON.stringify({ chat_template: '{{ messages | explode }}' }) })
  tok('template-raises', 'TEMPLATE_ERROR', { 'tokenizer.json': okTok, 'tokenizer_config.json': JSON.stringify({ chat_template: "{{ raise_exception('no system role') }}" }) })
  tok('template-endless-loop', 'TEMPLATE_ERROR', { 'tokenizer.json': okTok, 'tokenizer_config.json': JSON.stringify({ chat_template: '{% for i in range(10000) %}{% for j in range(10000) %}{% for k in range(10000) %}{% endfor %}{% endfor %}{% endfor %}' }) })
  tok('template-deep-recursion', 'TEMPLATE_ERROR', { 'tokenizer.json': okTok, 'tokenizer_config.json': JSON.stringify({ chat_template: '{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}' }) })
  return entries
}

module.exports = { buildCorpus }

if (require.main === module) {
  const out = process.argv[2]
  if (!out) {
    console.error('usage: node scripts/malformed-corpus.js OUT_DIR')
    process.exit(2)
  }
  for (const e of buildCorpus(out)) console.log(`${e.code.padEnd(26)} ${e.kind.padEnd(9)} ${e.name}`)
}
