// A TypeScript app written against mlx-bun's API, using every export of this package: type-checked
// with `tsc --strict --noEmit` by __test__/exports.test.js (it is never run). Code from mlx-bun's
// docs must compile unchanged: createModel returns the model, loadTokenizer/ChatTemplate.load and
// loadModelConfig are synchronous, and awaiting them still works.
import mlxDefault, {
  COEXIST_FRACTION,
  ChatTemplate,
  Generation,
  GenerationSession,
  InferenceEngine,
  Model,
  Registry,
  StreamDecoder,
  Tokenizer,
  Weights,
  convert,
  createEngine,
  createModel,
  createServer,
  defaultModelPath,
  downloadModel,
  embedMany,
  embedOne,
  ensureNativeRuntime,
  fit,
  generate,
  isEmbeddingModel,
  loadContext,
  loadKvCache,
  loadModel,
  loadModelConfig,
  loadTokenizer,
  mapError,
  nativeRuntimeDir,
  pullDefaultModel,
  resolveExecution,
  runCli,
  saveKvCache,
  skuMatrix,
  testing,
  thisMachine,
  withInstruction,
} from 'mlx-bun'
import type { EmbedResult, ErrorCode, FitReport, GenerateStats, GenerationOutcome, MachineSpec, ModelConfigInfo, ModelRecord, NativeRuntime, SkuRow, TextConfig } from 'mlx-bun'

export async function app(dir: string): Promise<string> {
  const runtime: NativeRuntime = await ensureNativeRuntime()
  const where: string | null = nativeRuntimeDir()
  const config: ModelConfigInfo = loadModelConfig(dir)
  const text: TextConfig = config.text
  const layers: number = text.numHiddenLayers
  const weights: Weights = Weights.open(dir)
  const model: Model = createModel(weights, config)
  const alsoAwaited: Model = await createModel(await Weights.open(dir), await loadModelConfig(dir), { f32Matmuls: 'none' })
  await model.ready
  const tokenizer: Tokenizer = loadTokenizer(dir)
  const template: ChatTemplate | null = ChatTemplate.load(dir)
  const thinking: 'think-tag' | 'gemma-channel' | null = template?.thinkingFormat ?? null
  const prompt = template?.render([{ role: 'user', content: 'Hi' }], { addGenerationPrompt: true }) ?? 'Hi'
  const ids: Uint32Array = tokenizer.encode(prompt, false)
  const decoder: StreamDecoder = tokenizer.createDecoder()
  const gen: Generation = generate(model, ids, { maxTokens: 8, temperature: 0, topP: 0, topK: 0, seed: 0 })
  let out = ''
  for await (const t of gen) out += decoder.push([t.token])
  out += decoder.flush()
  const stats: GenerateStats | undefined = gen.stats

  const engine: InferenceEngine = createEngine(model, { maxActive: 4, prefixCacheBytes: 0 })
  const session: GenerationSession = engine.open({ promptTokens: ids, maxTokens: 4 }, { output: 'collect' })
  const outcome: GenerationOutcome = await session.result
  await engine.close()

  const cache = model.makeCache()
  for await (const _ of generate(model, ids, { maxTokens: 2, cache })) break
  await saveKvCache(cache, '/tmp/conversation.kv')
  const restored = await loadKvCache(model, '/tmp/conversation.kv')
  restored.dispose()

  const ctx = loadContext(dir, 'smollm2', { chatTemplate: template ?? undefined })
  await ctx.ready
  const server = createServer(ctx, 0, { defaultMaxTokens: 64, batch: 4 })
  await server.close()

  const logits: Float32Array = await alsoAwaited.logits([1, 2, 3])
  const query: EmbedResult = await embedOne(model, tokenizer, 'Where is Paris?', 'Find the answer')
  const docs: EmbedResult[] = await embedMany(model, tokenizer, ['Paris is in France.'])
  const pooled: Float32Array[] = await model.embedPooled([ids, [1, 2, 3]])
  const formatted: string = withInstruction('Where is Paris?', 'Find the answer')
  const canEmbed: boolean = isEmbeddingModel(model) && query.vector.length === docs[0].vector.length && query.tokens > 0 && pooled.length === 2 && formatted.length > 0
  const placed = resolveExecution(
    { hasVision: false, hasAdapters: false, hasRepetitionPenalty: false, userSeed: false, kvQuant: false, turboQuant: false, hasLogitsExtras: false, hasGrammar: false, wantsLogprobs: false, hasDraft: false },
    engine.capabilities,
  )
  const path: string = await pullDefaultModel({ home: '/tmp/mlx-bun-home' })
  const converted: string = await convert(path, '/tmp/smollm2-f16', { dtype: 'f16' })
  const code: number = await runCli(['--help'])
  const registry = new Registry()
  const found: number = await registry.scan()
  const small: ModelRecord[] = registry.list({ vision: false, maxBytes: 10 * 2 ** 30, query: 'qwen' })
  const chosen: ModelRecord = registry.resolve(small[0]?.repoId ?? 'smollm2')
  registry.close()
  const snapshot: string = await downloadModel('mlx-community/SmolLM2-135M-Instruct', {
    revision: 'main',
    onProgress: (file, received, total) => console.log(file, received, total),
  })
  const machine: MachineSpec = thisMachine()
  const report: FitReport = fit(config, chosen.sizeBytes, 8192, machine, 2048, chosen.expertsBytes, machine.ramBytes * COEXIST_FRACTION, { kvBits: 4 })
  const rows: SkuRow[] = skuMatrix(config, chosen.sizeBytes, 32768)
  const safe: number = fit(config, chosen.sizeBytes, 8192).maxSafeContext + rows.length + (report.fits ? 1 : 0)
  const scripted = testing.createScriptedEngine({ steps: [{ commit: [1, 2] }] })
  await scripted.close()
  try {
    generate(model, [], { temperature: -1 })
  } catch (e) {
    const coded: ErrorCode = (mapError(e) as { code: ErrorCode }).code
    out += coded
  }
  model.dispose()
  weights.dispose()
  const same: boolean = mlxDefault.generate === generate
  return [runtime.backend, where, layers, thinking, out, stats?.decodeTps, outcome.status, placed.mechanism, logits.length, converted, code, defaultModelPath(), same, found, chosen.path, snapshot, safe, canEmbed].join(' ')
}
