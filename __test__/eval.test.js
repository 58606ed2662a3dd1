'use strict'
// `mlx-bun eval` end to end on real weights: perplexity equal to mlx-lm's on the same text, our
// teacher-logits dump against mlx-lm's (scripts/mlx_lm_eval.py, made by scripts/fixtures.sh), KL
// exactly 0 for a dump scored against the model that made it (and what 8- and 4-bit KV caches
// cost against it), and damaged dumps refused with INVALID_LOGITS_DUMP, before any forward where
// the manifest and file sizes show it.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const { spawnSync } = require('node:child_process')
const crypto = require('node:crypto')
const fs = require('node:fs')
const path = require('node:path')

const { ROOT, fixture, readJson, tmpdir } = require('./helpers')

const BIN = path.join(ROOT, 'target', 'release', 'mlx-bun')
const TEXT = path.join(__dirname, 'eval-text.txt')

const run = (...args) => spawnSync(BIN, ['eval', ...args], { encoding: 'utf8' })

function ok(...args) {
  const r = run(...args)
  assert.equal(r.status, 0, r.stderr)
  return r.stdout
}

const json = (...args) => JSON.parse(ok(...args, '--json'))

/** A dump's records: per position, top-k ids, logits (f16 read as numbers) and logsumexp. */
function records(dir, seq, k) {
  const buf = fs.readFileSync(path.join(dir, `seq-${seq}.bin`))
  const size = k * 6 + 4
  const out = []
  for (let at = 0; at < buf.length; at += size) {
    const ids = Array.from({ length: k }, (_, j) => buf.readInt32LE(at + 4 * j))
    const logits = Array.from({ length: k }, (_, j) => f16(buf.readUInt16LE(at + 4 * k + 2 * j)))
    out.push({ ids, logits, lse: buf.readFloatLE(at + 6 * k) })
  }
  return out
}

function f16(h) {
  const exp = (h >> 10) & 0x1f
  const frac = h & 0x3ff
  const sign = h >> 15 ? -1 : 1
  if (exp === 0) return sign * 2 ** -14 * (frac / 1024)
  return sign * 2 ** (exp - 15) * (1 + frac / 1024)
}

test('perplexity equals mlx-lm\'s eval_ppl on the same windows', () => {
  const ref = readJson('ref-eval.json')
  assert.equal(ref.text_sha256, crypto.createHash('sha256').update(fs.readFileSync(TEXT)).digest('hex'), 'fixtures/ref-eval.json is of another text: remove it and run scripts/fixtures.sh')
  // A chunk that does not divide the window: three forwards per window through the caches.
  const out = json('perplexity', fixture('smollm2-f32'), '--text', TEXT, '--ctx', '256', '--chunk', '96')
  assert.equal(out.tokens, ref.tokens)
  assert.equal(out.windows, ref.windows)
  assert.equal(out.scored, ref.windows * 255)
  const rel = Math.abs(out.perplexity - ref.perplexity) / ref.perplexity
  assert.ok(rel < 1e-4, `ours ${out.perplexity}, mlx-lm ${ref.perplexity} (relative ${rel})`)
  assert.ok(Math.abs(out.standardError - ref.standard_error) / ref.standard_error < 1e-3)
  assert.ok(Math.abs(Math.log(out.perplexity) - out.meanNll) < 1e-12)
  console.log(`perplexity: ours ${out.perplexity}, mlx-lm ${ref.perplexity} (relative ${rel.toExponential(2)})`)

  const short = run('perplexity', fixture('smollm2-f32'), '--text', TEXT, '--ctx', '100000')
  assert.equal(short.status, 1)
  assert.match(short.stderr, /fewer than one window of 100000 \(INVALID_OPTION\)/)
})

