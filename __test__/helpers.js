'use strict'
// Shared test fixtures. Real-weight fixtures are made by scripts/fixtures.sh (run by
// scripts/test.sh); a missing fixture fails the test that needs it, loudly, never skips it.
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')

const ROOT = path.join(__dirname, '..')
const FIXTURES = process.env.MLX_BUN_FIXTURES || path.join(ROOT, 'fixtures')

function fixture(name) {
  const p = path.join(FIXTURES, name)
  if (!fs.existsSync(p)) {
    throw new Error(`fixture ${p} is missing: run \`bash scripts/fixtures.sh\` (scripts/test.sh does)`)
  }
  return p
}

const readJson = (name) => JSON.parse(fs.readFileSync(fixture(name), 'utf8'))

function tmpdir(tag) {
  return fs.mkdtempSync(path.join(os.tmpdir(), `mlx-bun-${tag}-`))
}

// Deterministic PRNG (mulberry32) for tiny random-weight models.
function rng(seed) {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/** Writes a safetensors file of f32 tensors: { name: { shape, data: Float32Array } }. */
function writeSafetensors(file, tensors) {
  const header = {}
  let offset = 0
  for (const [name, t] of Object.entries(tensors)) {
    const n = t.data.byteLength
    header[name] = { dtype: t.dtype ?? 'F32', shape: t.shape, data_offsets: [offset, offset + n] }
    offset += n
  }
  let json = Buffer.from(JSON.stringify(header))
  json = Buffer.concat([json, Buffer.alloc((8 - (json.length % 8)) % 8, 0x20)])
  const len = Buffer.alloc(8)
  len.writeBigUInt64LE(BigInt(json.length))
  fs.writeFileSync(file, Buffer.concat([len, json, ...Object.values(tensors).map((t) => Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength))]))
}

const TINY = { vocab: 256, hidden: 64, layers: 2, heads: 4, kvHeads: 2, inter: 128 }

/** f32 values as bf16 (round to nearest even), for safetensors. */
function toBf16({ shape, data }) {
  const bits = new Uint32Array(data.buffer, data.byteOffset, data.length)
  return { shape, dtype: 'BF16', data: Uint16Array.from(bits, (u) => (u + 0x7fff + ((u >>> 16) & 1)) >>> 16) }
}

/**
 * A byte-level BPE tokenizer of 256 tokens (one per byte, no merges, no special tokens) beside a
 * tiny model, for features that need a tokenizer (grammars).
 */
function writeByteTokenizer(dir) {
  const shown = []
  let next = 256
  for (let b = 0; b < 256; b++) {
    const selfMapped = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)
    shown.push(String.fromCharCode(selfMapped ? b : next++))
  }
  const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true }
  const tokenizer = {
    version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: null, pre_tokenizer: byteLevel, post_processor: null, decoder: byteLevel,
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab: Object.fromEntries(shown.map((c, i) => [c, i])), merges: [] },
  }
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tokenizer))
  return dir
}

/** A tiny random-weight llama folder (config.json + model.safetensors), no tokenizer; `bf16`
 * stores every tensor in bf16, `dims` overrides TINY's sizes. */
function makeTinyLlama(dir, seed = 1, { omit = [], bf16 = false, dims = {} } = {}) {
  const { vocab, hidden, layers, heads, kvHeads, inter } = { ...TINY, ...dims }
  const hd = hidden / heads
  const r = rng(seed)
  const rand = (shape, scale = 0.08) => ({ shape, data: Float32Array.from({ length: shape.reduce((a, b) => a * b) }, () => (r() * 2 - 1) * scale) })
  const ones = (n) => ({ shape: [n], data: new Float32Array(n).fill(1) })
  const t = { 'model.embed_tokens.weight': rand([vocab, hidden], 0.3), 'model.norm.weight': ones(hidden) }
  for (let i = 0; i < layers; i++) {
    const p = `model.layers.${i}`
    Object.assign(t, {
      [`${p}.input_layernorm.weight`]: ones(hidden),
      [`${p}.post_attention_layernorm.weight`]: ones(hidden),
      [`${p}.self_attn.q_proj.weight`]: rand([heads * hd, hidden]),
      [`${p}.self_attn.k_proj.weight`]: rand([kvHeads * hd, hidden]),
      [`${p}.self_attn.v_proj.weight`]: rand([kvHeads * hd, hidden]),
      [`${p}.self_attn.o_proj.weight`]: rand([hidden, heads * hd]),
      [`${p}.mlp.gate_proj.weight`]: rand([inter, hidden]),
      [`${p}.mlp.up_proj.weight`]: rand([inter, hidden]),
      [`${p}.mlp.down_proj.weight`]: rand([hidden, inter]),
    })
  }
  for (const name of omit) delete t[name]
  if (bf16) for (const name of Object.keys(t)) t[name] = toBf16(t[name])
  fs.mkdirSync(dir, { recursive: true })
  writeSafetensors(path.join(dir, 'model.safetensors'), t)
  fs.writeFileSync(
    path.join(dir, 'config.json'),
    JSON.stringify({
      model_type: 'llama',
      hidden_size: hidden,
      num_hidden_layers: layers,
      intermediate_size: inter,
      num_attention_heads: heads,
      num_key_value_heads: kvHeads,
      rms_norm_eps: 1e-5,
      vocab_size: vocab,
      tie_word_embeddings: true,
      eos_token_id: 0,
    }),
  )
  return dir
}

