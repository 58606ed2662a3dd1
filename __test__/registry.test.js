'use strict'
// Models on disk: `Registry` over a fake Hugging Face cache and $MLX_BUN_HOME/models (scan, list
// filters, canonical revisions, resolve with its typed errors, the index file), `downloadModel`
// against a loopback fake hub (the cache layout, resume after a cut connection, checksum
// failures that leave nothing behind, an unreachable hub, progress), and `mlx-bun ls` / `get`.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('node:crypto')
const fs = require('node:fs')
const http = require('node:http')
const path = require('node:path')
const { execFile } = require('node:child_process')

const mlx = require('..')
const { ROOT, tmpdir, writeSafetensors, writeGguf, expectCode, within } = require('./helpers')

const f32 = (rows, cols) => ({ shape: [rows, cols], data: Float32Array.from({ length: rows * cols }, (_, i) => i / 7) })
const json = (file, v) => fs.writeFileSync(file, JSON.stringify(v))
const sha = (c) => c.repeat(40)

/** A model folder: config.json, one safetensors file and optional extra files. */
function modelFolder(dir, config, tensors, extra = {}) {
  fs.mkdirSync(dir, { recursive: true })
  json(path.join(dir, 'config.json'), config)
  if (tensors) writeSafetensors(path.join(dir, 'model.safetensors'), tensors)
  for (const [name, text] of Object.entries(extra)) fs.writeFileSync(path.join(dir, name), text)
  return dir
}

/** A hub snapshot whose files are symlinks into blobs/, as huggingface_hub writes them. */
function linkedSnapshot(repoDir, commit, build) {
  const staging = modelFolder(path.join(repoDir, 'staging'), ...build)
  const snap = path.join(repoDir, 'snapshots', commit)
  fs.mkdirSync(snap, { recursive: true })
  fs.mkdirSync(path.join(repoDir, 'blobs'), { recursive: true })
  for (const name of fs.readdirSync(staging)) {
    const bytes = fs.readFileSync(path.join(staging, name))
    const id = crypto.createHash('sha256').update(bytes).digest('hex')
    fs.writeFileSync(path.join(repoDir, 'blobs', id), bytes)
    fs.symlinkSync(`../../blobs/${id}`, path.join(snap, name))
  }
  fs.rmSync(staging, { recursive: true })
  return snap
}

const QWEN_SMALL = 'org/Qwen3-0.6B-4bit'
const QWEN_BIG = 'org/Qwen3-1.7B'
const GEMMA = 'google/gemma-4-12b-it'
const DRAFTER = 'org/Qwen3-0.6B-4bit-assistant'

