'use strict'
// Parity with Python mlx-lm 0.32.2 on tiny random-weight models of every architecture we support
// (llama, llama with Llama 3 RoPE, mistral all-sliding and mixed, qwen2, qwen3, gemma3_text, phi3,
// phi3 with partial rotary + su RoPE, gemma, gemma2 with both soft-caps, smollm3 with NoPE and
// sliding layers, olmo2, glm4, granite with its multipliers, starcoder2, minicpm, qwen3_moe with
// dense and expert layers, gemma4_text as E2B/E4B are (per-layer inputs, KV shared between layers)
// and as 26B-A4B is (experts beside the MLP, keys as values), qwen3_5 / qwen3_5_moe / qwen3_next
// (gated DeltaNet linear attention beside gated full attention, experts with a shared expert)), each as an f32
// folder and an MLX 4-bit g32 copy. Folders and references are made by scripts/tiny_models.py
// into <fixtures>/tiny.
const { test, describe } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')

const mlx = require('..')
const { fixture, readJson, collect, within, writeGguf, writeSafetensors, tmpdir } = require('./helpers')

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
    const archs = ['llama', 'mistral', 'qwen2', 'qwen3', 'gemma3_text', 'phi3', 'phi3_su', 'gemma', 'gemma2', 'smollm3', 'olmo2', 'glm4', 'granite', 'starcoder2', 'minicpm', 'qwen3_moe', 'qwen3_moe_sparse', 'gemma4_text', 'gemma4_text_moe', 'gemma4_text_full', 'gemma4', 'qwen3_5', 'qwen3_5_moe', 'qwen3_next']
    for (const arch of archs) {
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
          if (p.experts_reached && p.ids.length > 20) {
            // The long prompt reaches every expert of every expert layer in mlx-lm, so logits
            // within 1e-4 of mlx-lm's (below) mean every expert and its routing is exercised.
            const all = Array.from({ length: model.config.raw.num_experts }, (_, e) => e)
            for (const reached of p.experts_reached) assert.deepEqual(reached, all, `${what}: experts mlx-lm routes to`)
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

async function collectOne(engine, request) {
  const o = await within(engine.open(request, { output: 'collect' }).result, 'a collect session', 60_000)
  assert.equal(o.status, 'completed', JSON.stringify(o.error))
  return Array.from(o.output)
}

describe('architectures: rows of one continuous batch equal each alone', () => {
  const BATCH_TOKENS = 24
  for (const m of ref.models.filter((m) => !m.quantized)) {
    test(`${m.name}: 4 sessions of different lengths together`, { timeout: 120_000 }, async () => {
      const model = await mlx.loadModel(fixture(`tiny/${m.path}`))
      try {
        const [short, long] = m.prompts.map((p) => p.ids)
        const prompts = [short, long, long.slice(0, 23), short.concat(long.slice(0, 5))]
        const requests = prompts.map((ids) => ({ promptTokens: ids, maxTokens: BATCH_TOKENS, eosTokenIds: [] }))
        const solo = mlx.createEngine(model)
        const alone = []
        for (const r of requests) alone.push(await collectOne(solo, r))
        await solo.close()
        assertTokens(alone[0], m.prompts[0].tokens.slice(0, BATCH_TOKENS), `${m.name} short prompt alone`)
        assertTokens(alone[1], m.prompts[1].tokens.slice(0, BATCH_TOKENS), `${m.name} long prompt alone`)
        const before = mlx.testing.batchCounts().rows
        const engine = mlx.createEngine(model, { maxActive: 8 })
        const together = await Promise.all(requests.map((r) => collectOne(engine, r)))
        await engine.close()
        assert.ok(mlx.testing.batchCounts().rows > before, 'decode ran batched')
        for (const [i, t] of together.entries()) assertTokens(t, alone[i], `${m.name} row ${i} in the batch`)
      } finally {
        model.dispose()
      }
    })
  }
})

describe('architectures: a next turn starts from the prefix cache and equals a cold run', () => {
  for (const m of ref.models.filter((m) => !m.quantized)) {
    test(`${m.name}: a hit past the sliding window, alone and beside a cold row`, { timeout: 120_000 }, async () => {
      const model = await mlx.loadModel(fixture(`tiny/${m.path}`))
      const engine = mlx.createEngine(model, { maxActive: 4 })
      const cold = mlx.createEngine(model, { prefixCacheBytes: 0 })
      try {
        const run = async (e, promptTokens) => {
          const o = await within(e.open({ promptTokens, maxTokens: 8, eosTokenIds: [] }, { output: 'collect' }).result, 'a collect session', 60_000)
          assert.equal(o.status, 'completed', JSON.stringify(o.error))
          return { tokens: Array.from(o.output), metrics: o.result.metrics }
        }
        // The long prompt (40 ids) wraps the tiny models' 16-position windows.
        const base = m.prompts[1].ids
        const first = await run(engine, base)
        const held = [...base, ...first.tokens].slice(0, first.metrics.cacheTokens)
        const next = [...held, 9, 8, 7]
        const other = [...m.prompts[0].ids, 3, 4]
        const [hot, beside] = await Promise.all([run(engine, next), run(engine, other)])
        assert.ok(held.length > 40, `${held.length} positions held`)
        assert.equal(hot.metrics.cachedTokens, held.length, 'the next turn starts from what the last one left')
        assert.deepEqual(hot.tokens, (await run(cold, next)).tokens)
        assert.deepEqual(beside.tokens, (await run(cold, other)).tokens)
      } finally {
        await engine.close()
        await cold.close()
        model.dispose()
      }
    })
  }
})

describe('architectures: linear-attention models restore checkpoints', () => {
  const hybrid = ref.models.filter((m) => !m.quantized && ['qwen3_5', 'qwen3_5_moe', 'qwen3_next'].includes(m.name))
  test('every hybrid model is in the reference file', () => assert.equal(hybrid.length, 3))
  for (const m of hybrid) {
    test(`${m.name}: a prompt that shares the last prompt but not its output starts from its checkpoint`, { timeout: 120_000 }, async () => {
      const model = await mlx.loadModel(fixture(`tiny/${m.path}`))
      const engine = mlx.createEngine(model, { maxActive: 4 })
      const cold = mlx.createEngine(model, { prefixCacheBytes: 0 })
      try {
        assert.equal(engine.capabilities.checkpoints, true)
        assert.equal(engine.capabilities.sharedCheckpoints, true)
        const run = async (e, promptTokens, sessionId) => {
          const o = await within(e.open({ promptTokens, maxTokens: 8, eosTokenIds: [], sessionId }, { output: 'collect' }).result, 'a collect session', 60_000)
          assert.equal(o.status, 'completed', JSON.stringify(o.error))
          return { tokens: Array.from(o.output), metrics: o.result.metrics }
        }
        const base = m.prompts[1].ids
        const first = await run(engine, base, 'chat')
        // A regenerated turn: the same prompt, a different continuation after it. The recurrent
        // state after the output cannot be trimmed back; the checkpoint holds the prompt.
        const edited = [...base, 200, 201, 202]
        assert.notEqual(first.tokens[0], 200)
        const hot = await run(engine, edited, 'chat')
        assert.equal(hot.metrics.cachedTokens, base.length - 1, 'started from the checkpoint at the end of the prompt')
        assert.deepEqual(hot.tokens, (await run(cold, edited)).tokens)
        // Four rows of one batch, two of them from checkpoints, equal cold runs.
        const prompts = [[...base, 7], [...base, 200, 201, 202, 9], [...m.prompts[0].ids, 5], base.slice(0, 30)]
        const together = await Promise.all(prompts.map((p) => run(engine, p)))
        assert.ok(together[0].metrics.cachedTokens >= base.length - 1 && together[1].metrics.cachedTokens >= base.length - 1, JSON.stringify(together.map((t) => t.metrics.cachedTokens)))
        for (const [i, p] of prompts.entries()) assert.deepEqual(together[i].tokens, (await run(cold, p)).tokens, `row ${i}`)
      } finally {
        await engine.close()
        await cold.close()
        model.dispose()
      }
    })
  }
})

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

// llama.cpp's names for a layer's tensors (its convert_hf_to_gguf.py layout), per architecture.
const GGUF_LAYER = {
  'input_layernorm': 'attn_norm', 'self_attn.q_proj': 'attn_q', 'self_attn.k_proj': 'attn_k', 'self_attn.v_proj': 'attn_v',
  'self_attn.o_proj': 'attn_output', 'mlp.gate_proj': 'ffn_gate', 'mlp.up_proj': 'ffn_up', 'mlp.down_proj': 'ffn_down',
}
const GGUF_ARCH = {
  gemma: { 'post_attention_layernorm': 'ffn_norm' },
  gemma2: { 'post_attention_layernorm': 'post_attention_norm', 'pre_feedforward_layernorm': 'ffn_norm', 'post_feedforward_layernorm': 'post_ffw_norm' },
  olmo2: { 'post_attention_layernorm': 'post_attention_norm', 'post_feedforward_layernorm': 'post_ffw_norm', 'self_attn.q_norm': 'attn_q_norm', 'self_attn.k_norm': 'attn_k_norm' },
  starcoder2: { 'post_attention_layernorm': 'ffn_norm', 'mlp.c_fc': 'ffn_up', 'mlp.c_proj': 'ffn_down' },
  granite: { 'post_attention_layernorm': 'ffn_norm' },
  qwen2: { 'post_attention_layernorm': 'ffn_norm' },
  phi3: { 'post_attention_layernorm': 'ffn_norm', 'self_attn.qkv_proj': 'attn_qkv', 'mlp.gate_up_proj': 'ffn_up' },
  phi3_su: { 'post_attention_layernorm': 'ffn_norm', 'self_attn.qkv_proj': 'attn_qkv', 'mlp.gate_up_proj': 'ffn_up' },
  glm4: {
    'post_self_attn_layernorm': 'post_attention_norm', 'post_attention_layernorm': 'ffn_norm',
    'post_mlp_layernorm': 'post_ffw_norm', 'mlp.gate_up_proj': 'ffn_up',
  },
  smollm3_full: { 'post_attention_layernorm': 'ffn_norm' },
  minicpm: { 'post_attention_layernorm': 'ffn_norm' },
  qwen3: { 'post_attention_layernorm': 'ffn_norm', 'self_attn.q_norm': 'attn_q_norm', 'self_attn.k_norm': 'attn_k_norm' },
  qwen3_moe_sparse: {
    'post_attention_layernorm': 'ffn_norm', 'self_attn.q_norm': 'attn_q_norm', 'self_attn.k_norm': 'attn_k_norm',
    'mlp.gate': 'ffn_gate_inp', 'mlp.switch_mlp.gate_proj': 'ffn_gate_exps', 'mlp.switch_mlp.up_proj': 'ffn_up_exps', 'mlp.switch_mlp.down_proj': 'ffn_down_exps',
  },
}
// llama.cpp's architecture names where they differ from the model_type.
const GGUF_ARCH_NAME = { qwen3_moe: 'qwen3moe' }

/** llama.cpp's LlamaModel.permute: within each head, row j·(d/2)+i moves to 2i+j. */
function permuteRows(data, rows, heads) {
  const rowBytes = data.length / rows
  const hd = rows / heads
  const out = Buffer.alloc(data.length)
  for (let h = 0; h < heads; h++) {
    for (let j = 0; j < 2; j++) {
      for (let i = 0; i < hd / 2; i++) {
        data.copy(out, (h * hd + 2 * i + j) * rowBytes, (h * hd + j * (hd / 2) + i) * rowBytes, (h * hd + j * (hd / 2) + i + 1) * rowBytes)
      }
    }
  }
  return out
}

/** Writes the f32 folder of a tiny model as llama.cpp's converter would: its names, its metadata
 * keys, Gemma's RMSNorm weights stored as 1 + w. */
function asGguf(dir, file) {
  const cfg = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8'))
  const arch = GGUF_ARCH_NAME[cfg.model_type] ?? cfg.model_type
  const names = { ...GGUF_LAYER, ...GGUF_ARCH[path.basename(dir)] }
  const tensors = Object.entries(readSafetensors(path.join(dir, 'model.safetensors'))).map(([name, t]) => {
    const top = { 'model.embed_tokens.weight': 'token_embd.weight', 'model.norm.weight': 'output_norm.weight', 'model.norm.bias': 'output_norm.bias', 'lm_head.weight': 'output.weight' }
    let gguf = top[name]
    const m = /^model\.layers\.(\d+)\.(.+)\.(weight|bias)$/.exec(name)
    if (m) gguf = `blk.${m[1]}.${names[m[2]]}.${m[3]}`
    assert.ok(gguf && !gguf.includes('undefined'), `no GGUF name for ${name}`)
    let data = Buffer.from(t.data)
    if (arch.startsWith('gemma') && name.endsWith('norm.weight')) {
      const v = new Float32Array(data.buffer, data.byteOffset, data.length / 4).map((x) => Math.fround(x + 1))
      data = Buffer.from(v.buffer)
    }
    if (['granite', 'smollm3', 'minicpm'].includes(arch) && m && ['self_attn.q_proj', 'self_attn.k_proj'].includes(m[2])) {
      data = permuteRows(data, t.shape[0], m[2] === 'self_attn.q_proj' ? cfg.num_attention_heads : cfg.num_key_value_heads)
    }
    return { name: gguf, dims: [...t.shape].reverse(), type: 0, data }
  })
  const kv = {
    'general.architecture': arch,
    [`${arch}.context_length`]: cfg.max_position_embeddings,
    [`${arch}.embedding_length`]: cfg.hidden_size,
    [`${arch}.block_count`]: cfg.num_hidden_layers,
    [`${arch}.feed_forward_length`]: cfg.intermediate_size,
    [`${arch}.attention.head_count`]: cfg.num_attention_heads,
    [`${arch}.attention.head_count_kv`]: cfg.num_key_value_heads,
    [`${arch}.rope.freq_base`]: cfg.rope_theta,
    'tokenizer.ggml.tokens': Array.from({ length: cfg.vocab_size }, (_, i) => `t${i}`),
  }
  if (cfg.head_dim) kv[`${arch}.attention.key_length`] = cfg.head_dim
  if (arch === 'starcoder2') kv['starcoder2.attention.layer_norm_epsilon'] = cfg.norm_epsilon
  else kv[`${arch}.attention.layer_norm_rms_epsilon`] = cfg.rms_norm_eps
  if (arch === 'granite') {
    kv['granite.attention.scale'] = cfg.attention_multiplier
    kv['granite.embedding_scale'] = cfg.embedding_multiplier
    kv['granite.residual_scale'] = cfg.residual_multiplier
    kv['granite.logit_scale'] = cfg.logits_scaling
  }
  if (arch === 'qwen3moe') {
    kv['qwen3moe.expert_count'] = cfg.num_experts
    kv['qwen3moe.expert_used_count'] = cfg.num_experts_per_tok
    kv['qwen3moe.expert_feed_forward_length'] = cfg.moe_intermediate_size
  }
  const headDim = cfg.head_dim ?? cfg.hidden_size / cfg.num_attention_heads
  if (arch === 'phi3' || arch === 'glm4') {
    kv[`${arch}.rope.dimension_count`] = Math.floor(headDim * (cfg.partial_rotary_factor ?? (arch === 'glm4' ? 0.5 : 1)))
  }
  if (arch === 'phi3') {
    kv['phi3.rope.scaling.original_context_length'] = cfg.original_max_position_embeddings
    // LongRoPE's factors, as the converter's generate_extra_tensors writes them.
    for (const which of ['long', 'short']) {
      const f = cfg.rope_scaling?.[`${which}_factor`]
      if (f) tensors.push({ name: `rope_factors_${which}.weight`, dims: [f.length], type: 0, data: Buffer.from(new Float32Array(f).buffer) })
    }
  }
  if (arch === 'minicpm') {
    // The products llama.cpp's converter stores, computed in double precision as it does.
    kv['minicpm.embedding_scale'] = { f32: cfg.scale_emb }
    kv['minicpm.residual_scale'] = { f32: cfg.scale_depth / Math.sqrt(cfg.num_hidden_layers) }
    kv['minicpm.logit_scale'] = { f32: cfg.hidden_size / cfg.dim_model_base }
  }
  if (arch === 'gemma2') {
    kv['gemma2.attn_logit_softcapping'] = cfg.attn_logit_softcapping
    kv['gemma2.final_logit_softcapping'] = cfg.final_logit_softcapping
  }
  writeGguf(file, kv, tensors)
}

describe('architectures: GGUF files in llama.cpp\'s layout equal their folders', () => {
  for (const name of Object.keys(GGUF_ARCH)) {
    test(`${name} as a GGUF file gives mlx-lm's logits and tokens`, { timeout: 120_000 }, async () => {
      const m = ref.models.find((x) => x.name === name)
      const file = path.join(tmpdir(`gguf-${name}`), `${name}.gguf`)
      asGguf(fixture(`tiny/${name}`), file)
      const model = await mlx.loadModel(file)
      try {
        assert.equal(model.config.modelType, m.model_type)
        await assertLikeReference(model, m, `${name} GGUF`)
      } finally {
        model.dispose()
      }
    })
  }
})

describe('architectures: Gemma 4 as published (Hugging Face layout)', () => {
  // The tiny multimodal-wrapped Gemma 4 written back in the published layout, which mlx-lm's
  // sanitize maps onto its own: the text model under model.language_model, each layer's experts
  // as one gate_up_proj (gate rows first) and one down_proj, keys, values and key norms for the
  // shared layers that never use them, a vision tower the text model does not read.
  test('gives the logits and tokens of mlx-lm on its own layout', { timeout: 120_000 }, async () => {
    const m = ref.models.find((x) => x.name === 'gemma4')
    const dir = tmpdir('gemma4-hf')
    const cfg = JSON.parse(fs.readFileSync(fixture('tiny/gemma4/config.json'), 'utf8'))
    const f32 = (t) => new Float32Array(t.data.buffer.slice(t.data.byteOffset, t.data.byteOffset + t.data.length))
    const tensors = {}
    const src = readSafetensors(fixture('tiny/gemma4/model.safetensors'))
    for (const [name, t] of Object.entries(src)) {
      const hf = name.replace(/^language_model\.model\./, 'model.language_model.')
      const up = name.replace('.switch_glu.gate_proj.weight', '.switch_glu.up_proj.weight')
      if (name.endsWith('.switch_glu.gate_proj.weight')) {
        tensors[hf.replace('.switch_glu.gate_proj.weight', '.gate_up_proj')] = fuseGateUp(f32(t), f32(src[up]), t.shape)
      } else if (name.endsWith('.switch_glu.down_proj.weight')) {
        tensors[hf.replace('.switch_glu.down_proj.weight', '.down_proj')] = { shape: t.shape, data: f32(t) }
      } else if (!name.endsWith('.switch_glu.up_proj.weight')) {
        tensors[hf] = { shape: t.shape, data: f32(t) }
      }
    }
    const tc = cfg.text_config
    const firstShared = tc.num_hidden_layers - tc.num_kv_shared_layers
    const noise = (n) => Float32Array.from({ length: n }, (_, i) => Math.sin(i) * 100)
    for (let i = firstShared; i < tc.num_hidden_layers; i++) {
      const hd = (i + 1) % tc.sliding_window_pattern === 0 ? tc.global_head_dim : tc.head_dim
      const p = `model.language_model.layers.${i}.self_attn`
      tensors[`${p}.k_proj.weight`] = { shape: [tc.num_key_value_heads * hd, tc.hidden_size], data: noise(tc.num_key_value_heads * hd * tc.hidden_size) }
      tensors[`${p}.v_proj.weight`] = { shape: [tc.num_key_value_heads * hd, tc.hidden_size], data: noise(tc.num_key_value_heads * hd * tc.hidden_size) }
      tensors[`${p}.k_norm.weight`] = { shape: [hd], data: noise(hd) }
    }
    tensors['model.vision_tower.encoder.weight'] = { shape: [4, 4], data: noise(16) }
    writeSafetensors(path.join(dir, 'model.safetensors'), tensors)
    fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(cfg))
    const model = await mlx.loadModel(dir)
    try {
      assert.equal(model.config.modelType, 'gemma4')
      await assertLikeReference(model, m, 'Gemma 4 as published')
    } finally {
      model.dispose()
    }
  })
})

describe('architectures: Qwen3.5-MoE as published (Hugging Face layout)', () => {
  // The tiny Qwen3.5-MoE written back in the published layout, which mlx-lm's sanitize maps onto
  // its own: the text model under model.language_model, RMSNorm weights stored as w where the
  // model scales by 1 + w (all but the linear layers' gated norms), convolutions as
  // [channels, 1, kernel], each layer's experts as one gate_up_proj (gate rows first) and one
  // down_proj, a vision tower the text model does not read.
  test('gives the logits and tokens of mlx-lm on its own layout', { timeout: 120_000 }, async () => {
    const m = ref.models.find((x) => x.name === 'qwen3_5_moe')
    const dir = tmpdir('qwen3_5_moe-hf')
    const f32 = (t) => new Float32Array(t.data.buffer.slice(t.data.byteOffset, t.data.byteOffset + t.data.length))
    const src = readSafetensors(fixture('tiny/qwen3_5_moe/model.safetensors'))
    const centred = ['.input_layernorm.weight', '.post_attention_layernorm.weight', 'model.norm.weight', '.q_norm.weight', '.k_norm.weight']
    const tensors = {}
    for (const [name, t] of Object.entries(src)) {
      const hf = name.replace(/^language_model\.model\./, 'model.language_model.')
      if (name.endsWith('.switch_mlp.gate_proj.weight')) {
        tensors[hf.replace('.switch_mlp.gate_proj.weight', '.experts.gate_up_proj')] = fuseGateUp(f32(t), f32(src[name.replace('.gate_proj.', '.up_proj.')]), t.shape)
      } else if (name.endsWith('.switch_mlp.down_proj.weight')) {
        tensors[hf.replace('.switch_mlp.down_proj.weight', '.experts.down_proj')] = { shape: t.shape, data: f32(t) }
      } else if (name.endsWith('.conv1d.weight')) {
        // [channels, kernel, 1] and [channels, 1, kernel] hold the same numbers in the same order.
        tensors[hf] = { shape: [t.shape[0], 1, t.shape[1]], data: f32(t) }
      } else if (centred.some((s) => name.endsWith(s))) {
        tensors[hf] = { shape: t.shape, data: f32(t).map((x) => x - 1) }
      } else if (!name.endsWith('.switch_mlp.up_proj.weight')) {
        tensors[hf] = { shape: t.shape, data: f32(t) }
      }
    }
    assert.ok(Object.keys(tensors).some((k) => k.endsWith('.experts.gate_up_proj')) && Object.keys(tensors).some((k) => k.endsWith('.conv1d.weight')))
    tensors['model.visual.patch_embed.weight'] = { shape: [4, 4], data: new Float32Array(16).fill(7) }
    writeSafetensors(path.join(dir, 'model.safetensors'), tensors)
    fs.copyFileSync(fixture('tiny/qwen3_5_moe/config.json'), path.join(dir, 'config.json'))
    const model = await mlx.loadModel(dir)
    try {
      assert.equal(model.config.modelType, 'qwen3_5_moe')
      await assertLikeReference(model, m, 'Qwen3.5-MoE as published')
    } finally {
      model.dispose()
    }
  })
})

describe('architectures: saved caches of layers that differ', () => {
  // Gemma 4's full and sliding layers hold keys of different sizes; Qwen3.5's linear layers hold
  // a convolution window and a recurrent state instead of keys.
  for (const name of ['gemma4_text', 'qwen3_5', 'qwen3_next']) {
    test(`${name}: a conversation saved and loaded goes on as the live one`, { timeout: 120_000 }, async () => {
      const model = await mlx.loadModel(fixture(`tiny/${name}`))
      const file = path.join(tmpdir(`kv-${name}`), 'chat.kv')
      try {
        const first = ref.models.find((m) => m.name === name).prompts[1].ids
        const live = model.makeCache()
        const a = await greedy(model, first, { maxTokens: 6, cache: live })
        await mlx.saveKvCache(live, file)
        const restored = await mlx.loadKvCache(model, file)
        assert.equal(restored.offset, live.offset)
        const turn = [...first, ...a, 3, 4, 5]
        const next = await greedy(model, turn, { maxTokens: 12, cache: restored })
        assert.deepEqual(next, await greedy(model, turn, { maxTokens: 12, cache: live }))
        // And as a cold run of the whole conversation.
        assert.deepEqual(next, await greedy(model, turn, { maxTokens: 12 }))
      } finally {
        model.dispose()
      }
    })
  }
})
