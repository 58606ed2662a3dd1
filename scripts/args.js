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

module.exports = { arg, runtime }