/** The fake machine: an HF cache (hub/) and an mlx-bun home with models/. */
function fakeMachine() {
  const root = tmpdir('registry')
  const hub = path.join(root, 'hf', 'hub')
  const home = path.join(root, 'home')
  const repo = (id) => path.join(hub, `models--${id.replaceAll('/', '--')}`)
  const qwen = { model_type: 'qwen3', num_hidden_layers: 2, hidden_size: 64, vocab_size: 256, quantization: { group_size: 64, bits: 4 } }
  const p = {
    hub,
    home,
    qwenNew: linkedSnapshot(repo(QWEN_SMALL), sha('b'), [qwen, { w: f32(16, 16) }, {
      'tokenizer_config.json': JSON.stringify({ chat_template: '{% if tools %}<tool_call>{% endif %}' }),
      'README.md': '---\nlicense: apache-2.0\n---\n# Qwen3',
      'model.safetensors.index.json': JSON.stringify({ metadata: { total_parameters: 600000000 }, weight_map: {} }),
    }]),
    qwenOld: modelFolder(path.join(repo(QWEN_SMALL), 'snapshots', sha('a')), qwen, { w: f32(16, 16) }),
    big: modelFolder(path.join(repo(QWEN_BIG), 'snapshots', sha('c')), { model_type: 'qwen3', num_hidden_layers: 4 },
      { 'model.layers.0.mlp.experts.0.weight': f32(32, 32), 'model.embed_tokens.weight': f32(64, 64) }),
    gemma: modelFolder(path.join(repo(GEMMA), 'snapshots', sha('d')),
      { model_type: 'gemma4', text_config: { num_hidden_layers: 3, hidden_size: 32 }, vision_config: { model_type: 'gemma4_unified_vision' } }, { w: f32(40, 40) }),
    drafter: modelFolder(path.join(repo(DRAFTER), 'snapshots', sha('e')), { model_type: 'qwen3_assistant' }, { w: f32(4, 4) }),
    local: modelFolder(path.join(home, 'models', 'my-llama'), { model_type: 'llama' }, { w: f32(8, 8) }),
    gguf: path.join(home, 'models', 'tiny.Q8.gguf'),
  }
  fs.mkdirSync(path.join(repo(QWEN_SMALL), 'refs'))
  fs.writeFileSync(path.join(repo(QWEN_SMALL), 'refs', 'main'), sha('b'))
  modelFolder(path.join(repo('org/NoWeights'), 'snapshots', sha('f')), { model_type: 'llama' }, null) // config only: not a model
  modelFolder(path.join(hub, 'datasets--org--data', 'snapshots', sha('1')), { model_type: 'llama' }, { w: f32(2, 2) })
  writeGguf(p.gguf, { 'general.architecture': 'llama', 'general.license': 'mit' }, [{ name: 'token_embd.weight', dims: [32, 4], type: 0, data: Buffer.alloc(512) }])
  fs.writeFileSync(path.join(home, 'models', '.SmolLM2.gguf.part'), 'a download in progress')
  return p
}

const size = (file) => fs.statSync(file).size

