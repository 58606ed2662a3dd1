// Types of mlx-bun 0.5's placement policy: resolveExecution (Rust: engine::placement).
/** What one request needs (Rust: `engine::plan::ExecutionRequirements`). */
export interface ExecutionRequirements {
  hasVision: boolean
  hasAdapters: boolean
  hasRepetitionPenalty: boolean
  userSeed: boolean
  kvQuant: boolean
  turboQuant: boolean
  hasLogitsExtras: boolean
  hasGrammar: boolean
  wantsLogprobs: boolean
  hasDraft: boolean
  hasPreparedPrefixIdentity?: boolean
}

export type ExecutionMethod = 'autoregressive' | 'speculative' | 'denoising'

/** What the executor can do (Rust: `engine::plan::ExecutionCapabilities`); absent flags are false. */
export interface ExecutionCapabilities {
  method: 'autoregressive' | 'denoising'
  continuous: boolean
  quantizedBatch: boolean
  grammarBatch: boolean
  /** The model's caches cannot be trimmed (Qwen3.5 / Qwen3-Next linear attention): rows leave a checkpoint at the end of their prompt in the prefix cache. */
  checkpoints: boolean
  compiledDecode?: boolean
  speculativeKvQuant?: boolean
  mediaBatch?: boolean
  adapterBatch?: boolean
  turboQuantBatch?: boolean
  pagedBatch?: boolean
  /** Default `['autoregressive']`. */
  groupedMethods?: ExecutionMethod[]
  sharedSpeculativeAdapters?: boolean
  speculativeLogprobs?: boolean
  sharedGrammarProposals?: boolean
  speculativeTurboQuant?: boolean
  mediaPrefixCache?: boolean
  sharedFill?: boolean
  sharedSpeculativeEcho?: boolean
  /** Checkpoints in the continuous lane too (this engine: whenever `checkpoints`). */
  sharedCheckpoints?: boolean
}

export interface ExecutionFeatures {
  pagedKv: boolean
  fill: boolean
  compiledDecode?: boolean
  grammarJump?: boolean
}

export interface ResolvedExecution {
  readonly method: ExecutionMethod
  readonly mechanism: 'serial' | 'continuous'
  readonly pagedKv: boolean
  readonly promptCache: boolean
  readonly checkpoint: boolean
  readonly fill: boolean
  readonly compiledDecode: boolean
  readonly grammarJump: boolean
  /** Why anything fell back, in mlx-bun's fixed order (e.g. `'continuous-unavailable'`). */
  readonly reasons: readonly string[]
}

/** mlx-bun 0.5's `resolveExecution`: the method first, then serial or continuous placement. */
export function resolveExecution(
  request: ExecutionRequirements,
  capabilities: ExecutionCapabilities,
  features?: ExecutionFeatures,
): ResolvedExecution
