#!/usr/bin/env node
'use strict'
// `mlx-bun` for npm/bun users: the Rust CLI, run inside the addon.
const { runCli } = require('..')

runCli(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (e) => {
    console.error(`mlx-bun: ${e.message}`)
    process.exit(1)
  },
)
