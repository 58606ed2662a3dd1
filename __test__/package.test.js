'use strict'
// The package as users get it: `npm run pack` makes the two tarballs a release would publish
// (mlx-bun and @mlx-bun/<platform>), a fresh project outside the repository installs them with
// npm and with bun, and real generations run from an ES module, a CommonJS file and (under Bun)
// a TypeScript file, with nothing from the build tree on any path. Runs under Node only: it runs
// Bun itself.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const { execFileSync, spawnSync } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')

const mlx = require('..')
const { ROOT, collect, fixture } = require('./helpers')

const TRIPLE = { linux: `linux-${process.arch}-gnu`, darwin: 'darwin-arm64' }[process.platform]
const PLATFORM_PACKAGE = `@mlx-bun/${TRIPLE}`
const BUN = path.join(ROOT, 'node_modules', '.bin', 'bun')
const MODEL = fixture('home/models/SmolLM2-135M-Instruct.Q4_1.gguf')
const QUESTION = 'What is the capital of France?'

// What an app written from mlx-bun's docs does, in each module system. It prints the tokens and
// where the package and its runtime were loaded from.
const BODY = `
const config = loadModelConfig(MODEL)
const model = createModel(Weights.open(MODEL), config)
const tokenizer = loadTokenizer(MODEL)
const template = ChatTemplate.load(MODEL)
const prompt = tokenizer.encode(template.render([{ role: 'user', content: QUESTION }]), false)
const tokens = []
for await (const t of generate(model, prompt, { maxTokens: 6, temperature: 0, topP: 0 })) tokens.push(t.token)
const runtime = await ensureNativeRuntime()
console.log(JSON.stringify({ tokens, runtime, entry: ENTRY }))
model.dispose()
`
const NAMES = 'loadModelConfig, createModel, Weights, loadTokenizer, ChatTemplate, generate, ensureNativeRuntime'
const consts = `const MODEL = ${JSON.stringify(MODEL)}\nconst QUESTION = ${JSON.stringify(QUESTION)}\n`
const APPS = {
  'app.mjs': `import { ${NAMES} } from 'mlx-bun'\n${consts}const ENTRY = import.meta.resolve('mlx-bun')\n${BODY}`,
  'app.cjs': `const { ${NAMES} } = require('mlx-bun')\n${consts}const ENTRY = require.resolve('mlx-bun')\n;(async () => {\n${BODY}\n})()\n`,
  'app.ts': `import { ${NAMES}, type Model } from 'mlx-bun'\n${consts}const ENTRY: string = import.meta.resolve('mlx-bun')\n${BODY.replace('const model =', 'const model: Model =')}`,
}

/** The environment of a user's shell: nothing pointing into this repository. */
function cleanEnv() {
  const env = { ...process.env }
  for (const k of ['LD_LIBRARY_PATH', 'DYLD_LIBRARY_PATH', 'NODE_PATH', 'LD_PRELOAD', 'MLX_BUN_FIXTURES']) delete env[k]
  for (const k of Object.keys(env)) if (k.startsWith('npm_')) delete env[k]
  env.PATH = env.PATH.split(path.delimiter).filter((p) => !p.startsWith(ROOT)).join(path.delimiter)
  return env
}

function run(cmd, args, cwd) {
  const r = spawnSync(cmd, args, { cwd, env: cleanEnv(), encoding: 'utf8', timeout: 300_000 })
  if (r.status !== 0) assert.fail(`${cmd} ${args.join(' ')} in ${cwd} exited ${r.status}:\n${r.stdout}\n${r.stderr}`)
  return r.stdout
}

function project(name) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `mlx-bun-${name}-`))
  assert.ok(!dir.startsWith(ROOT))
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: `${name}-app`, version: '1.0.0', private: true }))
  for (const [file, source] of Object.entries(APPS)) fs.writeFileSync(path.join(dir, file), source)
  return dir
}

function duBytes(dir) {
  let total = 0
  for (const e of fs.readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (e.isFile()) total += fs.statSync(path.join(e.parentPath ?? e.path, e.name)).size
  }
  return total
}

