// Types of the memory contract: fit, thisMachine, skuMatrix (Rust: src/fit).
import type { KvQuantSpec, ModelConfigInfo, TextConfig } from '../index'

/** A machine `fit` predicts for (mlx-bun's `MachineSpec`, with `chip` and `bandwidthSource` added). */
export interface MachineSpec {
  name: string
  ramBytes: number
  /** Memory bandwidth, GB/s. */
  bandwidthGBs: number
  /** `'M4 Pro'` on a Mac; the CPU's model name elsewhere; `null` when the system does not say. */
  chip?: string | null
  /**
   * `'table'`: Apple's figure for the detected chip; `'given'`: `thisMachine(bandwidthGBs)`'s;
   * `'estimated'`: a guess (an unknown Mac: 273, the M4 Pro's; any other machine: 51.2,
   * dual-channel DDR4-3200's peak). Predicted decode speeds scale with it.
   */
  bandwidthSource?: 'table' | 'given' | 'estimated'
}

/**
 * How the KV cache is stored for `fit` (mlx-bun's `FitKvScheme`): bf16 when omitted; `kvBits`
 * (with `kvGroupSize`, default 64) quantizes every attention layer at bits/8 + 4/group bytes an
 * element; `kvConfig` quantizes the layers it lists. Give one of `kvBits` and `kvConfig`.
 * `quantizedKvStart` and `turboQuant` throw `UNSUPPORTED_OPTION`.
 */
export interface FitKvScheme {
  kvBits?: 2 | 3 | 4 | 5 | 6 | 8
  kvGroupSize?: 32 | 64 | 128
  kvConfig?: KvQuantSpec[]
}

/** What `fit` returns (mlx-bun's `FitReport`); bytes and tokens as numbers. */
export interface FitReport {
  /** `totalBytes <= usableBytes`. */
  fits: boolean
  contextTokens: number
  weightsBytes: number
  /** The KV cache at `contextTokens` (sliding layers capped at their window), plus recurrent state. */
  kvBytes: number
  /** A prefill chunk's activations (0.55 MB a token) plus the attention scores MLX materialises for head dims its fused kernel does not serve. */
  transientBytes: number
  totalBytes: number
  /** RAM × 0.75, or `usableBytes` when given. */
  usableBytes: number
  /** The longest context whose total fits (`maxPositionEmbeddings` at most; 0 if even the weights do not fit). */
  maxSafeContext: number
  /** Bandwidth ÷ the bytes one token reads, × 0.82 (0.76 for mixture-of-experts models). */
  predictedDecodeTps: number
}

/** One row of `skuMatrix`. */
export interface SkuRow {
  /** The chip (`'M4 Pro'`). */
  sku: string
  ramGB: number
  fits: boolean
  maxContext: number
  decodeTps: number
}

/**
 * mlx-bun's `fit`: whether `config`'s model, with `weightsBytes` of weights, fits `machine` at
 * `ctx` tokens, the longest safe context and the predicted decode speed. `expertsBytes`: bytes of
 * the `.experts.` tensors (`ModelRecord.expertsBytes`), of which a mixture-of-experts model reads
 * top-k per token. `usableBytes` replaces RAM × 0.75. Synchronous and pure arithmetic; bad
 * numbers throw `INVALID_OPTION` naming the argument.
 */
export function fit(
  config: ModelConfigInfo | { text: Partial<TextConfig> },
  weightsBytes: number,
  ctx: number,
  machine?: MachineSpec,
  chunk?: number,
  expertsBytes?: number,
  usableBytes?: number,
  kvScheme?: FitKvScheme,
): FitReport

/** mlx-bun's `thisMachine(bandwidthGBs?)`: this machine's RAM (as `os.totalmem()`), chip and bandwidth. */
export function thisMachine(bandwidthGBs?: number): MachineSpec

/** mlx-bun's `skuMatrix`: `fit` on each Apple Silicon chip and RAM size it ships with (41 rows). */
export function skuMatrix(
  config: ModelConfigInfo | { text: Partial<TextConfig> },
  weightsBytes: number,
  ctx: number,
  expertsBytes?: number,
  kvScheme?: FitKvScheme,
): SkuRow[]

/** The share of RAM a model picked automatically may take (0.6; mlx-bun's auto-pick budget). */
export const COEXIST_FRACTION: number
