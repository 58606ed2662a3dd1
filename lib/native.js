'use strict'
// Finding and loading the native addon: this package's own build, else the installed
// @mlx-bun/<platform> package, with the MLX runtime beside it. Its methods map errors at the source.
const { existsSync } = require('node:fs')
const { dirname, join } = require('node:path')

const { coded, wrap } = require('./errors')

function platformTriple() {
  const { platform, arch } = process
  if (platform === 'linux' && (arch === 'x64' || arch === 'arm64')) return `linux-${arch}-gnu`
  if (platform === 'darwin' && arch === 'arm64') return 'darwin-arm64'
  throw new Error(`mlx-bun: unsupported platform ${platform}-${arch} (supported: linux-x64-gnu, linux-arm64-gnu, darwin-arm64)`)
}

/** This package's folder: a build tree keeps the addon there. */
const PACKAGE_DIR = join(__dirname, '..')

/** The platform package that carries the addon and the MLX runtime for `triple`. */
const platformPackage = (triple) => `@mlx-bun/${triple}`

/**
 * The folder holding the native addon and the MLX runtime beside it: this package's own folder in
 * a build tree (`npm run build`), else the installed platform package's; null when neither has it.
 */
function nativeRuntimeDir() {
  const triple = platformTriple()
  if (existsSync(join(PACKAGE_DIR, `mlx-bun.${triple}.node`))) return PACKAGE_DIR
  try {
    return dirname(require.resolve(`${platformPackage(triple)}/package.json`))
  } catch {
    return null
  }
}

/**
 * The runtime files checked by name before loading. The libraries libmlx itself needs (the
 * wheel's `mlx_cpu.libs/`, which an `MLX_PREFIX` build may not have) are named by the dynamic
 * loader's own message if one is missing.
 */
function runtimeFiles(triple) {
  const files = [`mlx-bun.${triple}.node`]
  if (triple.startsWith('darwin')) files.push('mlx/lib/libmlx.dylib', 'mlx/lib/mlx.metallib')
  else files.push('mlx/lib/libmlx.so')
  return files
}

/** OpenBLAS's idle spin before its threads sleep: 2^4 cycles, its least (as the CLI's `blas::THREAD_TIMEOUT`). */
const OPENBLAS_THREAD_TIMEOUT = '4'

function loadNative() {
  const triple = platformTriple()
  const pkg = platformPackage(triple)
  const dir = nativeRuntimeDir()
  if (dir === null) {
    throw coded('NATIVE_RUNTIME_MISSING', `mlx-bun: the native addon for ${triple} is missing: install ${pkg} (npm and bun install it with mlx-bun unless optional dependencies are omitted), or build it here with \`npm run build\``)
  }
  const missing = runtimeFiles(triple).find((f) => !existsSync(join(dir, f)))
  if (missing !== undefined) {
    throw coded('NATIVE_RUNTIME_MISSING', `mlx-bun: ${join(dir, missing)} is missing: ${pkg} provides it (reinstall ${pkg})`)
  }
  // OpenBLAS's worker threads spin after each product before they sleep, taking cores from MLX's
  // stream threads (src/mlx/blas.rs says what it costs). OpenBLAS reads this once, as the addon
  // loads it; a value the user set is kept, and child processes do not inherit ours.
  const quiet = process.platform === 'linux' && process.env.OPENBLAS_THREAD_TIMEOUT === undefined
  if (quiet) process.env.OPENBLAS_THREAD_TIMEOUT = OPENBLAS_THREAD_TIMEOUT
  try {
    return require(join(dir, `mlx-bun.${triple}.node`))
  } catch (e) {
    // The dynamic loader names the library it could not find; OpenBLAS is the one the runtime
    // takes from the system on Linux.
    const hint = /libopenblas/.test(e.message)
      ? 'install OpenBLAS (`apt install libopenblas0-pthread` on Debian and Ubuntu)'
      : `${pkg} provides the MLX runtime (reinstall ${pkg})`
    throw coded('NATIVE_RUNTIME_MISSING', `mlx-bun: the native addon in ${dir} did not load: ${e.message}; ${hint}`)
  } finally {
    if (quiet) delete process.env.OPENBLAS_THREAD_TIMEOUT
  }
}

const native = loadNative()
native.installExitHook(require('node:worker_threads').isMainThread)

// Native methods throw coded errors; map them at the source, once.
for (const cls of [native.Weights, native.Model, native.Tokenizer, native.StreamDecoder, native.ChatTemplate, native.NativeEngine, native.NativeSession, native.KvCache, native.ServerContext, native.HttpServer, native.NativeRegistry]) {
  for (const key of Object.getOwnPropertyNames(cls.prototype)) {
    const d = Object.getOwnPropertyDescriptor(cls.prototype, key)
    if (key !== 'constructor' && typeof d.value === 'function') {
      Object.defineProperty(cls.prototype, key, { ...d, value: wrap(d.value) })
    } else if (typeof d.get === 'function') {
      Object.defineProperty(cls.prototype, key, { ...d, get: wrap(d.get) })
    }
  }
}

module.exports = { native, nativeRuntimeDir }
