// The node-llama-cpp side of scripts/bench.py: one GGUF file, the same workload and the same
// measures as `mlx-bun bench` and the mlx-lm side (TTFT = prompt submitted → first token ready;
// prefill tok/s = prompt tokens / TTFT; decode tok/s = generated tokens / time since the first
// token; peak RSS), on the CPU with the given number of threads, greedy, end of sequence ignored.
//
//   node scripts/peers/llama-cpp.mjs MODEL.gguf PROMPT_TOKENS GEN_TOKENS REPEATS THREADS
//
// Prints one JSON line. Token ids are the fixed pseudo-random spread the other two engines use.
import { getLlama } from 'node-llama-cpp'

const [file, nPrompt, nGen, repeats, threads] = [process.argv[2], ...process.argv.slice(3, 7).map(Number)]
// The prebuilt CPU binary only: never build llama.cpp, never take a GPU.
const llama = await getLlama({ gpu: false, build: 'never', maxThreads: threads, logLevel: 'error' })
const model = await llama.loadModel({ modelPath: file, gpuLayers: 0 })
const vocabSize = model.fileInfo.metadata.tokenizer.ggml.tokens.length
const prompt = Array.from({ length: nPrompt }, (_, i) => (i * 7919 + 13) % vocabSize)
const context = await model.createContext({ contextSize: nPrompt + Math.max(nGen, 8) + 16, threads, batchSize: Math.max(nPrompt, 1) })
const sequence = context.getSequence()

async function run(n) {
  await sequence.clearHistory()
  const t0 = performance.now()
  let first = null
  let count = 0
  for await (const _token of sequence.evaluate(prompt, { temperature: 0 })) {
    count++
    if (first === null) first = performance.now()
    if (count >= n) break
  }
  const end = performance.now()
  const ttft = (first - t0) / 1e3
  return { ttft, prefill: nPrompt / ttft, decode: end > first ? count / ((end - first) / 1e3) : 0 }
}

await run(Math.min(8, nGen)) // warm-up
const runs = []
for (let i = 0; i < repeats; i++) runs.push(await run(nGen))
const series = (k, scale = 1) => {
  const v = runs.map((r) => r[k] * scale).sort((a, b) => a - b)
  return { min: v[0], median: v[v.length >> 1], max: v[v.length - 1] }
}
console.log(JSON.stringify({
  engine: 'node-llama-cpp', prefill_tps: series('prefill'), decode_tps: series('decode'), ttft_ms: series('ttft', 1e3),
  peak_rss_mb: process.resourceUsage().maxRSS / 1024,
}))
await context.dispose()
await model.dispose()
await llama.dispose()
