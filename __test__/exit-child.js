'use strict'
// Child process for exit.test.js: exits while the engine thread is busy inside MLX.
const mlx = require('..')

async function main() {
  const [mode, dir] = process.argv.slice(2)
  const model = await mlx.loadModel(dir)
  const it = mlx.generate(model, [1, 2, 3], { maxTokens: 1e9, eosTokenIds: [] })[Symbol.asyncIterator]()
  for (let i = 0; i < 3; i++) await it.next()
  if (mode === 'exit') process.exit(3)
  // 'end': return with the generation still running and nothing awaiting it.
}
main()
