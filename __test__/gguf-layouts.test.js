'use strict'
// GGUF files as llama.cpp's converter (convert_hf_to_gguf.py) writes them — its tensor names,
// metadata keys and the transforms it applies — made from the tiny models of
// scripts/tiny_models.py, load into the numbers of their folders: mlx-lm's logits and tokens.
const { test, describe } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')

const mlx = require('..')
const { fixture, writeGguf, tmpdir } = require('./helpers')
const { ref, assertLikeReference, readSafetensors, fuseGateUp } = require('./tiny')

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
  const names = { ...GGUF_LAYER, ...(GGUF_ARCH[path.basename(dir)] ?? GGUF_ARCH[cfg.model_type]) }
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
  if (arch === 'phi3') kv['phi3.rope.scaling.original_context_length'] = cfg.original_max_position_embeddings
  // LongRoPE's factors, as the converters' generate_extra_tensors write them (MiniCPM's keep no
  // trained length).
  for (const which of ['long', 'short']) {
    const f = cfg.rope_scaling?.[`${which}_factor`]
    if (f) tensors.push({ name: `rope_factors_${which}.weight`, dims: [f.length], type: 0, data: Buffer.from(new Float32Array(f).buffer) })
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

test('MiniCPM with LongRoPE as a GGUF file runs as llama.cpp runs it: the short factors, no scaling', { timeout: 120_000 }, async () => {
  // llama.cpp's converter keeps MiniCPM's factors but not the length they were trained for, and
  // within its context llama.cpp uses the short ones without attention scaling: the same folder
  // configured so (short factors as mlx-lm's long ones, the trained length the context) is the
  // reference. The folder as published equals mlx-lm (architectures.test.js).
  const src = fixture('tiny/minicpm_longrope')
  const dir = tmpdir('gguf-minicpm-longrope')
  const file = path.join(dir, 'minicpm.gguf')
  asGguf(src, file)
  const cfg = JSON.parse(fs.readFileSync(path.join(src, 'config.json'), 'utf8'))
  const scaling = cfg.rope_scaling
  cfg.rope_scaling = { ...scaling, long_factor: scaling.short_factor, original_max_position_embeddings: cfg.max_position_embeddings }
  const folder = path.join(dir, 'as-llama-cpp')
  fs.mkdirSync(folder)
  fs.copyFileSync(path.join(src, 'model.safetensors'), path.join(folder, 'model.safetensors'))
  fs.writeFileSync(path.join(folder, 'config.json'), JSON.stringify(cfg))
  const prompts = ref.models.find((x) => x.name === 'minicpm_longrope').prompts
  await withModels([file, folder], ([gguf, want]) => assertSameLogits(gguf, want, prompts, 1e-4))
})

describe('architectures: GGUF files in llama.cpp\'s layout equal their folders', () => {
  for (const name of Object.keys(GGUF_ARCH)) ggufGivesReference(name, asGguf)
})

/** Loads each of `paths`, runs `check` on the models, and disposes of them. */
async function withModels(paths, check) {
  const models = []
  try {
    for (const p of paths) models.push(await mlx.loadModel(p))
    await check(models)
  } finally {
    for (const m of models) m.dispose()
  }
}

/** Tiny model `name` written as a GGUF file by `write(folder, file)` loads as `modelType` and
 * gives mlx-lm's logits and tokens. */
function ggufGivesReference(name, write, modelType, what = name) {
  test(`${what} as a GGUF file gives mlx-lm's logits and tokens`, { timeout: 120_000 }, async () => {
    const m = ref.models.find((x) => x.name === name)
    const file = path.join(tmpdir(`gguf-${name}`), `${name}.gguf`)
    write(fixture(`tiny/${name}`), file)
    await withModels([file], async ([model]) => {
      assert.equal(model.config.modelType, modelType ?? m.model_type)
      await assertLikeReference(model, m, `${what} GGUF`)
    })
  })
}

/** Two models' last-position logits on each prompt are within `bound` of each other. */
async function assertSameLogits(a, b, prompts, bound) {
  for (const p of prompts) {
    const [x, y] = [await a.logits(p.ids), await b.logits(p.ids)]
    const max = Math.max(...x.map((v, j) => Math.abs(v - y[j])))
    assert.ok(max <= bound, `prompt of ${p.ids.length} ids: max |logit diff| ${max}`)
  }
}

const f32Of = (t) => new Float32Array(t.data.buffer.slice(t.data.byteOffset, t.data.byteOffset + t.data.length))
const bytes = (f) => Buffer.from(f.buffer, f.byteOffset, f.byteLength)

/** `rows` rows of `width` values from row `skip` on, in blocks of `per` rows, one per value head,
 * from grouped by key head (head g·r + j) to llama.cpp's Qwen3.5 order (j·keyHeads + g). */
function tileRows(data, width, skip, per, keyHeads, valueHeads) {
  const out = Float32Array.from(data)
  const r = valueHeads / keyHeads
  const block = per * width
  for (let t = 0; t < valueHeads; t++) {
    const h = (t % keyHeads) * r + Math.floor(t / keyHeads)
    out.set(data.subarray(skip * width + h * block, skip * width + (h + 1) * block), skip * width + t * block)
  }
  return out
}

/** The same reorder on each row's columns (blocks of `per`). */
function tileColumns(data, rows, width, per, keyHeads, valueHeads) {
  const out = new Float32Array(data.length)
  for (let i = 0; i < rows; i++) out.set(tileRows(data.subarray(i * width, (i + 1) * width), per, 0, 1, keyHeads, valueHeads), i * width)
  return out
}

// A layer's tensors under llama.cpp's Qwen3-Next / Qwen3.5 names (mlx-lm's names on the left).
const HYBRID_LAYER = {
  'input_layernorm.weight': 'attn_norm.weight', 'post_attention_layernorm.weight': 'post_attention_norm.weight',
  'self_attn.q_proj.weight': 'attn_q.weight', 'self_attn.k_proj.weight': 'attn_k.weight', 'self_attn.v_proj.weight': 'attn_v.weight',
  'self_attn.o_proj.weight': 'attn_output.weight', 'self_attn.q_norm.weight': 'attn_q_norm.weight', 'self_attn.k_norm.weight': 'attn_k_norm.weight',
  'mlp.gate_proj.weight': 'ffn_gate.weight', 'mlp.up_proj.weight': 'ffn_up.weight', 'mlp.down_proj.weight': 'ffn_down.weight',
  'mlp.gate.weight': 'ffn_gate_inp.weight', 'mlp.switch_mlp.gate_proj.weight': 'ffn_gate_exps.weight',
  'mlp.switch_mlp.up_proj.weight': 'ffn_up_exps.weight', 'mlp.switch_mlp.down_proj.weight': 'ffn_down_exps.weight',
  'mlp.shared_expert.gate_proj.weight': 'ffn_gate_shexp.weight', 'mlp.shared_expert.up_proj.weight': 'ffn_up_shexp.weight',
  'mlp.shared_expert.down_proj.weight': 'ffn_down_shexp.weight', 'mlp.shared_expert_gate.weight': 'ffn_gate_inp_shexp.weight',
  'linear_attn.in_proj_qkv.weight': 'attn_qkv.weight', 'linear_attn.in_proj_z.weight': 'attn_gate.weight',
  'linear_attn.in_proj_b.weight': 'ssm_beta.weight', 'linear_attn.in_proj_a.weight': 'ssm_alpha.weight',
  'linear_attn.in_proj_ba.weight': 'ssm_ba.weight', 'linear_attn.A_log': 'ssm_a', 'linear_attn.dt_bias': 'ssm_dt.bias',
  'linear_attn.conv1d.weight': 'ssm_conv1d.weight', 'linear_attn.norm.weight': 'ssm_norm.weight',
  'linear_attn.out_proj.weight': 'ssm_out.weight',
}

/** A tiny Qwen3-Next or Qwen3.5 folder written as llama.cpp's converter writes it: mlx-lm's norms
 * already hold the 1 + w the converter stores; A_log as -exp(A_log); the convolution as
 * [channels, kernel]; Qwen3-Next's fused q/k/v/z split into q/k/v and z (`legacy`: kept fused, as
 * before llama.cpp split it); Qwen3.5's value heads tiled; `prediction`: a multi-token-prediction
 * layer after the last (noise the loader must skip). */
function hybridAsGguf(dir, file, { legacy = false, prediction = false, q8 = [], q8Values = false } = {}) {
  const cfg = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8'))
  const tc = cfg.text_config ?? cfg
  const arch = { qwen3_next: 'qwen3next', qwen3_5: 'qwen35', qwen3_5_moe: 'qwen35moe' }[cfg.model_type]
  const [nk, nv, dk, dv] = [tc.linear_num_key_heads, tc.linear_num_value_heads, tc.linear_key_head_dim, tc.linear_value_head_dim]
  const tiled = arch !== 'qwen3next' && nv !== nk
  const rope = tc.rope_parameters ?? tc
  const tensors = []
  // Tensors named in `q8` (their llama.cpp names without `blk.N.`) are stored as Q8_0 blocks, or
  // with `q8Values` as f32 holding the values of those blocks.
  const put = (name, shape, data) => {
    if (!q8.includes(name.replace(/^blk\.\d+\./, ''))) return tensors.push({ name, dims: [...shape].reverse(), type: 0, data: bytes(data) })
    const { blocks, values } = q8_0(data)
    if (q8Values) return tensors.push({ name, dims: [...shape].reverse(), type: 0, data: bytes(values) })
    tensors.push({ name, dims: [...shape].reverse(), type: 8, data: blocks })
  }
  for (const [full, t] of Object.entries(readSafetensors(path.join(dir, 'model.safetensors')))) {
    const name = full.replace(/^language_model\./, '')
    const top = { 'model.embed_tokens.weight': 'token_embd.weight', 'model.norm.weight': 'output_norm.weight', 'lm_head.weight': 'output.weight' }
    let data = f32Of(t)
    if (top[name]) {
      put(top[name], t.shape, data)
      continue
    }
    const [, i, module] = /^model\.layers\.(\d+)\.(.+)$/.exec(name)
    const blk = (n) => `blk.${i}.${n}`
    if (module === 'linear_attn.in_proj_qkvz.weight' && !legacy) {
      // Per key head [q, k, v, z] → [all q | all k | all v] and [all z].
      const [rows, width] = t.shape
      const per = rows / nk
      const part = (from, n) => Array.from({ length: nk }, (_, g) => data.subarray((g * per + from) * width, (g * per + from + n) * width))
      const concat = (arrays) => { const o = new Float32Array(arrays.reduce((n, a) => n + a.length, 0)); let at = 0; for (const a of arrays) { o.set(a, at); at += a.length } return o }
      const r = nv / nk
      put(blk('attn_qkv.weight'), [nk * (2 * dk) + nv * dv, width], concat([...part(0, dk), ...part(dk, dk), ...part(2 * dk, r * dv)]))
      put(blk('attn_gate.weight'), [nv * dv, width], concat(part(2 * dk + r * dv, r * dv)))
      continue
    }
    if (module === 'linear_attn.in_proj_qkvz.weight') {
      put(blk('ssm_in.weight'), t.shape, data)
      continue
    }
    const gguf = HYBRID_LAYER[module]
    assert.ok(gguf, `no GGUF name for ${full}`)
    let shape = t.shape
    if (module === 'linear_attn.A_log') data = data.map((x) => Math.fround(-Math.exp(x)))
    if (module === 'linear_attn.conv1d.weight') shape = shape.slice(0, 2)
    if (module === 'mlp.shared_expert_gate.weight') shape = [shape[1]]
    if (tiled) {
      const width = shape.length > 1 ? shape[shape.length - 1] : 1
      if (['linear_attn.in_proj_qkv.weight', 'linear_attn.conv1d.weight'].includes(module)) data = tileRows(data, width, 2 * nk * dk, dv, nk, nv)
      if (module === 'linear_attn.in_proj_z.weight') data = tileRows(data, width, 0, dv, nk, nv)
      if (['linear_attn.in_proj_b.weight', 'linear_attn.in_proj_a.weight', 'linear_attn.A_log', 'linear_attn.dt_bias'].includes(module)) data = tileRows(data, width, 0, 1, nk, nv)
      if (module === 'linear_attn.out_proj.weight') data = tileColumns(data, shape[0], width, dv, nk, nv)
    }
    put(blk(gguf), shape, data)
  }
  const layers = tc.num_hidden_layers
  if (prediction) {
    const noise = (n) => Float32Array.from({ length: n }, (_, k) => Math.sin(k) * 100)
    put(`blk.${layers}.nextn.eh_proj.weight`, [tc.hidden_size, 2 * tc.hidden_size], noise(2 * tc.hidden_size ** 2))
    put(`blk.${layers}.attn_q.weight`, [tc.num_attention_heads * tc.head_dim * 2, tc.hidden_size], noise(tc.num_attention_heads * tc.head_dim * 2 * tc.hidden_size))
  }
  const kv = {
    'general.architecture': arch,
    [`${arch}.context_length`]: tc.max_position_embeddings,
    [`${arch}.embedding_length`]: tc.hidden_size,
    [`${arch}.block_count`]: layers + (prediction ? 1 : 0),
    [`${arch}.attention.head_count`]: tc.num_attention_heads,
    [`${arch}.attention.head_count_kv`]: tc.num_key_value_heads,
    [`${arch}.attention.key_length`]: tc.head_dim,
    [`${arch}.attention.value_length`]: tc.head_dim,
    [`${arch}.attention.layer_norm_rms_epsilon`]: tc.rms_norm_eps,
    [`${arch}.rope.freq_base`]: rope.rope_theta,
    [`${arch}.rope.dimension_count`]: Math.floor(tc.head_dim * rope.partial_rotary_factor),
    [`${arch}.ssm.conv_kernel`]: tc.linear_conv_kernel_dim,
    [`${arch}.ssm.state_size`]: dk,
    [`${arch}.ssm.group_count`]: nk,
    [`${arch}.ssm.time_step_rank`]: nv,
    [`${arch}.ssm.inner_size`]: nv * dv,
    [`${arch}.full_attention_interval`]: tc.full_attention_interval,
    'tokenizer.ggml.tokens': Array.from({ length: tc.vocab_size }, (_, k) => `t${k}`),
  }
  if (prediction) kv[`${arch}.nextn_predict_layers`] = 1
  // An all-expert model need not store a dense width (the loader then takes the experts').
  if (!tc.num_experts) kv[`${arch}.feed_forward_length`] = tc.intermediate_size
  if (tc.num_experts) {
    kv[`${arch}.expert_count`] = tc.num_experts
    kv[`${arch}.expert_used_count`] = tc.num_experts_per_tok
    kv[`${arch}.expert_feed_forward_length`] = tc.moe_intermediate_size
    kv[`${arch}.expert_shared_feed_forward_length`] = tc.shared_expert_intermediate_size
  }
  if (arch !== 'qwen3next') kv[`${arch}.rope.dimension_sections`] = [...(rope.mrope_section ?? [11, 11, 10]), 0, 0, 0, 0].slice(0, 4)
  writeGguf(file, kv, tensors)
}

test('Qwen3.5 GGUF: Q8_0 projections regroup their value heads inside the quantized rows', { timeout: 120_000 }, async () => {
  // The tiled value heads of q/k/v and z are put back row by row in the repacked 8-bit arrays,
  // equal to doing so on the same values in f32. Columns move only as whole quantization groups:
  // the tiny model's value heads (16 wide) are not, and a quantized output projection is refused.
  const m = ref.models.find((x) => x.name === 'qwen3_5')
  const dir = tmpdir('gguf-qwen35-q8')
  const files = ['q8', 'values', 'out'].map((f) => path.join(dir, `${f}.gguf`))
  const q8 = ['attn_qkv.weight', 'attn_gate.weight']
  hybridAsGguf(fixture('tiny/qwen3_5'), files[0], { q8 })
  hybridAsGguf(fixture('tiny/qwen3_5'), files[1], { q8, q8Values: true })
  hybridAsGguf(fixture('tiny/qwen3_5'), files[2], { q8: ['ssm_out.weight'] })
  await withModels(files.slice(0, 2), async ([a, b]) => {
    assert.equal(a.config.raw.quantization.bits, 8)
    await assertSameLogits(a, b, m.prompts, 1e-3)
  })
  await assert.rejects(mlx.loadModel(files[2]), (e) => e.code === 'INVALID_TENSOR' && /ssm_out.*value heads of 16 columns/.test(e.message))
})

describe('architectures: Qwen3-Next and Qwen3.5 GGUF files in llama.cpp\'s layout equal their folders', () => {
  const cases = [
    ['qwen3_next_released', {}],
    ['qwen3_next_released', { legacy: true }],
    ['qwen3_5', { prediction: true }],
    ['qwen3_5_moe', {}],
  ]
  for (const [name, opts] of cases) {
    const what = `${name}${opts.legacy ? ' (fused q/k/v/z, before llama.cpp split it)' : ''}${opts.prediction ? ' (with a prediction layer)' : ''}`
    ggufGivesReference(name, (dir, file) => hybridAsGguf(dir, file, opts), undefined, what)
  }
})

/** ggml's Q8_0 blocks of `data` (32 values: an f16 scale, 32 int8), and the values they hold. */
function q8_0(data) {
  const blocks = Buffer.alloc((data.length / 32) * 34)
  const values = new Float32Array(data.length)
  for (let b = 0; b < data.length / 32; b++) {
    const x = data.subarray(b * 32, (b + 1) * 32)
    // The scale max|x| / 127 as an f16 (normal numbers: exponent and 10-bit mantissa, rounded).
    let e = Math.floor(Math.log2(Math.max(...x.map(Math.abs)) / 127))
    let mantissa = Math.round((Math.max(...x.map(Math.abs)) / 127 / 2 ** e - 1) * 1024)
    if (mantissa === 1024) [e, mantissa] = [e + 1, 0]
    assert.ok(e >= -14 && e <= 15, 'scale within f16\'s normal numbers')
    const d = 2 ** e * (1 + mantissa / 1024)
    blocks.writeUInt16LE(((e + 15) << 10) | mantissa, b * 34)
    for (let k = 0; k < 32; k++) {
      const q = Math.max(-127, Math.min(127, Math.round(x[k] / d)))
      blocks.writeInt8(q, b * 34 + 2 + k)
      values[b * 32 + k] = q * d
    }
  }
  return { blocks, values }
}

// A Gemma 4 layer's tensors under llama.cpp's names (mlx-lm's on the left).
const GEMMA4_LAYER = {
  'input_layernorm.weight': 'attn_norm.weight', 'post_attention_layernorm.weight': 'post_attention_norm.weight',
  'pre_feedforward_layernorm.weight': 'ffn_norm.weight', 'post_feedforward_layernorm.weight': 'post_ffw_norm.weight',
  'post_feedforward_layernorm_1.weight': 'post_ffw_norm_1.weight', 'pre_feedforward_layernorm_2.weight': 'pre_ffw_norm_2.weight',
  'post_feedforward_layernorm_2.weight': 'post_ffw_norm_2.weight',
  'self_attn.q_proj.weight': 'attn_q.weight', 'self_attn.k_proj.weight': 'attn_k.weight', 'self_attn.v_proj.weight': 'attn_v.weight',
  'self_attn.o_proj.weight': 'attn_output.weight', 'self_attn.q_norm.weight': 'attn_q_norm.weight', 'self_attn.k_norm.weight': 'attn_k_norm.weight',
  'mlp.gate_proj.weight': 'ffn_gate.weight', 'mlp.up_proj.weight': 'ffn_up.weight', 'mlp.down_proj.weight': 'ffn_down.weight',
  'router.proj.weight': 'ffn_gate_inp.weight', 'router.scale': 'ffn_gate_inp.scale', 'router.per_expert_scale': 'ffn_down_exps.scale',
  'experts.switch_glu.down_proj.weight': 'ffn_down_exps.weight',
  'per_layer_input_gate.weight': 'inp_gate.weight', 'per_layer_projection.weight': 'proj.weight',
  'post_per_layer_input_norm.weight': 'post_norm.weight', 'layer_scalar': 'layer_output_scale.weight',
}
const GEMMA4_TOP = {
  'model.embed_tokens.weight': 'token_embd.weight', 'model.norm.weight': 'output_norm.weight', 'lm_head.weight': 'output.weight',
  'model.embed_tokens_per_layer.weight': 'per_layer_token_embd.weight', 'model.per_layer_model_projection.weight': 'per_layer_model_proj.weight',
  'model.per_layer_projection_norm.weight': 'per_layer_proj_norm.weight',
}

/** A tiny Gemma 4 folder written as llama.cpp's converter writes it: no value changed (Gemma 4's
 * norms are not shifted), experts' gate and up fused, the full layers' partial rotation as RoPE
 * factors, per-layer arrays for the sliding pattern, the MLP width (doubled on the layers that
 * share KV) and the KV heads (the full layers' own where keys are the values). */
function gemma4AsGguf(dir, file, { experts = 'f32' } = {}) {
  const cfg = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8'))
  const tc = cfg.text_config ?? cfg
  const n = tc.num_hidden_layers
  const sliding = Array.from({ length: n }, (_, i) => (tc.layer_types ? tc.layer_types[i] === 'sliding_attention' : (i + 1) % tc.sliding_window_pattern !== 0))
  const src = Object.fromEntries(Object.entries(readSafetensors(path.join(dir, 'model.safetensors'))).map(([k, t]) => [k.replace(/^language_model\./, ''), t]))
  const tensors = []
  const put = (name, shape, data) => tensors.push({ name, dims: [...shape].reverse(), type: 0, data: bytes(data) })
  // `experts`: 'q8_0' stores the experts as Q8_0 blocks, 'q8_0-values' as f32 holding the same values.
  const putExperts = (name, shape, data) => {
    if (experts === 'f32') return put(name, shape, data)
    const { blocks, values } = q8_0(data)
    if (experts === 'q8_0') tensors.push({ name, dims: [...shape].reverse(), type: 8, data: blocks })
    else put(name, shape, values)
  }
  for (const [name, t] of Object.entries(src)) {
    if (GEMMA4_TOP[name]) {
      put(GEMMA4_TOP[name], t.shape, f32Of(t))
      continue
    }
    const [, i, module] = /^model\.layers\.(\d+)\.(.+)$/.exec(name)
    if (module === 'experts.switch_glu.gate_proj.weight') {
      const up = src[name.replace('.gate_proj.', '.up_proj.')]
      const fused = fuseGateUp(f32Of(t), f32Of(up), t.shape)
      putExperts(`blk.${i}.ffn_gate_up_exps.weight`, fused.shape, fused.data)
      continue
    }
    if (module === 'experts.switch_glu.up_proj.weight') continue
    assert.ok(GEMMA4_LAYER[module], `no GGUF name for ${name}`)
    ;(module === 'experts.switch_glu.down_proj.weight' ? putExperts : put)(`blk.${i}.${GEMMA4_LAYER[module]}`, t.shape, f32Of(t))
  }
  // mlx-lm's defaults where the config has no RoPE block (or no block for a kind of layer).
  const full = tc.rope_parameters?.full_attention ?? { partial_rotary_factor: 0.25, rope_theta: 1e6 }
  const swaTheta = tc.rope_parameters?.sliding_attention?.rope_theta ?? 1e4
  const half = tc.global_head_dim / 2
  const rotated = Math.floor((tc.global_head_dim * full.partial_rotary_factor) / 2)
  put('rope_freqs.weight', [half], Float32Array.from({ length: half }, (_, k) => (k < rotated ? 1 : 1e30)))
  const shared = tc.num_kv_shared_layers ?? 0
  const doubleWide = tc.use_double_wide_mlp ?? true
  const kv = {
    'general.architecture': 'gemma4',
    'gemma4.context_length': tc.max_position_embeddings,
    'gemma4.embedding_length': tc.hidden_size,
    'gemma4.block_count': n,
    'gemma4.feed_forward_length': doubleWide ? Array.from({ length: n }, (_, i) => (i < n - shared ? 1 : 2) * tc.intermediate_size) : tc.intermediate_size,
    'gemma4.attention.head_count': tc.num_attention_heads,
    'gemma4.attention.head_count_kv': tc.num_global_key_value_heads ? sliding.map((s) => (s ? tc.num_key_value_heads : tc.num_global_key_value_heads)) : tc.num_key_value_heads,
    'gemma4.attention.key_length': tc.global_head_dim,
    'gemma4.attention.value_length': tc.global_head_dim,
    'gemma4.attention.key_length_swa': tc.head_dim,
    'gemma4.attention.value_length_swa': tc.head_dim,
    'gemma4.attention.layer_norm_rms_epsilon': tc.rms_norm_eps,
    'gemma4.attention.sliding_window_pattern': sliding,
    'gemma4.attention.shared_kv_layers': shared,
    'gemma4.embedding_length_per_layer_input': tc.hidden_size_per_layer_input ?? 0,
    'gemma4.rope.freq_base': full.rope_theta,
    'gemma4.rope.freq_base_swa': swaTheta,
    'gemma4.rope.dimension_count': tc.global_head_dim,
    'gemma4.rope.dimension_count_swa': tc.head_dim,
    'tokenizer.ggml.tokens': Array.from({ length: tc.vocab_size }, (_, k) => `t${k}`),
  }
  if (tc.sliding_window) kv['gemma4.attention.sliding_window'] = tc.sliding_window
  if (tc.final_logit_softcapping) kv['gemma4.final_logit_softcapping'] = tc.final_logit_softcapping
  if (tc.enable_moe_block) {
    kv['gemma4.expert_count'] = tc.num_experts
    kv['gemma4.expert_used_count'] = tc.top_k_experts
    kv['gemma4.expert_feed_forward_length'] = tc.moe_intermediate_size
  }
  writeGguf(file, kv, tensors)
}

describe('architectures: Gemma 4 GGUF files in llama.cpp\'s layout equal their folders', () => {
  // E2B/E4B-like (per-layer inputs, KV shared, double-wide MLPs), 26B-A4B-like (experts, keys as
  // values with their own KV head count), all full-sized heads, and the multimodal checkpoint.
  for (const name of ['gemma4_text', 'gemma4_text_moe', 'gemma4_text_full', 'gemma4']) ggufGivesReference(name, gemma4AsGguf, 'gemma4_text')
})

test('Gemma 4 GGUF: Q8_0 experts (gate and up fused) give the numbers of the same values in f32', { timeout: 120_000 }, async () => {
  // The fused experts stay quantized (Q8_0 repacks into MLX's 8-bit layout) and are split into
  // gate and up rows inside the quantized arrays; equal to splitting the values in f32.
  const m = ref.models.find((x) => x.name === 'gemma4_text_moe')
  const dir = tmpdir('gguf-gemma4-q8')
  const [quantized, values] = [path.join(dir, 'q8.gguf'), path.join(dir, 'values.gguf')]
  gemma4AsGguf(fixture('tiny/gemma4_text_moe'), quantized, { experts: 'q8_0' })
  gemma4AsGguf(fixture('tiny/gemma4_text_moe'), values, { experts: 'q8_0-values' })
  await withModels([quantized, values], async ([a, b]) => {
    assert.equal(a.config.raw.quantization.bits, 8)
    await assertSameLogits(a, b, m.prompts, 1e-3)
  })
})
