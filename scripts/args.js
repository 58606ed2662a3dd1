'use strict'
// Command-line flags of the benchmark scripts: `--name value`.
const args = process.argv.slice(2)

/** The value after `--name`, or `fallback`. */
function arg(name, fallback) {
  const i = args.indexOf(`--${name}`)
  return i >= 0 ? args[i + 1] : fallback
}

/** The JavaScript runtime running the script, for report headers. */
const runtime = typeof Bun !== 'undefined' ? `bun ${Bun.version}` : `node ${process.version}`

/** The environment for a Python mlx-lm peer: the addon links the system's OpenBLAS, so the peer
 * gets the same BLAS through LD_PRELOAD (without it, MLX's CPU wheel multiplies ~10x slower). */
function peerEnv() {
  const fs = require('node:fs')
  const blas = `/usr/lib/${process.arch === 'arm64' ? 'aarch64' : 'x86_64'}-linux-gnu/libopenblas.so.0`
  return { ...process.env, ...(process.platform === 'linux' && fs.existsSync(blas) ? { LD_PRELOAD: blas } : {}) }
}

module.exports = { arg, runtime, peerEnv }
