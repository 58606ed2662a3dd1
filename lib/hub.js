'use strict'
// Models on disk: mlx-bun's Registry and downloadModel over the Rust index and downloader.
const { coded, wrap } = require('./errors')
const { native } = require('./native')
const { checkKeys, optionObject } = require('./options')

/**
 * mlx-bun's `Registry`: an index of the models on disk (the Hugging Face cache and
 * `$MLX_BUN_HOME/models`). `new Registry(dbPath?)` as in mlx-bun, or `new Registry({ dbPath,
 * hubDir, home })`. The index is kept in `dbPath` (default `$MLX_BUN_HOME/registry.json`;
 * `':memory:'` keeps none), so a later process lists what the last `scan()` found.
 */
class Registry {
  #native
  constructor(dbPath) {
    const options = typeof dbPath === 'string' ? { dbPath } : optionObject(dbPath)
    checkKeys('registry', options)
    this.#native = wrap(() => new native.NativeRegistry(options))()
  }

  /** Rescans the hub cache (`hubDir`, default the constructor's) and `$MLX_BUN_HOME/models`
   * off the JS thread; resolves with the number of models found. */
  scan(hubDir) {
    if (hubDir != null && typeof hubDir !== 'string') return Promise.reject(coded('INVALID_OPTION', 'hubDir: must be a string'))
    return this.#native.scan(hubDir ?? null)
  }

  /** Records matching every filter given, smallest first. */
  list(filter) {
    return this.#native.list(listFilter(filter))
  }

  /** `list()` with one record per repository (its `refs/main` snapshot, else the latest). */
  listCanonical(filter) {
    return this.#native.listCanonical(listFilter(filter))
  }

  /** Exactly one model for a path, a repo id or a fragment of one; `MODEL_NOT_FOUND` for none,
   * `AMBIGUOUS_MODEL` (with `err.candidates`) for several repositories. */
  resolve(query) {
    if (typeof query !== 'string' || query === '') throw coded('INVALID_OPTION', 'query: must be a non-empty string')
    const r = this.#native.resolve(query)
    if (Array.isArray(r.candidates)) throw Object.assign(coded('AMBIGUOUS_MODEL', r.message), { candidates: r.candidates })
    return r
  }

  /** mlx-bun closes its database here; this index holds nothing open, so there is nothing to do. */
  close() {}
}

function listFilter(filter) {
  filter = optionObject(filter)
  checkKeys('list', filter)
  return filter
}

/**
 * mlx-bun's `downloadModel(repoId, options?)`: the repository's model files into the Hugging
 * Face cache, resumable and verified; resolves with the snapshot folder. `onProgress(file,
 * received, total)` is called from the download's own thread through a queue; if it throws, the
 * download stops and rejects with that error.
 */
async function downloadModel(repoId, options) {
  if (typeof repoId !== 'string' || repoId === '') throw coded('INVALID_OPTION', 'repoId: must be a non-empty string')
  options = optionObject(options)
  checkKeys('download', options)
  const { onProgress, token, ...rest } = options
  if (onProgress != null && typeof onProgress !== 'function') throw coded('INVALID_OPTION', 'onProgress: must be a function')
  if (token != null && typeof token !== 'string') throw coded('INVALID_OPTION', 'token: must be a string or null')
  let thrown = null
  const report = onProgress && ((file, received, total) => {
    if (thrown) return false
    try {
      onProgress(file, received, total)
      return true
    } catch (e) {
      thrown = e
      return false
    }
  })
  // `token: null` means no token at all (mlx-bun's meaning); the native side reads "" as that.
  const nativeOptions = { ...rest, token: token === null ? '' : token }
  let snapshot
  try {
    snapshot = await wrap(native.downloadModelNative)(repoId, nativeOptions, report ?? null)
  } catch (e) {
    throw thrown ?? e
  }
  if (thrown) throw thrown
  return snapshot
}

module.exports = { Registry, downloadModel }
