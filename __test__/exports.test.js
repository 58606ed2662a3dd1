'use strict'
// The package's surface: index.js, index.mjs and index.d.ts name the same exports, every class
// declared in index.d.ts has its declared methods at run time, a TypeScript app using every export
// type-checks under `tsc --strict`, and code written from mlx-bun's docs runs unchanged.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const { execFileSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

const mlx = require('..')
const { ROOT, collect, fixture, tmpdir } = require('./helpers')

/** index.d.ts with the files it re-exports (`export * from './types/…'`) inlined. */
function declarations() {
  const top = fs.readFileSync(path.join(ROOT, 'index.d.ts'), 'utf8')
  return top.replace(/^export \* from '(\.\/types\/\w+)'$/gm, (_, file) => fs.readFileSync(path.join(ROOT, `${file}.d.ts`), 'utf8'))
}
const DTS = declarations()

/** Names index.d.ts declares as values (functions, classes, constants), not types. */
function declaredValues() {
  return new Set([...DTS.matchAll(/^export (?:declare )?(?:function|class|const|let|namespace) (\w+)/gm)].map((m) => m[1]))
}

/** `export class X { … }` blocks of index.d.ts: each class's static and instance method names. */
function declaredClasses() {
  const classes = {}
  for (const m of DTS.matchAll(/^export class (\w+)[^{]*\{\n([\s\S]*?)^\}/gm)) {
    const members = { statics: [], methods: [], getters: [] }
    for (const line of m[2].split('\n')) {
      let d
      if ((d = /^ {2}static (\w+)\(/.exec(line))) members.statics.push(d[1])
      else if ((d = /^ {2}(\w+)\(/.exec(line))) members.methods.push(d[1])
      else if ((d = /^ {2}readonly (\w+):/.exec(line))) members.getters.push(d[1])
    }
    classes[m[1]] = members
  }
  return classes
}

test('index.js, index.mjs and index.d.ts export the same names', async () => {
  const cjs = Object.keys(mlx).sort()
  const esm = Object.keys(await import('../index.mjs')).filter((k) => k !== 'default').sort()
  assert.deepEqual(esm, cjs, 'index.mjs lists exactly the exports of index.js')
  assert.deepEqual([...declaredValues()].sort(), cjs, 'index.d.ts declares exactly the exports of index.js')
  const esmDefault = (await import('../index.mjs')).default
  assert.equal(esmDefault, mlx, 'import and require share one module instance')
  for (const name of cjs) assert.ok(mlx[name] !== undefined && mlx[name] !== null, name)
})

test('every class index.d.ts declares has its declared statics, methods and getters', () => {
  const classes = declaredClasses()
  assert.ok(Object.keys(classes).length >= 8, `found classes: ${Object.keys(classes)}`)
  for (const [name, { statics, methods, getters }] of Object.entries(classes)) {
    const cls = mlx[name]
    assert.equal(typeof cls, 'function', `${name} is exported as a class`)
    for (const s of statics) assert.equal(typeof cls[s], 'function', `${name}.${s}`)
    for (const m of methods) assert.equal(typeof cls.prototype[m], 'function', `${name}.prototype.${m}`)
    for (const g of getters) {
      // Native getters live on the prototype; JavaScript classes may set the field per instance.
      const d = Object.getOwnPropertyDescriptor(cls.prototype, g)
      assert.ok(d === undefined || typeof d.get === 'function', `${name}.${g} is a getter`)
    }
  }
  // Spot-check that the parse saw real members.
  assert.ok(classes.Weights.statics.includes('open'))
  assert.ok(classes.ChatTemplate.getters.includes('thinkingFormat'))
  assert.ok(classes.InferenceEngine.methods.includes('open'))
})

test('a TypeScript app using every export type-checks under tsc --strict (ESM and CJS)', () => {
  const tsc = path.join(ROOT, 'node_modules', '.bin', 'tsc')
  try {
    execFileSync(tsc, ['-p', path.join(__dirname, 'types', 'tsconfig.json')], { cwd: ROOT, encoding: 'utf8', stdio: 'pipe' })
  } catch (e) {
    assert.fail(`tsc --strict failed:\n${e.stdout}${e.stderr}`)
  }
  // The consumer really imports every export, so a name missing from index.d.ts fails the check.
  const consumer = fs.readFileSync(path.join(__dirname, 'types', 'consumer.mts'), 'utf8')
  for (const name of declaredValues()) assert.match(consumer, new RegExp(`\\b${name}\\b`), `consumer.mts uses ${name}`)
})

test("code written from mlx-bun's docs runs unchanged: sync createModel, topP 0, and the same code with await", async () => {
  const dir = fixture('smollm2-f32')
  const ids = (tokenizer, template) => tokenizer.encode(template.render([{ role: 'user', content: 'What is the capital of France?' }]), false)
  // As mlx-bun's README writes it: nothing here returns a promise but generate's iteration.
  const config = mlx.loadModelConfig(dir)
  const model = mlx.createModel(mlx.Weights.open(dir), config)
  const tokenizer = mlx.loadTokenizer(dir)
  const template = mlx.ChatTemplate.load(dir)
  const plain = await collect(mlx.generate(model, ids(tokenizer, template), { maxTokens: 6, temperature: 0, topP: 0 }))
  // The same with await on every call, as code written for an async API does.
  const awaited = await mlx.createModel(await mlx.Weights.open(dir), await mlx.loadModelConfig(dir))
  const tokenizer2 = await mlx.loadTokenizer(dir)
  const template2 = await mlx.ChatTemplate.load(dir)
  const again = await collect(mlx.generate(awaited, ids(tokenizer2, template2), { maxTokens: 6, topP: 0 }))
  assert.equal(plain.tokens.length, 6)
  assert.deepEqual(again.tokens, plain.tokens)
  assert.match(tokenizer.decode(plain.tokens), /Paris/)
  model.dispose()
  awaited.dispose()
})

test("loadModelConfig: mlx-bun's text config, kvQuant from kv_config.json, the vision sidecar", () => {
  const src = fixture('smollm2-f32')
  const raw = JSON.parse(fs.readFileSync(path.join(src, 'config.json'), 'utf8'))
  const cfg = mlx.loadModelConfig(src)
  assert.equal(cfg.text.hiddenSize, raw.hidden_size)
  assert.equal(cfg.text.numHiddenLayers, raw.num_hidden_layers)
  assert.equal(cfg.text.numAttentionHeads, raw.num_attention_heads)
  assert.equal(cfg.text.numKeyValueHeads, raw.num_key_value_heads)
  assert.equal(cfg.text.headDim, raw.hidden_size / raw.num_attention_heads)
  assert.equal(cfg.text.intermediateSize, raw.intermediate_size)
  assert.equal(cfg.text.vocabSize, raw.vocab_size)
  assert.equal(cfg.text.maxPositionEmbeddings, raw.max_position_embeddings)
  assert.equal(cfg.text.ropeParameters.full_attention.ropeTheta, raw.rope_theta)
  assert.deepEqual(cfg.text.layerTypes, Array(raw.num_hidden_layers).fill('full_attention'))
  assert.equal(cfg.text.tieWordEmbeddings, raw.tie_word_embeddings)
  assert.equal(cfg.kvQuant, null)
  assert.equal(cfg.hasVisionSidecar, false)

  // A folder with kv_config.json and a vision sidecar (files linked, not copied).
  const dir = path.join(tmpdir('kvq'), 'model')
  fs.mkdirSync(dir)
  for (const f of fs.readdirSync(src)) fs.symlinkSync(path.join(src, f), path.join(dir, f))
  fs.writeFileSync(path.join(dir, 'kv_config.json'), JSON.stringify([{ layer_idx: 0, bits: 8, group_size: 64 }, { layer_idx: 29, bits: 4, group_size: 32 }]))
  fs.writeFileSync(path.join(dir, 'optiq_vision.safetensors'), '')
  const q = mlx.loadModelConfig(dir)
  assert.deepEqual(q.kvQuant, [{ layerIdx: 0, bits: 8, groupSize: 64 }, { layerIdx: 29, bits: 4, groupSize: 32 }])
  assert.equal(q.hasVisionSidecar, true)
  for (const [bad, pattern] of [
    [[{ layer_idx: 30, bits: 8, group_size: 64 }], /layer_idx 30 is not a layer/],
    [[{ layer_idx: 0, bits: 7, group_size: 64 }], /bits is 7/],
    [[{ layer_idx: 0, bits: 8, group_size: 0 }], /group_size is 0/],
    [{ layer_idx: 0 }, /not a list/],
  ]) {
    fs.writeFileSync(path.join(dir, 'kv_config.json'), JSON.stringify(bad))
    assert.throws(() => mlx.loadModelConfig(dir), (e) => e.code === 'INVALID_CONFIG' && /kv_config\.json/.test(e.message) && pattern.test(e.message))
  }
})

test("generate()'s default stop set adds the tokenizer's and generation_config.json's eos ids to config.json's", async () => {
  const src = fixture('smollm2-f32')
  const prompt = [1, 504, 3458, 5477, 282, 4649, 314]
  const free = await collect(mlx.generate(await mlx.loadModel(src), prompt, { maxTokens: 8, eosTokenIds: [] }))
  const stopAt = free.tokens[3]
  const dir = path.join(tmpdir('eos'), 'model')
  fs.mkdirSync(dir)
  for (const f of fs.readdirSync(src)) if (f !== 'generation_config.json') fs.symlinkSync(path.join(src, f), path.join(dir, f))
  fs.writeFileSync(path.join(dir, 'generation_config.json'), JSON.stringify({ eos_token_id: [stopAt] }))
  const model = mlx.createModel(mlx.Weights.open(dir), mlx.loadModelConfig(dir))
  // loadModelConfig keeps mlx-bun's meaning (config.json's ids); generation stops at the merged set.
  assert.ok(!model.config.eosTokenIds.includes(stopAt))
  const stopped = await collect(mlx.generate(model, prompt, { maxTokens: 8 }))
  assert.deepEqual(stopped.tokens, free.tokens.slice(0, free.tokens.indexOf(stopAt)))
  assert.equal(stopped.gen.finishReason, 'stop')
  model.dispose()
})

test('ChatTemplate.thinkingFormat and ensureNativeRuntime', async () => {
  assert.equal(mlx.ChatTemplate.load(fixture('smollm2-f32')).thinkingFormat, null)
  const qwen3 = mlx.ChatTemplate.fromString("{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n{% endif %}")
  assert.equal(qwen3.thinkingFormat, 'think-tag')
  assert.equal(qwen3.supportsThinking, true)
  assert.equal(mlx.ChatTemplate.fromString('{% if enable_thinking %}<|channel>thought{% endif %}').thinkingFormat, 'gemma-channel')
  // mlx-bun's load option that turns the switch off, on a folder whose template has one.
  const dir = path.join(tmpdir('think'), 'model')
  fs.mkdirSync(dir)
  fs.copyFileSync(fixture('smollm2-f32/tokenizer.json'), path.join(dir, 'tokenizer.json'))
  fs.writeFileSync(path.join(dir, 'chat_template.jinja'), qwen3.source)
  assert.equal(mlx.ChatTemplate.load(dir).thinkingFormat, 'think-tag')
  const off = mlx.ChatTemplate.load(dir, { disableThinking: true })
  assert.equal(off.thinkingFormat, null)
  assert.equal(off.supportsThinking, false)
  assert.throws(() => mlx.ChatTemplate.load(dir, { disableThinkng: true }), { code: 'INVALID_OPTION' })

  const rt = await mlx.ensureNativeRuntime()
  assert.equal(rt.dir, mlx.nativeRuntimeDir())
  assert.ok(fs.existsSync(path.join(rt.dir, 'mlx', 'lib')), rt.dir)
  assert.equal(rt.backend, process.platform === 'darwin' ? 'metal' : 'cpu')
  assert.match(rt.version, /^\d+\.\d+\.\d+/)
  assert.ok(rt.device.length > 0)
  await assert.rejects(mlx.ensureNativeRuntime({ destDir: '/tmp/x' }), { code: 'UNSUPPORTED_OPTION' })
  await assert.rejects(mlx.ensureNativeRuntime({ dir: '/tmp/x' }), { code: 'INVALID_OPTION' })
})