describe('Registry', () => {
  let m
  let reg
  before(async () => {
    m = fakeMachine()
    reg = new mlx.Registry({ dbPath: path.join(m.home, 'registry.json'), hubDir: m.hub, home: m.home })
    assert.equal(await reg.scan(), 7)
  })

  test('scan reads each model snapshot, model folder and GGUF file', () => {
    const all = reg.list()
    assert.deepEqual(all.map((r) => r.sizeBytes), all.map((r) => r.sizeBytes).toSorted((a, b) => a - b), 'smallest first')
    const byPath = Object.fromEntries(all.map((r) => [r.path, r]))
    assert.deepEqual(Object.keys(byPath).toSorted(), [m.qwenNew, m.qwenOld, m.big, m.gemma, m.drafter, m.local, m.gguf].toSorted())
    const q = byPath[m.qwenNew]
    assert.equal(q.repoId, QWEN_SMALL)
    assert.equal(q.modelType, 'qwen3')
    assert.equal(q.sizeBytes, size(path.join(m.qwenNew, 'model.safetensors')), 'sizes follow the symlinks into blobs/')
    assert.deepEqual([q.quantBits, q.quantGroupSize, q.quantMode], [4, 64, 'affine'])
    assert.deepEqual([q.numLayers, q.hiddenSize, q.vocabSize, q.paramCount], [2, 64, 256, 600000000])
    assert.deepEqual([q.hasToolTemplate, q.license, q.hasVisionSidecar, q.visionConfigType], [true, 'apache-2.0', false, null])
    assert.ok(q.scannedAt > Date.now() - 60_000 && q.scannedAt <= Date.now())
    const big = byPath[m.big]
    assert.deepEqual([big.expertsBytes, big.quantBits, big.quantMode, big.hasToolTemplate], [32 * 32 * 4, null, null, false])
    assert.deepEqual([byPath[m.gemma].numLayers, byPath[m.gemma].hiddenSize, byPath[m.gemma].visionConfigType], [3, 32, 'gemma4_unified_vision'])
    const g = byPath[m.gguf]
    assert.deepEqual([g.repoId, g.modelType, g.sizeBytes, g.quantMode, g.license, g.paramCount], ['tiny.Q8', 'llama', size(m.gguf), 'F32', 'mit', 128])
    assert.equal(byPath[m.local].repoId, 'my-llama')
  })

  test('list filters: vision, maxBytes, query (case-insensitive, repo id or model type)', () => {
    const ids = (f) => reg.list(f).map((r) => r.repoId)
    assert.deepEqual(ids({ vision: true }), [GEMMA])
    assert.ok(!ids({ vision: false }).includes(GEMMA) && ids({ vision: false }).length === 6)
    const qwenSize = size(path.join(m.qwenOld, 'model.safetensors'))
    assert.deepEqual(reg.list({ maxBytes: qwenSize }).every((r) => r.sizeBytes <= qwenSize), true)
    assert.ok(ids({ maxBytes: qwenSize }).includes(QWEN_SMALL) && !ids({ maxBytes: qwenSize }).includes(QWEN_BIG))
    assert.deepEqual(ids({ query: 'QWEN3-1.7' }), [QWEN_BIG])
    assert.deepEqual(ids({ query: 'gemma4' }), [GEMMA], 'the model type matches too')
    assert.deepEqual(ids({ query: 'qwen', maxBytes: qwenSize }).toSorted(), [QWEN_SMALL, QWEN_SMALL, DRAFTER])
    assert.deepEqual(ids({ query: 'qwen', vision: true }), [])
    assert.throws(() => reg.list({ visoin: true }), (e) => expectCode(e, 'INVALID_OPTION', /visoin: not a list option \(did you mean 'vision'\?\)/))
    assert.throws(() => reg.list({ maxBytes: -1 }), (e) => expectCode(e, 'INVALID_OPTION', /maxBytes/))
  })

  test('listCanonical keeps one snapshot per repository: the one refs/main names', () => {
    assert.equal(reg.list({ query: 'qwen3-0.6b-4bit' }).length, 3)
    assert.deepEqual(reg.listCanonical({ query: 'qwen3-0.6b-4bit' }).map((r) => r.path), [m.drafter, m.qwenNew])
  })

  test('resolve: repo ids, fragments and paths; ambiguous and unknown queries are typed errors', () => {
    assert.equal(reg.resolve(QWEN_BIG).path, m.big)
    assert.equal(reg.resolve('ORG/qwen3-1.7b').path, m.big, 'repo ids compare case-insensitively')
    assert.equal(reg.resolve('Qwen3-0.6B').path, m.qwenNew, 'two revisions are one model; the drafter is no candidate')
    assert.equal(reg.resolve('gemma').repoId, GEMMA)
    assert.equal(reg.resolve(m.qwenOld).path, m.qwenOld, 'a path names that very snapshot')
    assert.equal(reg.resolve(m.gguf).repoId, 'tiny.Q8')
    const unscanned = modelFolder(path.join(tmpdir('registry-extra'), 'loose'), { model_type: 'phi3' }, { w: f32(2, 2) })
    assert.equal(reg.resolve(unscanned).modelType, 'phi3', 'a model folder not in the index is read on the spot')
    assert.throws(() => reg.resolve('qwen3'), (e) => {
      expectCode(e, 'AMBIGUOUS_MODEL', /"qwen3" is ambiguous/)
      assert.deepEqual(e.candidates, [QWEN_SMALL, QWEN_BIG])
      return true
    })
    assert.throws(() => reg.resolve('no-such-model'), (e) => expectCode(e, 'MODEL_NOT_FOUND', /no model matching "no-such-model"/))
    assert.throws(() => reg.resolve(''), (e) => expectCode(e, 'INVALID_OPTION'))
  })

  test('the index file carries the last scan to a new Registry; records of deleted files drop out', async () => {
    const again = new mlx.Registry(path.join(m.home, 'registry.json'))
    assert.deepEqual(again.list(), reg.list())
    assert.deepEqual(new mlx.Registry(':memory:').list().filter((r) => r.path.startsWith(m.hub)), [])
    fs.rmSync(m.qwenOld, { recursive: true })
    assert.ok(!again.list().some((r) => r.path === m.qwenOld))
    const weights = path.join(m.drafter, 'model.safetensors')
    const rescan = new mlx.Registry({ dbPath: ':memory:', hubDir: m.hub, home: m.home })
    await rescan.scan()
    assert.deepEqual(rescan.list().map((r) => r.path).toSorted(), [m.qwenNew, m.big, m.gemma, m.drafter, m.local, m.gguf].toSorted())
    fs.renameSync(weights, `${weights}.away`)
    assert.equal(await rescan.scan(), 5, 'a folder that is no longer a model is dropped at the next scan')
    assert.ok(!rescan.list().some((r) => r.repoId === DRAFTER))
    fs.renameSync(`${weights}.away`, weights)
    again.close()
    assert.throws(() => new mlx.Registry({ dbpath: 'x' }), (e) => expectCode(e, 'INVALID_OPTION', /dbpath: not a registry option \(did you mean 'dbPath'\?\)/))
  })

  test('mlx-bun ls lists the cache named by HF_HOME and MLX_BUN_HOME', async () => {
    const env = { ...process.env, HF_HOME: path.dirname(m.hub), MLX_BUN_HOME: m.home }
    delete env.HF_HUB_CACHE
    const out = JSON.parse(await run(['ls', '--json'], env))
    assert.deepEqual(out.map((r) => r.repoId).toSorted(), [DRAFTER, GEMMA, QWEN_SMALL, QWEN_BIG, 'my-llama', 'tiny.Q8'].toSorted())
    // 0.01 MB = 10485 bytes: the 0.6B (about 1 KiB) and its drafter, not the 1.7B (20 KiB).
    const table = await run(['ls', 'qwen', '--max-size', '0.01MB'], env)
    assert.match(table, /^MODEL\s+SIZE\s+TYPE\s+QUANT\s+PATH\n/)
    assert.match(table, new RegExp(`\n${QWEN_SMALL}\\s+[\\d.]+ KiB\\s+qwen3\\s+4-bit g64\\s+${m.qwenNew}\n`))
    assert.equal(table.trim().split('\n').length, 3)
    assert.ok(!table.includes(QWEN_BIG))
  })
})

