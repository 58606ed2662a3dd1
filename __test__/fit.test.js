'use strict'
// fit, thisMachine, skuMatrix and `mlx-bun fit` on the real fixtures' configs and weight sizes,
// against mlx-bun's formulas worked out here from config.json: KV = layers × 2 × KV heads ×
// head dim × 2 B a token (sliding layers capped at their window), transient = 0.55 MB per chunk
// token + the attention scores of head dims MLX's fused kernel does not serve, usable = RAM × 0.75.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const { spawnSync } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')

const mlx = require('..')
const { ROOT, fixture, tmpdir } = require('./helpers')

const GIB = 2 ** 30
const M4_PRO_24 = { name: 'M4 Pro 24GB', ramBytes: 24 * GIB, bandwidthGBs: 273 }

/** Every safetensors file's size: the registry's `sizeBytes`, what `mlx-bun fit` bills. */
function weightsBytes(dir) {
  return fs.readdirSync(dir).filter((f) => f.endsWith('.safetensors')).reduce((n, f) => n + fs.statSync(path.join(dir, f)).size, 0)
}

test('SmolLM2: full attention, head dim 64 (fused: no scores term), the whole context fits', () => {
  const dir = fixture('smollm2-f32')
  const raw = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8'))
  const config = mlx.loadModelConfig(dir)
  const w = weightsBytes(dir)
  const perToken = raw.num_hidden_layers * 2 * raw.num_key_value_heads * raw.head_dim * 2
  assert.equal(perToken, 23040)
  const r = mlx.fit(config, w, 4096, M4_PRO_24)
  assert.deepEqual(Object.keys(r).sort(), ['contextTokens', 'fits', 'kvBytes', 'maxSafeContext', 'predictedDecodeTps', 'totalBytes', 'transientBytes', 'usableBytes', 'weightsBytes'])
  assert.equal(r.contextTokens, 4096)
  assert.equal(r.weightsBytes, w)
  assert.equal(r.kvBytes, perToken * 4096)
  assert.equal(r.transientBytes, 2048 * 0.55e6)
  assert.equal(r.totalBytes, w + perToken * 4096 + 2048 * 0.55e6)
  assert.equal(r.usableBytes, 24 * GIB * 0.75)
  assert.equal(r.fits, true)
  assert.equal(r.maxSafeContext, raw.max_position_embeddings)
  assert.ok(Math.abs(r.predictedDecodeTps - (273e9 / (w + perToken * 4096)) * 0.82) < 1e-9)
  // The defaults: this machine, a 2048-token chunk (below it, the context's own tokens).
  assert.deepEqual(mlx.fit(config, w, 4096), mlx.fit(config, w, 4096, mlx.thisMachine(), 2048, 0))
  assert.equal(mlx.fit(config, w, 100, M4_PRO_24).transientBytes, 100 * 0.55e6)
  // A budget replaces RAM × 0.75; the safe context then fits and one more token does not.
  const budget = w + 1.2e9
  const n = mlx.fit(config, w, 0, M4_PRO_24, 2048, 0, budget).maxSafeContext
  assert.equal(n, Math.floor((budget - w - 2048 * 0.55e6) / perToken))
  assert.equal(mlx.fit(config, w, n, M4_PRO_24, 2048, 0, budget).fits, true)
  assert.equal(mlx.fit(config, w, n + 1, M4_PRO_24, 2048, 0, budget).fits, false)
  assert.equal(mlx.fit(config, w, 10, M4_PRO_24, 2048, 0, w - 1).maxSafeContext, 0, 'not even the weights fit')
  // An affine 4-bit cache: 0.5 + 4/64 bytes an element; kv_config.json's form per layer.
  assert.equal(mlx.fit(config, w, 1000, M4_PRO_24, 2048, 0, undefined, { kvBits: 4 }).kvBytes, (perToken / 2) * 0.5625 * 1000)
  const perLayer = mlx.fit(config, w, 1000, M4_PRO_24, 2048, 0, undefined, { kvConfig: [{ layerIdx: 0, bits: 8, groupSize: 32 }] })
  assert.equal(perLayer.kvBytes, (384 * 1.125 + 29 * 384 * 2) * 1000)
})