/** A minimal GGUF v3 file: `kv` metadata (strings, u32, f32, arrays of strings, int32 or booleans) and tensors. */
function writeGguf(file, kv, tensors) {
  const parts = []
  const u32 = (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v); return b }
  const u64 = (v) => { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); return b }
  const f32 = (v) => { const b = Buffer.alloc(4); b.writeFloatLE(v); return b }
  const str = (s) => { const b = Buffer.from(s); return Buffer.concat([u64(b.length), b]) }
  parts.push(Buffer.from('GGUF'), u32(3), u64(tensors.length), u64(Object.keys(kv).length))
  for (const [k, v] of Object.entries(kv)) {
    parts.push(str(k))
    if (typeof v === 'string') parts.push(u32(8), str(v))
    else if (Array.isArray(v) && typeof v[0] === 'number') parts.push(u32(9), u32(5), u64(v.length), ...v.map(u32)) // int32s
    else if (Array.isArray(v) && typeof v[0] === 'boolean') parts.push(u32(9), u32(7), u64(v.length), Buffer.from(v.map(Number)))
    else if (Array.isArray(v)) parts.push(u32(9), u32(8), u64(v.length), ...v.map(str))
    else if (typeof v === 'object') parts.push(u32(6), f32(v.f32)) // { f32: 12 }: a float that happens to be whole
    else if (Number.isInteger(v)) parts.push(u32(4), u32(v))
    else parts.push(u32(6), f32(v))
  }
  let offset = 0
  for (const t of tensors) {
    parts.push(str(t.name), u32(t.dims.length), ...t.dims.map(u64), u32(t.type), u64(offset))
    offset += Math.ceil(t.data.length / 32) * 32
  }
  let head = Buffer.concat(parts)
  head = Buffer.concat([head, Buffer.alloc((32 - (head.length % 32)) % 32)])
  const data = tensors.map((t) => Buffer.concat([t.data, Buffer.alloc((32 - (t.data.length % 32)) % 32)]))
  fs.writeFileSync(file, Buffer.concat([head, ...data]))
}

/** Awaits `promise`, failing (instead of hanging) after `ms`. */
async function within(promise, what, ms = 10_000) {
  let timer
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not settle within ${ms} ms`)), ms)
  })
  try {
    return await Promise.race([promise, timeout])
  } finally {
    clearTimeout(timer)
  }
}

/** Polls `cond` until it holds or `ms` pass; returns whether it held. */
async function eventually(cond, ms = 3000) {
  const end = Date.now() + ms
  while (!cond()) {
    if (Date.now() > end) return false
    await new Promise((r) => setTimeout(r, 10))
  }
  return true
}

const range = (a, b) => Array.from({ length: b - a }, (_, i) => a + i)

/** For assert.throws/rejects: an Error with `code` and, if given, a message matching `pattern`. */
function expectCode(err, code, pattern) {
  assert.ok(err instanceof Error, `expected an Error, got ${err}`)
  assert.equal(err.code, code, `${err.code}: ${err.message}`)
  if (pattern) assert.match(err.message, pattern)
  return true
}

/** Collects a generation: { tokens, gen }. */
async function collect(gen) {
  const tokens = []
  for await (const t of gen) tokens.push(t.token)
  return { tokens, gen }
}

/** POSTs JSON (or a raw string) and reads the JSON answer, if any. */
async function post(url, body, headers = {}) {
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body) })
  return { status: r.status, headers: r.headers, json: await r.json().catch(() => null) }
}

/** The cosine of the angle between two vectors of the same length. */
function cosine(a, b) {
  assert.equal(a.length, b.length)
  let [dot, na, nb] = [0, 0, 0]
  for (let i = 0; i < a.length; i++) {
    dot += a[i] * b[i]
    na += a[i] * a[i]
    nb += b[i] * b[i]
  }
  return dot / Math.sqrt(na * nb)
}

module.exports = { ROOT, FIXTURES, fixture, readJson, tmpdir, rng, within, eventually, range, makeTinyLlama, writeByteTokenizer, writeGguf, writeSafetensors, collect, expectCode, cosine, post, TINY }
