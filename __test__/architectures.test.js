'use strict'
// Parity with Python mlx-lm 0.32.2 on tiny random-weight models of every architecture we support
// (llama, llama with Llama 3 RoPE, mistral all-sliding and mixed, qwen2, qwen3, gemma3_text, phi3,
// phi3 with partial rotary + su RoPE, gemma, gemma2 with both soft-caps, smollm3 with NoPE and
// sliding layers, olmo2, glm4, granite with its multipliers, starcoder2, minicpm, qwen3_moe with
// dense and expert layers, gemma4_text as E2B/E4B are (per-layer inputs, KV shared between layers)
// and as 26B-A4B is (experts beside the MLP, keys as values), qwen3_5 / qwen3_5_moe / qwen3_next
// (gated DeltaNet linear attention beside gated full attention, experts with a shared expert)), each as an f32
// folder and an MLX 4-bit g32 copy; rows of a batch, the prefix cache, checkpoints, published
// layouts and saved caches on them. Folders and references are made by scripts/tiny_models.py
// into <fixtures>/tiny; GGUF files of them in gguf-layouts.test.js.
const { test, describe } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')

const mlx = require('..')
const { fixture, within, writeSafetensors, tmpdir } = require('./helpers')
const { ref, MAX_TOKENS, greedy, assertTokens, assertLikeReference, fuseGateUp, readSafetensors } = require('./tiny')

describe('architectures: parity with mlx-lm on tiny random models', () => {
  test('reference file is complete', () => {
    assert.equal(ref.mlx_lm_version, '0.32.2')
    assert.equal(ref.max_tokens, MAX_TOKENS)
    const names = ref.models.map((m) => m.name)
    const archs = ['llama', 'mistral', 'qwen2', 'qwen3', 'gemma3_text', 'phi3', 'phi3_su', 'gemma', 'gemma2', 'smollm3', 'olmo2', 'glm4', 'granite', 'starcoder2', 'minicpm', 'qwen3_moe', 'qwen3_moe_sparse', 'gemma4_text', 'gemma4_text_moe', 'gemma4_text_full', 'gemma4', 'qwen3_5', 'qwen3_5_moe', 'qwen3_next', 'qwen3_next_released', 'minicpm_longrope']
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
