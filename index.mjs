// ES module entry (`import { generate } from 'mlx-bun'`): the same module instance as `require`,
// so an app that mixes both shares one engine thread and one set of classes. The names are listed
// here because Node cannot see through index.js's computed exports; __test__/exports.test.js
// keeps this list equal to index.js's and to index.d.ts.
import { createRequire } from 'node:module'

const mlx = createRequire(import.meta.url)('./index.js')

export default mlx
export const {
  generate,
  Generation,
  createEngine,
  InferenceEngine,
  GenerationSession,
  testing,
  loadModelConfig,
  loadModel,
  createModel,
  loadTokenizer,
  pullDefaultModel,
  defaultModelPath,
  convert,
  runCli,
  resolveExecution,
  saveKvCache,
  loadKvCache,
  embedOne,
  embedMany,
  isEmbeddingModel,
  withInstruction,
  loadContext,
  createServer,
  Weights,
  Model,
  Tokenizer,
  StreamDecoder,
  ChatTemplate,
  mapError,
  nativeRuntimeDir,
  ensureNativeRuntime,
  Registry,
  downloadModel,
  fit,
  thisMachine,
  skuMatrix,
  COEXIST_FRACTION,
} = mlx