test('Gemma 3: head dim 256 bills the scores, sliding layers stop at the window, safe context by bisection', () => {
  const dir = fixture('gemma3-bf16')
  const config = mlx.loadModelConfig(dir)
  const t = config.text
  assert.deepEqual([t.layerTypes.filter((k) => k === 'sliding_attention').length, t.slidingWindow, t.headDim, t.numAttentionHeads], [15, 512, 256, 4])
  const w = weightsBytes(dir)
  const r = mlx.fit(config, w, 4096, M4_PRO_24)
  // 3 full layers × 2 × 1 head × 256 × 2 B a token, 15 sliding ones for their 512 positions.
  assert.equal(r.kvBytes, 3072 * 4096 + 15360 * 512)
  // The last chunk: 4 heads × 2048 queries × 4096 keys × 2 B (a full layer sees every key).
  assert.equal(r.transientBytes, 2048 * 0.55e6 + 4 * 2048 * 4096 * 2)
  // Within the first chunk the queries are the context itself; 8 queries or fewer fuse.
  assert.equal(mlx.fit(config, w, 1000, M4_PRO_24).transientBytes, 1000 * 0.55e6 + 4 * 1000 * 1000 * 2)
  assert.equal(mlx.fit(config, w, 8, M4_PRO_24).transientBytes, 8 * 0.55e6)
  for (const budget of [w + 5e8, w + 1.2e9, w + 1.6e9]) {
    const n = mlx.fit(config, w, 0, M4_PRO_24, 2048, 0, budget).maxSafeContext
    assert.ok(n > 0 && n < t.maxPositionEmbeddings, `${n}`)
    assert.equal(mlx.fit(config, w, n, M4_PRO_24, 2048, 0, budget).fits, true)
    assert.equal(mlx.fit(config, w, n + 1, M4_PRO_24, 2048, 0, budget).fits, false)
  }
})

test('thisMachine, skuMatrix and COEXIST_FRACTION', () => {
  const here = mlx.thisMachine()
  assert.equal(here.name, 'this machine')
  assert.equal(here.ramBytes, os.totalmem())
  if (process.platform === 'linux') {
    const cpu = /^model name\s*:\s*(.+)$/m.exec(fs.readFileSync('/proc/cpuinfo', 'utf8'))
    assert.equal(here.chip, cpu ? cpu[1].trim() : null)
    assert.deepEqual([here.bandwidthGBs, here.bandwidthSource], [51.2, 'estimated'])
  }
  assert.deepEqual(mlx.thisMachine(400), { ...here, bandwidthGBs: 400, bandwidthSource: 'given' })
  assert.equal(mlx.COEXIST_FRACTION, 0.6)

  const dir = fixture('smollm2-f32')
  const config = mlx.loadModelConfig(dir)
  const w = weightsBytes(dir)
  const rows = mlx.skuMatrix(config, w, 32768)
  assert.equal(rows.length, 41)
  assert.deepEqual(rows[0], { sku: 'M1', ramGB: 8, fits: true, maxContext: 8192, decodeTps: mlx.fit(config, w, 32768, { name: 'M1', ramBytes: 8 * GIB, bandwidthGBs: 68 }).predictedDecodeTps })
  const m4 = rows.find((r) => r.sku === 'M4 Pro' && r.ramGB === 24)
  const want = mlx.fit(config, w, 32768, M4_PRO_24)
  assert.deepEqual(m4, { sku: 'M4 Pro', ramGB: 24, fits: want.fits, maxContext: want.maxSafeContext, decodeTps: want.predictedDecodeTps })
})

