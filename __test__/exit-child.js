'use strict'
// Child process for exit.test.js: exits while the engine thread is busy inside MLX.
const mlx = require('..')

async function main() {
  const [mode, dir] = process.argv.slice(2)
  const model = await mlx.loadModel(dir)
  if (mode === 'long-exit') return exitInLongStep(model)
  const it = mlx.generate(model, [1, 2, 3], { maxTokens: 1e9, eosTokenIds: [] })[Symbol.asyncIterator]()
  for (let i = 0; i < 3; i++) await it.next()
  if (mode === 'exit') process.exit(3)
  // 'end': return with the generation still running and nothing awaiting it.
}
main()

// 'long-exit': exits while the engine is inside one prefill step of a 400-token prompt, which on
// MLX's CPU backend takes minutes for a 4-bit model.
async function exitInLongStep(model) {
  const prompt = Array.from({ length: 400 }, (_, i) => 100 + i)
  const it = mlx.generate(model, prompt, { maxTokens: 1, prefillChunkSize: 4096 })[Symbol.asyncIterator]()
  it.next()
  await new Promise((r) => setTimeout(r, 1500))
  process.stderr.write(`exiting at ${Date.now()}\n`)
  process.exit(3)
}