test('the packed tarballs install into a fresh project with npm and with bun and generate from ESM, CJS and TypeScript', { timeout: 900_000 }, async (t) => {
  const tokenizer = mlx.loadTokenizer(MODEL)
  const prompt = tokenizer.encode(mlx.ChatTemplate.load(MODEL).render([{ role: 'user', content: QUESTION }]), false)
  const model = await mlx.loadModel(MODEL)
  const expected = (await collect(mlx.generate(model, prompt, { maxTokens: 6 }))).tokens
  model.dispose()

  const dist = fs.mkdtempSync(path.join(os.tmpdir(), 'mlx-bun-dist-'))
  const [main, platform] = execFileSync('bash', [path.join(ROOT, 'scripts', 'pack.sh'), dist], { cwd: ROOT, encoding: 'utf8' }).trim().split('\n')
  assert.match(path.basename(main), /^mlx-bun-\d+\.\d+\.\d+\.tgz$/)
  assert.equal(path.basename(platform), `mlx-bun-${TRIPLE}-${require('../package.json').version}.tgz`)

  const installs = {
    npm: (dir) => run('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error', main, platform], dir),
    bun: (dir) => run(BUN, ['add', main, platform], dir),
  }
  const dirs = []
  try {
    for (const [manager, install] of Object.entries(installs)) {
      const dir = project(manager)
      dirs.push(dir)
      install(dir)
      const pkgDir = path.join(dir, 'node_modules', PLATFORM_PACKAGE)
      assert.ok(fs.existsSync(path.join(pkgDir, `mlx-bun.${TRIPLE}.node`)), `${manager} installed ${PLATFORM_PACKAGE}`)
      if (process.platform === 'linux') {
        // The published addon finds its runtime beside itself, never in the build tree.
        const dynamic = execFileSync('readelf', ['-d', path.join(pkgDir, `mlx-bun.${TRIPLE}.node`)], { encoding: 'utf8' })
        assert.match(dynamic, /\[\$ORIGIN\/mlx\/lib\]/)
        assert.ok(!dynamic.includes(ROOT), dynamic)
      }
      const runners = manager === 'npm' ? [['node', 'app.mjs'], ['node', 'app.cjs']] : [[BUN, 'app.mjs'], [BUN, 'app.cjs'], [BUN, 'app.ts']]
      for (const [runtime, file] of runners) {
        const out = JSON.parse(run(runtime, [file], dir).trim().split('\n').pop())
        assert.deepEqual(out.tokens, expected, `${manager}: ${path.basename(runtime)} ${file}`)
        assert.ok(fs.realpathSync(out.runtime.dir).startsWith(fs.realpathSync(dir)), `${file} loaded its runtime from ${out.runtime.dir}`)
        assert.ok(!String(out.entry).includes(ROOT), `${file} resolved mlx-bun to ${out.entry}`)
      }
      const bytes = duBytes(path.join(dir, 'node_modules'))
      t.diagnostic(`${manager}: installed size ${(bytes / 2 ** 20).toFixed(1)} MiB`)
      assert.ok(bytes < 200 * 2 ** 20, `${bytes} bytes installed`)
    }

    // The CLI is wired as a bin of the installed package.
    const npmDir = dirs[0]
    assert.match(run(path.join(npmDir, 'node_modules', '.bin', 'mlx-bun'), ['--help'], npmDir), /Usage: mlx-bun/)

    // A runtime file missing, then the whole platform package: a typed error naming what is
    // missing and the package that provides it, at require time.
    const loadError = () => {
      const r = spawnSync('node', ['-e', "try { require('mlx-bun') } catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })) }"], { cwd: npmDir, env: cleanEnv(), encoding: 'utf8' })
      return JSON.parse(r.stdout)
    }
    let e
    if (process.platform === 'linux') {
      // A library libmlx needs, named by the dynamic loader.
      const libs = path.join(npmDir, 'node_modules', PLATFORM_PACKAGE, 'mlx_cpu.libs')
      const lapack = fs.readdirSync(libs).find((f) => f.startsWith('liblapack'))
      fs.rmSync(path.join(libs, lapack))
      e = loadError()
      assert.equal(e.code, 'NATIVE_RUNTIME_MISSING')
      assert.ok(e.message.includes(lapack) && e.message.includes(PLATFORM_PACKAGE), e.message)
    }
    const lib = process.platform === 'darwin' ? 'libmlx.dylib' : 'libmlx.so'
    fs.rmSync(path.join(npmDir, 'node_modules', PLATFORM_PACKAGE, 'mlx', 'lib', lib))
    e = loadError()
    assert.equal(e.code, 'NATIVE_RUNTIME_MISSING')
    assert.ok(e.message.includes(lib) && e.message.includes(PLATFORM_PACKAGE), e.message)
    fs.rmSync(path.join(npmDir, 'node_modules', PLATFORM_PACKAGE), { recursive: true })
    e = loadError()
    assert.equal(e.code, 'NATIVE_RUNTIME_MISSING')
    assert.ok(e.message.includes(PLATFORM_PACKAGE), e.message)
  } finally {
    for (const d of [dist, ...dirs]) fs.rmSync(d, { recursive: true, force: true })
  }
})
