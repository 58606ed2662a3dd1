'use strict'
// mlx-bun's memory contract: fit, thisMachine, skuMatrix and COEXIST_FRACTION over the Rust
// core (src/fit), the same function the CLI's `mlx-bun fit` and the server's GET /fit use.
const { coded, wrap } = require('./errors')
const { native } = require('./native')
const { checkKeys, jsonSafe } = require('./options')

/**
 * The share of RAM a model picked automatically may take and still leave the machine usable for
 * other apps (mlx-bun's auto-pick budget, stricter than fit's RAM × 0.75).
 */
const COEXIST_FRACTION = 0.6

/** `config.text` of loadModelConfig()'s result (or of a hand-made `{ text }`). */
function textOf(config) {
  if (config === null || typeof config !== 'object' || config.text === null || typeof config.text !== 'object') {
    throw coded('INVALID_OPTION', 'config: must be loadModelConfig()\'s result (an object with `text`)')
  }
  return jsonSafe(config.text)
}

/** Throws unless `value` is a number (or, when `optional`, undefined or null). */
function number(name, value, optional) {
  if (optional && (value === undefined || value === null)) return undefined
  if (typeof value !== 'number') throw coded('INVALID_OPTION', `${name}: must be a number, got ${typeof value}`)
  return value
}

function object(kind, value) {
  if (value === undefined || value === null) return undefined
  if (typeof value !== 'object' || Array.isArray(value)) throw coded('INVALID_OPTION', `${kind}: must be an object`)
  checkKeys(kind, value)
  return jsonSafe(value)
}

function kvSchemeOf(kvScheme) {
  const scheme = object('kvScheme', kvScheme)
  for (const entry of scheme?.kvConfig ?? []) object('kvConfig', entry)
  return scheme
}

/**
 * mlx-bun's `fit(config, weightsBytes, ctx, machine = thisMachine(), chunk = 2048,
 * expertsBytes = 0, usableBytes?, kvScheme?)`: the memory at `ctx` tokens, whether it fits,
 * the longest safe context and the predicted decode speed.
 */
function fit(config, weightsBytes, ctx, machine, chunk, expertsBytes, usableBytes, kvScheme) {
  const text = textOf(config)
  const m = object('machine', machine)
  if (m !== undefined) {
    number('machine.ramBytes', machine.ramBytes)
    number('machine.bandwidthGBs', machine.bandwidthGBs)
  }
  return wrap(native.fitNative)(text, number('weightsBytes', weightsBytes), number('ctx', ctx), m ?? null, number('chunk', chunk, true) ?? null,
    number('expertsBytes', expertsBytes, true) ?? null, number('usableBytes', usableBytes, true) ?? null, kvSchemeOf(kvScheme) ?? null)
}

/** mlx-bun's `thisMachine(bandwidthGBs?)`: this machine's RAM, chip and memory bandwidth. */
function thisMachine(bandwidthGBs) {
  return wrap(native.thisMachineNative)(number('bandwidthGBs', bandwidthGBs, true) ?? null)
}

/** mlx-bun's `skuMatrix(config, weightsBytes, ctx, expertsBytes = 0, kvScheme?)`: `fit` on every Apple Silicon chip and RAM size. */
function skuMatrix(config, weightsBytes, ctx, expertsBytes, kvScheme) {
  return wrap(native.skuMatrixNative)(textOf(config), number('weightsBytes', weightsBytes), number('ctx', ctx),
    number('expertsBytes', expertsBytes, true) ?? null, kvSchemeOf(kvScheme) ?? null)
}

module.exports = { fit, thisMachine, skuMatrix, COEXIST_FRACTION }