test('bad arguments throw INVALID_OPTION naming them; unbillable KV schemes UNSUPPORTED_OPTION', () => {
  const config = mlx.loadModelConfig(fixture('smollm2-f32'))
  const cases = [
    [() => mlx.fit({}, 1, 1), 'INVALID_OPTION', /config/],
    [() => mlx.fit(config, '1e9', 1), 'INVALID_OPTION', /weightsBytes: must be a number/],
    [() => mlx.fit(config, 1e9, -1), 'INVALID_OPTION', /ctx/],
    [() => mlx.fit(config, 1e9, 1.5), 'INVALID_OPTION', /ctx/],
    [() => mlx.fit(config, 1e9, 1, M4_PRO_24, 0), 'INVALID_OPTION', /chunk/],
    [() => mlx.fit(config, 1e9, 1, M4_PRO_24, 2048, 2e9), 'INVALID_OPTION', /expertsBytes/],
    [() => mlx.fit(config, NaN, 1), 'INVALID_OPTION', /weightsBytes/],
    [() => mlx.fit(config, 1e9, 1, { ramBytes: GIB, bandwidthGBs: 0 }), 'INVALID_OPTION', /bandwidthGBs/],
    [() => mlx.fit(config, 1e9, 1, { ramBytes: GIB }), 'INVALID_OPTION', /machine.bandwidthGBs/],
    [() => mlx.fit(config, 1e9, 1, { ...M4_PRO_24, ram: 1 }), 'INVALID_OPTION', /ram: not a machine option/],
    [() => mlx.fit(config, 1e9, 1, M4_PRO_24, 2048, 0, undefined, { kvBits: 7 }), 'INVALID_OPTION', /kvBits/],
    [() => mlx.fit(config, 1e9, 1, M4_PRO_24, 2048, 0, undefined, { kvBit: 4 }), 'INVALID_OPTION', /did you mean 'kvBits'/],
    [() => mlx.fit(config, 1e9, 1, M4_PRO_24, 2048, 0, undefined, { kvBits: 4, kvConfig: [] }), 'INVALID_OPTION', /not both/],
    [() => mlx.fit(config, 1e9, 1, M4_PRO_24, 2048, 0, undefined, { kvConfig: [{ layerIdx: 30, bits: 4, groupSize: 64 }] }), 'INVALID_OPTION', /layerIdx/],
    [() => mlx.fit(config, 1e9, 1, M4_PRO_24, 2048, 0, undefined, { kvConfig: [{ layer: 0, bits: 4, groupSize: 64 }] }), 'INVALID_OPTION', /layer: not a kvConfig option/],
    [() => mlx.fit(config, 1e9, 1, M4_PRO_24, 2048, 0, undefined, { turboQuant: { kBits: 3, vBits: 3 } }), 'UNSUPPORTED_OPTION', /turboQuant/],
    [() => mlx.fit(config, 1e9, 1, M4_PRO_24, 2048, 0, undefined, { kvBits: 4, quantizedKvStart: 5000 }), 'UNSUPPORTED_OPTION', /quantizedKvStart/],
    [() => mlx.thisMachine(-5), 'INVALID_OPTION', /bandwidthGBs/],
    [() => mlx.skuMatrix(config, 1e9, 1, 2e9), 'INVALID_OPTION', /expertsBytes/],
  ]
  for (const [call, code, message] of cases) {
    assert.throws(call, (e) => e instanceof Error && e.code === code && message.test(e.message), `${call}`)
  }
})

test('`mlx-bun fit` prints the same report, as JSON and as a table', () => {
  const dir = fixture('smollm2-f32')
  const bin = path.join(ROOT, 'target', 'release', 'mlx-bun')
  const home = tmpdir('fit-home')
  const env = { ...process.env, MLX_BUN_HOME: home, HF_HUB_CACHE: path.join(home, 'hub') }
  const run = (...args) => spawnSync(bin, ['fit', ...args], { encoding: 'utf8', env })
  const json = run(dir, '--ctx', '4096', '--kv-bits', '4', '--json')
  assert.equal(json.status, 0, json.stderr)
  const out = JSON.parse(json.stdout)
  const config = mlx.loadModelConfig(dir)
  assert.equal(out.model, 'smollm2-f32')
  assert.equal(out.kvBits, 4)
  assert.deepEqual(out.machine, mlx.thisMachine())
  assert.deepEqual(out.report, mlx.fit(config, weightsBytes(dir), 4096, mlx.thisMachine(), 2048, 0, undefined, { kvBits: 4 }))
  assert.equal(out.skuMatrix, undefined)

  const table = run(dir, '--skus')
  assert.equal(table.status, 0, table.stderr)
  const want = mlx.fit(config, weightsBytes(dir), 8192)
  assert.match(table.stdout, /smollm2-f32 @ 8,192 context/)
  assert.match(table.stdout, new RegExp(`max safe context\\s+${want.maxSafeContext.toLocaleString('en-US')} tokens`))
  assert.match(table.stdout, new RegExp(`predicted decode\\s+${want.predictedDecodeTps.toFixed(1)} tok/s`))
  assert.match(table.stdout, want.fits ? /\bFITS\b/ : /DOES NOT FIT/)
  assert.match(table.stdout, /M4 Pro\s+24 GB\s+fits\s+8,192/)

  const missing = run('no-such-model-anywhere')
  assert.equal(missing.status, 1)
  assert.match(missing.stderr, /MODEL_NOT_FOUND/)
  const bad = run(dir, '--kv-bits', '7')
  assert.equal(bad.status, 1)
  assert.match(bad.stderr, /kvBits.*INVALID_OPTION/)
  // A reader that goes away (`| head`) ends it as a Unix filter ends: SIGPIPE's status, no panic.
  const closed = spawnSync('bash', ['-c', `set -o pipefail; "${bin}" fit "${dir}" --skus | true`], { encoding: 'utf8', env })
  assert.ok([0, 141].includes(closed.status), `status ${closed.status}: ${closed.stderr}`)
  assert.doesNotMatch(closed.stderr, /panicked|Broken pipe/)
})
