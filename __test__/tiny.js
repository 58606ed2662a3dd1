'use strict'
// The tiny random-weight models of scripts/tiny_models.py and mlx-lm's references for them
// (<fixtures>/tiny/ref-tiny.json), and the checks the architecture suites make against them.
const assert = require('node:assert/strict')
const fs = require('node:fs')

const mlx = require('..')
const { readJson, collect } = require('./helpers')

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

/** `model` gives mlx-lm's last-position logits (within 1e-4) and greedy tokens on `m`'s prompts. */
async function assertLikeReference(model, m, what) {
  for (const p of m.prompts) {
    const ours = await model.logits(p.ids)
    const max = Math.max(...ours.map((x, j) => Math.abs(x - p.last_logits[j])))
    assert.ok(max <= 1e-4, `${what}: max |logit diff| ${max}`)
    assertTokens(await greedy(model, p.ids), p.tokens, `${what} prompt of ${p.ids.length} ids`)
  }
}

/** Experts as published: gate [e, h, d] and up [e, h, d] (f32) as one [e, 2h, d], gate rows first. */
function fuseGateUp(gate, up, [e, h, d]) {
  const data = new Float32Array(e * 2 * h * d)
  for (let i = 0; i < e; i++) {
    data.set(gate.subarray(i * h * d, (i + 1) * h * d), i * 2 * h * d)
    data.set(up.subarray(i * h * d, (i + 1) * h * d), (i * 2 + 1) * h * d)
  }
  return { shape: [e, 2 * h, d], data }
}

/** The tensors of a safetensors file: name -> { shape, data (raw little-endian bytes) }. */
function readSafetensors(file) {
  const buf = fs.readFileSync(file)
  const n = Number(buf.readBigUInt64LE(0))
  const header = JSON.parse(buf.subarray(8, 8 + n).toString())
  return Object.fromEntries(Object.entries(header).filter(([k]) => k !== '__metadata__')
    .map(([k, t]) => [k, { shape: t.shape, data: buf.subarray(8 + n + t.data_offsets[0], 8 + n + t.data_offsets[1]) }]))
}

module.exports = { ref, MAX_TOKENS, greedy, assertTokens, assertLikeReference, fuseGateUp, readSafetensors }