/** Runs the CLI binary; resolves with stdout (rejects with stderr on failure). */
function run(args, env) {
  const bin = path.join(ROOT, 'target', 'release', 'mlx-bun')
  return new Promise((resolve, reject) => {
    execFile(bin, args, { env, timeout: 30_000 }, (err, stdout, stderr) => (err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout)))
  })
}

const REPO = 'test-org/tiny-model'
const gitBlobId = (bytes) => crypto.createHash('sha1').update(`blob ${bytes.length}\0`).update(bytes).digest('hex')
const sha256 = (bytes) => crypto.createHash('sha256').update(bytes).digest('hex')

/**
 * A loopback stand-in for the hub's file API serving one repository: the listing at
 * /api/models/REPO/revision/main and each file at /REPO/resolve/COMMIT/FILE, with Range
 * requests; LFS files redirect to /cdn/FILE like the hub's CDN. `hub.mode[file]` misbehaves on purpose: 'cut' (half the file, then the connection
 * ends; once), 'corrupt' (a flipped byte), 'long' (10 bytes too many), 'slow' (16 pieces, 20 ms
 * apart). Every request is recorded with its Range and Authorization headers.
 */
function fakeHub() {
  const weights = path.join(tmpdir('hub-src'), 'model.safetensors')
  writeSafetensors(weights, { 'model.embed_tokens.weight': f32(256, 1024) })
  const files = {
    'config.json': Buffer.from(JSON.stringify({ model_type: 'llama', num_hidden_layers: 1, hidden_size: 1024, vocab_size: 256 })),
    'tokenizer.json': Buffer.from('{"version":"1.0"}'),
    'model.safetensors': fs.readFileSync(weights),
    'pytorch_model.bin': Buffer.from('not wanted'),
    'consolidated.safetensors': Buffer.from('not wanted either'),
    'onnx/model.json': Buffer.from('{}'),
  }
  const lfs = new Set(['model.safetensors', 'pytorch_model.bin', 'consolidated.safetensors'])
  const commit = crypto.randomBytes(20).toString('hex')
  const listing = {
    sha: commit,
    siblings: Object.entries(files).map(([name, bytes]) => lfs.has(name)
      ? { rfilename: name, size: 134, blobId: gitBlobId(Buffer.from(name)), lfs: { sha256: sha256(bytes), size: bytes.length, pointerSize: 134 } }
      : { rfilename: name, size: bytes.length, blobId: gitBlobId(bytes) }),
  }
  const hub = { files, commit, mode: {}, requests: [], cut: new Set() }
  hub.server = http.createServer((req, res) => {
    hub.requests.push({ url: req.url, range: req.headers.range ?? null, auth: req.headers.authorization ?? null })
    if (req.url === `/api/models/${REPO}/revision/main?blobs=true`) {
      res.writeHead(200, { 'content-type': 'application/json' })
      return res.end(JSON.stringify(listing))
    }
    const prefix = `/${REPO}/resolve/${commit}/`
    const name = [prefix, '/cdn/'].map((p) => (req.url.startsWith(p) ? decodeURIComponent(req.url.slice(p.length)) : null)).find((n) => n)
    if (!Object.hasOwn(files, name ?? '')) {
      res.writeHead(404)
      return res.end('not found')
    }
    if (lfs.has(name) && req.url.startsWith(prefix)) {
      // As the hub does: large files come from a CDN, which must not see the token.
      res.writeHead(302, { location: `/cdn/${encodeURIComponent(name)}` })
      return res.end()
    }
    let bytes = files[name]
    const mode = hub.mode[name]
    if (mode === 'corrupt') bytes = Buffer.concat([Buffer.from([bytes[0] ^ 1]), bytes.subarray(1)])
    if (mode === 'long') bytes = Buffer.concat([bytes, Buffer.alloc(10)])
    const from = Number(/^bytes=(\d+)-$/.exec(req.headers.range ?? '')?.[1] ?? 0)
    const body = bytes.subarray(from)
    res.writeHead(from ? 206 : 200, { 'content-length': body.length, ...(from ? { 'content-range': `bytes ${from}-${bytes.length - 1}/${bytes.length}` } : {}) })
    if (mode === 'cut' && !hub.cut.has(name)) {
      hub.cut.add(name)
      return res.write(body.subarray(0, body.length >> 1), () => req.socket.end())
    }
    if (mode !== 'slow') return res.end(body)
    const piece = Math.ceil(body.length / 16)
    const send = (i) => (i >= 16 ? res.end() : res.write(body.subarray(i * piece, (i + 1) * piece), () => setTimeout(() => send(i + 1), 20)))
    send(0)
  })
  return hub
}

