'use strict'
const { coded } = require('./errors')

// Every option object is checked by key: nothing a caller writes is silently ignored. Options of
// mlx-bun's API that this engine does not implement yet are refused by name (UNSUPPORTED_OPTION);
// any other unknown key is INVALID_OPTION, naming the known key it most resembles.
const GENERATE_KEYS = ['maxTokens', 'prefillChunkSize', 'eosTokenIds', 'temperature', 'topP', 'topK', 'minP', 'minTokensToKeep',
  'repetitionPenalty', 'repetitionContextSize', 'presencePenalty', 'presenceContextSize', 'frequencyPenalty', 'frequencyContextSize',
  'logitBias', 'seed', 'logprobs', 'topLogprobs', 'cache', 'grammar', 'draftModel', 'numDraftTokens',
  'kvBits', 'kvGroupSize', 'quantizedKvStart', 'kvConfig']
const OPTION_KEYS = {
  generate: new Set([...GENERATE_KEYS, 'signal']),
  request: new Set([...GENERATE_KEYS, 'promptTokens', 'messages', 'chat', 'cacheNamespace', 'sessionId']),
  control: new Set(['output', 'onTokens', 'signal']),
  chat: new Set(['addGenerationPrompt', 'tools', 'enableThinking', 'extra']),
  engine: new Set(['idleTimeoutMs', 'maxQueuedEvents', 'maxQueuedTokens', 'maxTopLogprobs', 'maxCollectTokens', 'maxActive', 'maxQueued',
    'maxIterationTokens', 'maxPreparationTokens', 'prefixCacheBytes', 'tokenizer', 'chatTemplate', 'grammarJump', 'fill', 'memoryBudgetBytes']),
  load: new Set(['f32Matmuls']),
  context: new Set(['f32Matmuls', 'chatTemplate', 'memoryBudgetBytes']),
  runtime: new Set([]),
  template: new Set(['disableThinking']),
  registry: new Set(['dbPath', 'hubDir', 'home']),
  list: new Set(['vision', 'maxBytes', 'query']),
  download: new Set(['revision', 'cacheDir', 'endpoint', 'token', 'onProgress', 'allFiles']),
  server: new Set(['host', 'apiKey', 'corsOrigins', 'defaultMaxTokens', 'defaultTemperature', 'defaultTopP', 'defaultTopK',
    'promptCacheBytes', 'batch', 'maxQueued', 'bodyLimit', 'log', 'shutdownGraceMs', 'fill', 'kvQuant', 'memoryBudgetBytes']),
  machine: new Set(['name', 'ramBytes', 'bandwidthGBs', 'chip', 'bandwidthSource']),
  kvScheme: new Set(['kvBits', 'kvGroupSize', 'kvConfig']),
  kvConfig: new Set(['layerIdx', 'bits', 'groupSize']),
}
const NOT_YET = {
  xtcProbability: 'XTC sampling',
  xtcThreshold: 'XTC sampling',
  adapters: 'LoRA adapters',
  promptEmbeddings: 'vision inputs',
  imageMask: 'vision inputs',
  visionPixels: 'vision inputs',
}
// mlx-bun's server options this engine does not implement yet.
const NOT_YET_SERVING = {
  defaultThinking: 'thinking controls',
  defaultAdapter: 'LoRA adapters',
  hlg: 'HLG decoding',
}
// mlx-bun's ensureNativeRuntime downloads a runtime pack; here the runtime ships in the platform package.
const RUNTIME_PACK = 'downloaded runtime packs (the MLX runtime ships in the @mlx-bun platform package)'
const NOT_YET_RUNTIME = { url: RUNTIME_PACK, sha256: RUNTIME_PACK, sizeBytes: RUNTIME_PACK, destDir: RUNTIME_PACK, onProgress: RUNTIME_PACK }
// Parts of mlx-bun's KV scheme its fit() does not bill as configured (a delayed start is billed
// as quantized from the first token, TurboQuant as bf16): refused rather than mispredicted.
const NOT_YET_FIT = { quantizedKvStart: 'delayed KV quantization in fit()', turboQuant: 'TurboQuant KV caches in fit()' }
const NOT_YET_BY_KIND = { generate: NOT_YET, request: NOT_YET, server: NOT_YET_SERVING, context: NOT_YET_SERVING, runtime: NOT_YET_RUNTIME, kvScheme: NOT_YET_FIT }

/** Edit distance, for "did you mean". */
function distance(a, b) {
  a = a.toLowerCase()
  b = b.toLowerCase()
  let row = Array.from({ length: b.length + 1 }, (_, j) => j)
  for (let i = 1; i <= a.length; i++) {
    const next = [i]
    for (let j = 1; j <= b.length; j++) next[j] = Math.min(row[j] + 1, next[j - 1] + 1, row[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1))
    row = next
  }
  return row[b.length]
}

/** Throws for the first key of `obj` that the `kind` of options does not have (undefined values count as absent). */
function checkKeys(kind, obj) {
  const known = OPTION_KEYS[kind]
  for (const key of Object.keys(obj)) {
    if (known.has(key) || obj[key] === undefined) continue
    const notYet = NOT_YET_BY_KIND[kind]
    if (notYet && Object.hasOwn(notYet, key)) {
      throw coded('UNSUPPORTED_OPTION', `${key}: ${notYet[key]} are not supported by this engine yet`)
    }
    let near = null
    for (const k of known) if (distance(key, k) <= Math.max(2, Math.floor(k.length / 4)) && (near === null || distance(key, k) < distance(key, near))) near = k
    throw coded('INVALID_OPTION', `${key}: not a ${kind} option${near ? ` (did you mean '${near}'?)` : ''}`)
  }
  if ((kind === 'generate' || kind === 'request') && obj.kvConfig != null) {
    if (!Array.isArray(obj.kvConfig)) throw coded('INVALID_OPTION', 'kvConfig: must be a list of { layerIdx, bits, groupSize }')
    for (const entry of obj.kvConfig) {
      if (entry === null || typeof entry !== 'object') throw coded('INVALID_OPTION', 'kvConfig: every entry must be { layerIdx, bits, groupSize }')
      checkKeys('kvConfig', entry)
    }
  }
}

function optionObject(options) {
  if (options === undefined || options === null) return {}
  if (typeof options !== 'object') throw coded('INVALID_OPTION', 'options: must be an object')
  return options
}

/** JSON-bound values with NaN and infinities as text, which JSON cannot carry; Rust rejects them by name. */
function jsonSafe(v) {
  if (typeof v === 'number') return Number.isFinite(v) ? v : String(v)
  if (Array.isArray(v)) return v.map(jsonSafe)
  if (v !== null && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, jsonSafe(x)]))
  return v
}

module.exports = { checkKeys, optionObject, jsonSafe }
