// Types of the models on disk: Registry, downloadModel (Rust: src/hub).
import type { MlxBunError } from '../index'

/**
 * One model on disk, as `Registry` lists it (mlx-bun's `ModelRecord`; Rust:
 * `hub::registry::ModelRecord`). Numbers a file does not state are `null`.
 */
export interface ModelRecord {
  /** The hub snapshot folder, model folder or `.gguf` file: what `loadModel` takes. */
  path: string
  /** `org/name` for hub snapshots; the folder's name or the file's stem in `$MLX_BUN_HOME/models`. */
  repoId: string
  /** config.json's `model_type` (`'unknown'` if absent); a GGUF's architecture. */
  modelType: string
  /** `model.safetensors.index.json`'s `metadata.total_parameters`; a GGUF's element count. */
  paramCount: number | null
  /** Weight bytes: every `*.safetensors` but the vision sidecar; a GGUF's file size. */
  sizeBytes: number
  /** `optiq_vision.safetensors` bytes (mlx-bun's bf16 vision sidecar). */
  sidecarBytes: number
  /** Bytes of `.experts.` tensors (mixture-of-experts models; 0 for dense ones). */
  expertsBytes: number
  /** config.json's `quantization` (or `quantization_config`) `bits` and `group_size`. */
  quantBits: number | null
  quantGroupSize: number | null
  /** `'affine'` or the config's `mode` for quantized folders; for a GGUF, the GGML type holding
   * most of its bytes (`'Q4_K'`, `'Q8_0'`, `'BF16'`, …). */
  quantMode: string | null
  hasVisionSidecar: boolean
  /** `vision_config.model_type` when it names a vision tower (`*_vision`). */
  visionConfigType: string | null
  /** A `kv_config.json` is present. */
  hasKvConfig: boolean
  /** The chat template (chat_template.jinja or tokenizer_config.json) mentions `tool_call`. */
  hasToolTemplate: boolean
  numLayers: number | null
  hiddenSize: number | null
  vocabSize: number | null
  /** The model card's `license:` (README.md front matter) or a GGUF's `general.license`. */
  license: string | null
  /** When the record was scanned (ms since the epoch). */
  scannedAt: number
}

/** `Registry.list` filters; every one given must hold. */
export interface RegistryFilter {
  /** Vision-capable (a vision sidecar, or an encoder-free `*unified_vision` tower) or not. */
  vision?: boolean
  /** `sizeBytes <= maxBytes`. */
  maxBytes?: number
  /** A case-insensitive fragment of the repo id or the model type. */
  query?: string
}

export interface RegistryOptions {
  /** The index file (default `$MLX_BUN_HOME/registry.json`); `':memory:'` keeps none. */
  dbPath?: string
  /** The hub cache `scan()` reads (default `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
   * `~/.cache/huggingface/hub`). */
  hubDir?: string
  /** Instead of `$MLX_BUN_HOME` (default `~/.cache/mlx-bun`): its `models/` folder (model folders
   * and `.gguf` files) is scanned too. */
  home?: string
}

/**
 * The models on this machine: every snapshot in the Hugging Face cache with a config.json and
 * safetensors, and every model folder or `.gguf` file in `$MLX_BUN_HOME/models`. Scanning reads
 * configs and file headers only. The index persists in `dbPath` (JSON; mlx-bun uses SQLite).
 */
export class Registry {
  /** mlx-bun's `new Registry(dbPath?)`, or an options object. */
  constructor(dbPathOrOptions?: string | RegistryOptions)
  /** Rescans off the JS thread; records of deleted files are dropped. Resolves with the number
   * of models found. */
  scan(hubDir?: string): Promise<number>
  /** Matching records, smallest first (one per cached revision). */
  list(filter?: RegistryFilter): ModelRecord[]
  /** One record per repository: the snapshot `refs/main` names, else the latest scanned. */
  listCanonical(filter?: RegistryFilter): ModelRecord[]
  /**
   * Exactly one model for an exact repo id (case-insensitive), a path to a model folder or
   * `.gguf` file, or a fragment of a repo id or model type. Revisions of one repository count as
   * one; drafters (`*_assistant`) are never candidates. Throws `MODEL_NOT_FOUND` for none and
   * `AMBIGUOUS_MODEL` (with `candidates`, the repo ids) for several.
   */
  resolve(query: string): ModelRecord
  /** Nothing to close (the index is written at scan time); kept for mlx-bun's API. */
  close(): void
}

/** The error `Registry.resolve` throws when several repositories match. */
export interface AmbiguousModelError extends MlxBunError {
  code: 'AMBIGUOUS_MODEL'
  candidates: string[]
}

export interface DownloadOptions {
  /** Branch, tag or commit (default `'main'`). */
  revision?: string
  /** The hub cache to fill (default as `RegistryOptions.hubDir`). */
  cacheDir?: string
  /** The hub (default `$HF_ENDPOINT`, else `https://huggingface.co`). */
  endpoint?: string
  /** Bearer token for gated or private repositories (default `$HF_TOKEN`, else the token
   * `hf auth login` saved in `$HF_HOME/token`); `null`: none. Never sent past a redirect. */
  token?: string | null
  /** Called from the download's thread through a queue (never slowing it), at most every 50 ms
   * per file and once when a file is complete (`received === total`, also for files already
   * cached). Throwing stops the download, which rejects with that error. */
  onProgress?: (file: string, received: number, total: number) => void
  /** Every file of the repository instead of those a model needs (top-level `*.json`,
   * `*.jsonl`, `*.txt`, `*.jinja`, `*.tiktoken`, `tokenizer.model`, `model*.safetensors`,
   * `README.md`). An addition to mlx-bun's options. */
  allFiles?: boolean
}

/**
 * Downloads a Hugging Face repository into the hub cache in huggingface_hub's layout
 * (`blobs/`, `snapshots/<commit>/`, `refs/<revision>`), off the JS thread; resolves with the
 * snapshot folder. Files already cached are not fetched again. Every file is checked against the
 * hub's listing (size, and SHA-256 or git blob id): a mismatch deletes it and throws
 * `CHECKSUM_MISMATCH`. A cut connection throws `DOWNLOAD_FAILED` and keeps
 * `blobs/<id>.incomplete`, which the next call resumes with a `Range` request. The snapshot's
 * links appear only once every file is verified. An unreachable hub throws `DOWNLOAD_FAILED`
 * (30 s without an answer at most, `MLX_BUN_HTTP_TIMEOUT_MS`).
 */
export function downloadModel(repoId: string, options?: DownloadOptions): Promise<string>