describe('downloadModel', () => {
  let hub
  let endpoint
  before(async () => {
    hub = fakeHub()
    await new Promise((resolve) => hub.server.listen(0, '127.0.0.1', resolve))
    endpoint = `http://127.0.0.1:${hub.server.address().port}`
  })
  after(() => new Promise((resolve) => hub.server.close(resolve)))
  const fresh = (mode = {}) => {
    hub.mode = mode
    hub.requests = []
    return tmpdir('hf-cache')
  }
  const fileRequests = () => hub.requests.filter((r) => r.url.includes('/resolve/')).map((r) => decodeURIComponent(r.url.split('/').pop()))
  const cdnRequests = () => hub.requests.filter((r) => r.url.startsWith('/cdn/'))
  const repoDir = (cache) => path.join(cache, `models--${REPO.replace('/', '--')}`)
  const lfsId = () => sha256(hub.files['model.safetensors'])

  test('a download lands in the hub cache layout, with progress, and Registry finds it', async () => {
    const cacheDir = fresh({ 'model.safetensors': 'slow' })
    const calls = []
    const snap = await within(mlx.downloadModel(REPO, { endpoint, cacheDir, token: 'hf_test', onProgress: (...a) => calls.push(a) }), 'download')
    const repo = repoDir(cacheDir)
    assert.equal(snap, path.join(repo, 'snapshots', hub.commit))
    assert.equal(fs.readFileSync(path.join(repo, 'refs', 'main'), 'utf8'), hub.commit)
    for (const name of ['config.json', 'tokenizer.json', 'model.safetensors']) {
      const id = name === 'model.safetensors' ? lfsId() : gitBlobId(hub.files[name])
      assert.equal(fs.readlinkSync(path.join(snap, name)), `../../blobs/${id}`)
      assert.deepEqual(fs.readFileSync(path.join(snap, name)), hub.files[name])
    }
    assert.deepEqual(fs.readdirSync(snap).toSorted(), ['config.json', 'model.safetensors', 'tokenizer.json'])
    assert.deepEqual(fileRequests().toSorted(), ['config.json', 'model.safetensors', 'tokenizer.json'], 'only what a model needs is fetched')
    assert.equal(cdnRequests().length, 1)
    assert.ok(hub.requests.every((r) => r.auth === (r.url.startsWith('/cdn/') ? null : 'Bearer hf_test')), 'the token goes to the hub, not past its redirect')
    for (const name of ['config.json', 'tokenizer.json', 'model.safetensors']) {
      const mine = calls.filter((c) => c[0] === name)
      assert.ok(mine.length >= 1 && mine.every((c, i) => c[2] === hub.files[name].length && (i === 0 || c[1] >= mine[i - 1][1])), `${name}: ${JSON.stringify(mine)}`)
      assert.equal(mine.at(-1)[1], hub.files[name].length, `${name} ends at its total`)
    }
    assert.ok(calls.filter((c) => c[0] === 'model.safetensors').length >= 3, 'a slow file reports along the way')

    const reg = new mlx.Registry({ dbPath: ':memory:', hubDir: cacheDir, home: tmpdir('empty-home') })
    assert.equal(await reg.scan(), 1)
    const rec = reg.resolve('tiny-model')
    assert.deepEqual([rec.repoId, rec.path, rec.modelType, rec.sizeBytes], [REPO, snap, 'llama', hub.files['model.safetensors'].length])

    hub.requests = []
    assert.equal(await mlx.downloadModel(REPO, { endpoint, cacheDir }), snap)
    assert.deepEqual(fileRequests(), [], 'files in the cache are not fetched again')
  })

  test('a cut connection leaves a .incomplete file that the next call resumes with Range', async () => {
    const cacheDir = fresh({ 'model.safetensors': 'cut' })
    const total = hub.files['model.safetensors'].length
    await assert.rejects(mlx.downloadModel(REPO, { endpoint, cacheDir }), (e) => expectCode(e, 'DOWNLOAD_FAILED', /run again to resume/))
    const blobs = path.join(repoDir(cacheDir), 'blobs')
    const part = path.join(blobs, `${lfsId()}.incomplete`)
    assert.equal(fs.statSync(part).size, total >> 1)
    assert.ok(!fs.existsSync(path.join(repoDir(cacheDir), 'snapshots')), 'no snapshot until every file is verified')
    assert.ok(!fs.readdirSync(blobs).some((n) => n.endsWith('.lock')))

    hub.requests = []
    const snap = await mlx.downloadModel(REPO, { endpoint, cacheDir })
    assert.deepEqual(fileRequests(), ['model.safetensors'], 'the verified files are not fetched again')
    assert.deepEqual(cdnRequests().map((r) => r.range), [`bytes=${total >> 1}-`], 'the Range header follows the redirect')
    assert.deepEqual(fs.readFileSync(path.join(snap, 'model.safetensors')), hub.files['model.safetensors'])
    assert.ok(!fs.existsSync(part))
  })

  for (const [mode, message] of [['corrupt', /model\.safetensors: sha256 [0-9a-f]{64}, the hub lists/], ['long', /model\.safetensors: the server sent more than/]]) {
    test(`a wrong file (${mode}) is a CHECKSUM_MISMATCH that leaves no snapshot and no partial file`, async () => {
      const cacheDir = fresh({ 'model.safetensors': mode })
      await assert.rejects(mlx.downloadModel(REPO, { endpoint, cacheDir }), (e) => expectCode(e, 'CHECKSUM_MISMATCH', message))
      const repo = repoDir(cacheDir)
      assert.deepEqual(fs.readdirSync(repo).toSorted(), ['blobs'], 'no snapshots/, no refs/')
      const verified = [gitBlobId(hub.files['config.json']), gitBlobId(hub.files['tokenizer.json'])]
      assert.deepEqual(fs.readdirSync(path.join(repo, 'blobs')).toSorted(), verified.toSorted(), 'only the verified files stay')
    })
  }

  test('an unreachable hub or an unknown repository fails fast with DOWNLOAD_FAILED', async () => {
    const closed = http.createServer()
    await new Promise((resolve) => closed.listen(0, '127.0.0.1', resolve))
    const port = closed.address().port
    await new Promise((resolve) => closed.close(resolve))
    const t0 = Date.now()
    await assert.rejects(mlx.downloadModel(REPO, { endpoint: `http://127.0.0.1:${port}`, cacheDir: fresh() }), (e) => expectCode(e, 'DOWNLOAD_FAILED', /refused/i))
    assert.ok(Date.now() - t0 < 5000, `took ${Date.now() - t0} ms`)
    await assert.rejects(mlx.downloadModel('test-org/other', { endpoint, cacheDir: fresh() }), (e) => expectCode(e, 'DOWNLOAD_FAILED', /404.*no such repository/))
  })

  test('options are checked; a throwing onProgress stops the download with its error', async () => {
    await assert.rejects(mlx.downloadModel(REPO, { revison: 'main' }), (e) => expectCode(e, 'INVALID_OPTION', /did you mean 'revision'/))
    await assert.rejects(mlx.downloadModel('../etc', { endpoint }), (e) => expectCode(e, 'INVALID_OPTION', /repoId/))
    await assert.rejects(mlx.downloadModel(REPO, { endpoint, revision: '../x' }), (e) => expectCode(e, 'INVALID_OPTION', /revision/))
    const cacheDir = fresh({ 'model.safetensors': 'slow' })
    const boom = new Error('stop here')
    await assert.rejects(mlx.downloadModel(REPO, { endpoint, cacheDir, onProgress: () => { throw boom } }), (e) => e === boom)
    assert.ok(!fs.existsSync(path.join(repoDir(cacheDir), 'snapshots')))
  })

  test('mlx-bun get downloads from HF_ENDPOINT into HF_HUB_CACHE', async () => {
    const cacheDir = fresh()
    const env = { ...process.env, HF_ENDPOINT: endpoint, HF_HUB_CACHE: cacheDir, HF_HOME: tmpdir('get-hf-home'), MLX_BUN_HOME: tmpdir('get-home') }
    delete env.HF_TOKEN
    const out = await run(['get', REPO], env)
    assert.equal(out, `${path.join(repoDir(cacheDir), 'snapshots', hub.commit)}\n`)
    assert.deepEqual(fs.readFileSync(path.join(out.trim(), 'config.json')), hub.files['config.json'])
    assert.ok(hub.requests.every((r) => r.auth === null))
  })
})
