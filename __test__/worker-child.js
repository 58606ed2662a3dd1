'use strict'
// Worker thread for workers.test.js: loads the addon in a worker, generates greedily and posts
// the tokens ('complete'), or posts after a few tokens of an endless generation ('midway') so the
// parent can terminate the worker while the engine still decodes for it.
const { parentPort, workerData } = require('node:worker_threads')
const mlx = require('..')

async function main() {
  const { dir, prompt, maxTokens, mode } = workerData
  const model = await mlx.loadModel(dir)
  const tokens = []
  const opts = mode === 'complete' ? { maxTokens, temperature: 0 } : { maxTokens: 1e9, eosTokenIds: [], temperature: 0 }
  for await (const e of mlx.generate(model, prompt, opts)) {
    tokens.push(e.token)
    if (mode === 'midway' && tokens.length === maxTokens) parentPort.postMessage(tokens)
  }
  parentPort.postMessage(tokens)
}
main().catch((e) => parentPort.postMessage({ error: String(e) }))