test('our dump matches mlx-lm\'s; scored against mlx-lm\'s, our KL is mlx-lm\'s own, with and without a quantized KV cache', () => {
  const teacher = fixture('teacher-f32')
  const dir = path.join(tmpdir('eval-dump'), 'ours')
  const printed = ok('dump', fixture('smollm2-f32'), '--text', TEXT, '--out', dir, '--ctx', '128', '--n', '2', '--top-k', '64', '--chunk', '48')
  assert.equal(printed.trim(), dir)
  const theirs = readJson('teacher-f32/manifest.json')
  const ours = JSON.parse(fs.readFileSync(path.join(dir, 'manifest.json'), 'utf8'))
  for (const key of ['format_version', 'corpus_sha256', 'ctx_len', 'n_seqs', 'top_k', 'positions_per_seq', 'vocab_size']) {
    assert.equal(ours[key], theirs[key], key)
  }
  assert.match(ours.created, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/)
  assert.deepEqual(fs.readFileSync(path.join(dir, 'tokens.bin')), fs.readFileSync(path.join(teacher, 'tokens.bin')))
  for (const seq of [0, 1]) {
    const [a, b] = [records(dir, seq, 64), records(teacher, seq, 64)]
    assert.equal(a.length, 127)
    assert.equal(b.length, 127)
    a.forEach((r, i) => {
      assert.equal(r.ids[0], b[i].ids[0], `seq ${seq} position ${i}: top-1`)
      // One f16 step at the largest logits (|logit| < 64) at most, and f32 noise on the logsumexp.
      r.logits.forEach((l, j) => assert.ok(Math.abs(l - b[i].logits[j]) <= 2 ** -5 || r.ids[j] !== b[i].ids[j], `seq ${seq} position ${i} logit ${j}`))
      assert.ok(Math.abs(r.lse - b[i].lse) < 1e-4 * Math.abs(b[i].lse) + 1e-4, `seq ${seq} position ${i}: logsumexp`)
    })
  }

  // f16 storage rounds an f32 teacher's logits (by up to 2^-7 at 16..32): KL is near 0, not 0.
  const r = json('kl', '--candidate', fixture('smollm2-f32'), '--reference-logits', teacher, '--chunk', '48')
  assert.equal(r.sequences, 2)
  assert.equal(r.report.positions, 254)
  assert.equal(r.report.top1Agreement, 1)
  assert.ok(Math.abs(r.report.kl.mean) < 1e-3 && r.report.kl.p95 < 1e-2 && r.report.kl.max < 5e-2, JSON.stringify(r.report.kl))
  assert.ok(r.report.capturedMass.mean > 0.5 && r.report.capturedMass.mean <= 1.01 && r.report.capturedMass.min > 0)
  const text = ok('kl', '--candidate', fixture('smollm2-f32'), '--reference-logits', teacher, '--n', '1', '--chunk', '48')
  assert.match(text, /1 sequences × 127 positions, top-64, chunk 48/)
  assert.match(text, /KL\s+mean \S+\s+p95 \S+\s+max \S+/)
  assert.match(text, /top-1 agreement 1\.0000/)
  console.log(`smollm2-f32 vs mlx-lm's dump: KL mean ${r.report.kl.mean}, p95 ${r.report.kl.p95}, captured mass ${r.report.capturedMass.mean}`)

  // With the KV cache quantized after each forward: the KL mlx-lm computes for itself with
  // kv_bits (scripts/mlx_lm_eval.py kl) against the same dump.
  for (const bits of [8, 4]) {
    const ref = readJson(`ref-eval-kv${bits}.json`)
    const q = json('kl', '--candidate', fixture('smollm2-f32'), '--reference-logits', teacher, '--chunk', '48', '--kv-bits', String(bits)).report
    assert.equal(q.positions, ref.positions)
    for (const key of ['mean', 'p95', 'max']) {
      assert.ok(Math.abs(q.kl[key] - ref.kl[key]) <= 1e-4 * Math.abs(ref.kl[key]) + 1e-9, `${bits}-bit KL ${key}: ours ${q.kl[key]}, mlx-lm ${ref.kl[key]}`)
    }
    assert.equal(q.top1Agreement, ref.top1_agreement)
    console.log(`smollm2-f32, ${bits}-bit KV vs mlx-lm's f32-KV dump: KL mean ${q.kl.mean} (mlx-lm ${ref.kl.mean}), top-1 agreement ${q.top1Agreement}`)
  }
})

test('a dump scored against the model that made it, at the same chunk: KL exactly 0, top-1 agreement 1; 8- and 4-bit KV against it', () => {
  // A bf16 model: its logits are exact in the dump's f16 (mlx-bun's saved-teacher case).
  const model = fixture('smollm2-bf16')
  const dir = path.join(tmpdir('eval-self'), 'dump')
  ok('dump', model, '--text', TEXT, '--out', dir, '--ctx', '64', '--n', '1', '--top-k', '32', '--chunk', '24')
  const r = json('kl', '--candidate', model, '--reference-logits', dir, '--chunk', '24')
  assert.equal(r.report.positions, 63)
  assert.deepEqual(r.report.kl, { mean: 0, p95: 0, max: 0 })
  assert.equal(r.report.top1Agreement, 1)
  assert.ok(r.report.capturedMass.mean > 0 && r.report.capturedMass.mean <= 1)

  // What a quantized KV cache costs against the bf16 one the dump was made with (quantized from
  // the first chunk on): something at 8 bits, more at 4.
  const [kv8, kv4] = ['8', '4'].map((bits) => json('kl', '--candidate', model, '--reference-logits', dir, '--chunk', '24', '--kv-bits', bits))
  assert.equal(kv8.kvBits, 8)
  assert.equal(kv4.kvBits, 4)
  assert.ok(kv8.report.kl.mean > 0 && kv4.report.kl.mean > kv8.report.kl.mean, `${kv8.report.kl.mean} ${kv4.report.kl.mean}`)
  assert.ok(kv8.report.top1Agreement > 0.5 && kv4.report.top1Agreement > 0.5)
  for (const [bits, k] of [[8, kv8], [4, kv4]]) {
    console.log(`smollm2-bf16, ${bits}-bit KV vs bf16 KV: KL mean ${k.report.kl.mean}, p95 ${k.report.kl.p95}, top-1 agreement ${k.report.top1Agreement}`)
  }
  const bad = run('kl', '--candidate', model, '--reference-logits', dir, '--kv-bits', '7')
  assert.equal(bad.status, 1)
  assert.match(bad.stderr, /kvBits: bits must be one of 2, 3, 4, 5, 6, 8, got 7 \(INVALID_OPTION\)/)
})

test('damaged dumps are INVALID_LOGITS_DUMP, never a panic or a huge allocation', () => {
  const teacher = fixture('teacher-f32')
  const model = fixture('smollm2-f32')
  const copy = (edit) => {
    const dir = tmpdir('eval-bad')
    for (const f of fs.readdirSync(teacher)) fs.copyFileSync(path.join(teacher, f), path.join(dir, f))
    edit(dir)
    return dir
  }
  const manifest = (change) => (dir) => {
    const p = path.join(dir, 'manifest.json')
    fs.writeFileSync(p, JSON.stringify({ ...JSON.parse(fs.readFileSync(p, 'utf8')), ...change }))
  }
  const poke = (file, offset, value) => (dir) => {
    const p = path.join(dir, file)
    const buf = fs.readFileSync(p)
    buf.writeInt32LE(value, offset)
    fs.writeFileSync(p, buf)
  }
  const cases = [
    [(dir) => fs.rmSync(path.join(dir, 'manifest.json')), /manifest\.json: cannot read/],
    [(dir) => fs.truncateSync(path.join(dir, 'seq-1.bin'), 1000), /seq-1\.bin: 1000 bytes where the manifest implies 49276/],
    [manifest({ n_seqs: 3 }), /tokens\.bin: 1024 bytes where the manifest implies 1536/],
    [manifest({ top_k: 1e12 }), /top_k 1000000000000 is outside/],
    [manifest({ ctx_len: -1 }), /invalid value: integer `-1`/],
    [manifest({ format_version: 2 }), /format_version 2/],
    [manifest({ vocab_size: 32000 }), /vocabulary has 32000 tokens, the candidate's 49152/],
    // Found as the sequences are read, after the model loaded.
    [poke('tokens.bin', 128 * 4 + 8, 49152), /sequence 1, token 2: id 49152 is outside the candidate's vocabulary/],
    [poke('seq-0.bin', 5 * (64 * 6 + 4) + 4, -7), /seq-0\.bin: position 5: id -7 is outside/],
  ]
  for (const [edit, reason] of cases) {
    const r = run('kl', '--candidate', model, '--reference-logits', copy(edit))
    assert.equal(r.status, 1, `${reason}: ${r.stdout}`)
    assert.match(r.stderr, /\(INVALID_LOGITS_DUMP\)/)
    assert.match(r.stderr, reason)
    assert.doesNotMatch(r.stderr, /panicked/)
  }
  // A candidate of another vocabulary, before it is loaded.
  const other = run('kl', '--candidate', fixture('gemma3-bf16'), '--reference-logits', teacher)
  assert.equal(other.status, 1)
  assert.match(other.stderr, /vocabulary has 49152 tokens, the candidate's 262144 \(INVALID_LOGITS_DUMP\)/)
  assert.equal(run('kl', '--candidate', model, '--reference-logits', teacher, '--n', '0').status, 2)
})
