'use strict'
// The `mlx-bun` command as users run it, on real SmolLM2: `chat` driven through piped stdin
// (greedy replies equal generate() on the same rendered conversation, later turns start from the
// prefix cache, /reset forgets), also through cli/mlx-bun.js (the addon's runCli), and through a
// pseudo-terminal (line editing, history, Ctrl-C); `generate --json` on the GGUF `mlx-bun pull`
// fetches; `--help` of every subcommand; no progress bars drawn into pipes. The chats run on the
// f32 folder written from that GGUF: on the CPU a Q4_1 prefill of a chat prompt takes seconds
// (MLX has no fast CPU kernel for quantized matmuls), the f32 one a fraction of a second.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { spawn, execFileSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

const mlx = require('..')
const { ROOT, fixture, tmpdir, cosine } = require('./helpers')

const GGUF = 'home/models/SmolLM2-135M-Instruct.Q4_1.gguf'
const MODEL = 'smollm2-f32'
const BIN = path.join(ROOT, 'target', 'release', 'mlx-bun')
const MAX_TOKENS = 10
const Q1 = 'What is the capital of France?'
const Q2 = 'And of Italy?'

/** Runs `cmd args` with `input` on stdin; resolves with its exit code, stdout and stderr. */
function run(cmd, args, input = '') {
  const child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'] })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (d) => (stdout += d))
  child.stderr.on('data', (d) => (stderr += d))
  child.stdin.end(input)
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL')
      reject(new Error(`${args.join(' ')} still running after 60 s; stderr: ${stderr}`))
    }, 60_000)
    child.on('close', (code) => {
      clearTimeout(timer)
      resolve({ code, stdout, stderr })
    })
  })
}

/** Progress drawn for a terminal (carriage returns, escape sequences) must not reach a pipe. */
function assertPlain(stderr) {
  assert.ok(!stderr.includes('\r') && !stderr.includes('\x1b['), `escape codes in stderr: ${JSON.stringify(stderr)}`)
}

/** The per-turn stats lines chat writes on stderr. */
function turnStats(stderr) {
  return [...stderr.matchAll(/^prompt: (\d+) tokens \((\d+) cached\) \| reply: (\d+) tokens, [\d.]+ tok\/s \| TTFT \d+ ms$/gm)].map((m) => ({
    prompt: Number(m[1]),
    cached: Number(m[2]),
    generated: Number(m[3]),
  }))
}

describe('mlx-bun chat and generate on SmolLM2 (real weights)', () => {
  let model, tok, template
  /** Greedy text generate() makes of `messages` rendered with the model's chat template. */
  async function reply(messages, maxTokens = MAX_TOKENS) {
    const ids = []
    for await (const t of mlx.generate(model, tok.encode(template.render(messages), false), { maxTokens, temperature: 0 })) ids.push(t.token)
    return tok.decode(ids, true)
  }

  before(async () => {
    model = await mlx.loadModel(fixture(MODEL))
    tok = mlx.loadTokenizer(fixture(MODEL))
    template = mlx.ChatTemplate.load(fixture(MODEL))
  })
  after(() => model.dispose())

  test('chat over stdin: turns equal generate() on the conversation, the prefix cache, /reset, /exit', async () => {
    const input = `${Q1}\n${Q2}\n/reset\n${Q1}\n/exit\nnever read\n`
    const args = ['chat', '--model', fixture(MODEL), '--temperature', '0', '--max-tokens', String(MAX_TOKENS)]
    const r = await run(BIN, args, input)
    assert.equal(r.code, 0, r.stderr)
    const first = await reply([{ role: 'user', content: Q1 }])
    const second = await reply([
      { role: 'user', content: Q1 },
      { role: 'assistant', content: first },
      { role: 'user', content: Q2 },
    ])
    assert.ok(first.length > 0 && second.length > 0)
    // stdout carries the replies alone, one per turn; after /reset the first turn again.
    assert.equal(r.stdout, `${first}\n${second}\n${first}\n`)
    const stats = turnStats(r.stderr)
    assert.equal(stats.length, 3, r.stderr)
    assert.equal(stats[0].cached, 0, 'the first turn of a fresh process prefills everything')
    // Turn 2 starts from the KV cache turn 1 ended with: at least its whole prompt.
    assert.ok(stats[1].cached >= stats[0].prompt, JSON.stringify(stats))
    assert.ok(stats[1].prompt > stats[0].prompt)
    assert.equal(stats[2].prompt, stats[0].prompt, 'after /reset the prompt is the first turn again')
    for (const s of stats) assert.ok(s.generated >= 1 && s.generated <= MAX_TOKENS)
    assert.match(r.stderr, /conversation reset/)
    assertPlain(r.stderr)
    // One plain line when the load starts, one when it ends.
    assert.match(r.stderr, /^mlx-bun: loading smollm2-f32 \.\.\.$/m)
    assert.match(r.stderr, /^mlx-bun: loading smollm2-f32: done in [\d.]+ s$/m)
  })

  test('chat through cli/mlx-bun.js (runCli in the addon): --system opens the conversation; end of input ends it', async () => {
    const system = 'You answer in one word.'
    const args = [path.join(ROOT, 'cli', 'mlx-bun.js'), 'chat', '--model', fixture(MODEL), '--system', system, '--temperature', '0', '--max-tokens', String(MAX_TOKENS)]
    const r = await run(process.execPath, args, `${Q1}\n`)
    assert.equal(r.code, 0, r.stderr)
    assert.equal(r.stdout, `${await reply([{ role: 'system', content: system }, { role: 'user', content: Q1 }])}\n`)
    assert.equal(turnStats(r.stderr).length, 1, r.stderr)
    assertPlain(r.stderr)
  })

  test('chat on a terminal: line editing, history, Ctrl-C stops an answer, not the chat', async () => {
    // chat-pty.py types into a pseudo-terminal: a typo mended with arrow keys and backspace, the
    // up arrow, Ctrl-U, Ctrl-C once a long answer has begun, then /exit.
    const home = tmpdir('chat-home')
    const maxTokens = 512
    const chat = [BIN, 'chat', '--model', fixture(MODEL), '--temperature', '0', '--max-tokens', String(maxTokens)]
    const r = await run('env', [`MLX_BUN_HOME=${home}`, 'python3', path.join(__dirname, 'chat-pty.py'), ...chat])
    assert.equal(r.code, 0, r.stderr)
    const { exit, transcript } = JSON.parse(r.stdout)
    assert.equal(exit, 0, transcript)
    // The mended line is the one the model answered.
    const want = await reply([{ role: 'user', content: Q1 }], maxTokens)
    assert.ok(transcript.includes(`\r\n${want.replaceAll('\n', '\r\n')}\r\nprompt: `), transcript)
    assert.match(transcript, /answer stopped; the conversation is as before it/)
    assert.equal(fs.readFileSync(path.join(home, 'chat_history'), 'utf8').split('\n').filter((l) => l && !l.startsWith('#')).join('|'), `${Q1}|Tell me a long story about a cat.|/exit`)
  })

  test('a bad flag value fails before the first message, with its code', async () => {
    const r = await run(BIN, ['chat', '--model', fixture(MODEL), '--temperature=-1'], `${Q1}\n`)
    assert.equal(r.code, 1)
    assert.match(r.stderr, /temperature.*\(INVALID_OPTION\)/)
    assert.equal(r.stdout, '')
  })

  test('generate --json on the GGUF: one object with the tokens generate() makes', async () => {
    const prompt = 'The quick brown fox'
    const r = await run(BIN, ['generate', '--model', fixture(GGUF), '--prompt', prompt, '--max-tokens', '8', '--json'])
    assert.equal(r.code, 0, r.stderr)
    const out = JSON.parse(r.stdout)
    const gguf = await mlx.loadModel(fixture(GGUF))
    const ggufTok = mlx.loadTokenizer(fixture(GGUF))
    const ids = []
    try {
      for await (const t of mlx.generate(gguf, ggufTok.encode(prompt, true), { maxTokens: 8, temperature: 0 })) ids.push(t.token)
    } finally {
      gguf.dispose()
    }
    assert.deepEqual(out.tokens, ids)
    assert.equal(out.text, ggufTok.decode(ids, true))
    assert.equal(out.finishReason, 'length')
    assert.equal(out.stats.generatedTokens, 8)
    assert.equal(out.stats.promptTokens, ggufTok.encode(prompt, true).length)
    assertPlain(r.stderr)
  })
})

test('embed: one JSON line per text, the vectors embedMany gives', async () => {
  const texts = ['The quick brown fox', 'Where is Paris?']
  const r = await run(BIN, ['embed', '--model', fixture('smollm2-f32'), '--instruction', 'Find the answer', ...texts])
  assert.equal(r.code, 0, r.stderr)
  const lines = r.stdout.trim().split('\n').map((l) => JSON.parse(l))
  const model = await mlx.loadModel(fixture('smollm2-f32'))
  try {
    const ours = await mlx.embedMany(model, mlx.loadTokenizer(fixture('smollm2-f32')), texts, 'Find the answer')
    assert.deepEqual(lines.map((l) => [l.index, l.tokens]), ours.map((o, i) => [i, o.tokens]))
    lines.forEach((l, i) => assert.ok(cosine(l.embedding, ours[i].vector) >= 0.99999, `text ${i}`))
  } finally {
    model.dispose()
  }
  assertPlain(r.stderr)
})

/** The environment `pid` was started with (what the kernel keeps from its last exec). */
const startEnv = (pid) => fs.readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0')

test("OpenBLAS's idle spin: the command runs itself with OPENBLAS_THREAD_TIMEOUT=4 unless set; the addon's loader leaves none behind and keeps a user's", { skip: process.platform !== 'linux' && 'OpenBLAS is the Linux BLAS' }, async () => {
  const env = { ...process.env }
  delete env.OPENBLAS_THREAD_TIMEOUT
  for (const [given, expected] of [[undefined, 'OPENBLAS_THREAD_TIMEOUT=4'], ['7', 'OPENBLAS_THREAD_TIMEOUT=7']]) {
    const child = spawn(BIN, ['chat', '--model', fixture(MODEL)], { env: given ? { ...env, OPENBLAS_THREAD_TIMEOUT: given } : env, stdio: ['pipe', 'ignore', 'ignore'] })
    try {
      let seen = []
      for (let i = 0; i < 100 && !seen.includes(expected); i++) {
        await new Promise((r) => setTimeout(r, 50))
        seen = startEnv(child.pid).filter((v) => v.startsWith('OPENBLAS_THREAD_TIMEOUT='))
      }
      assert.deepEqual(seen, [expected], `started with ${given ?? 'none'}`)
    } finally {
      child.kill('SIGKILL')
    }
  }
  const probe = "require('.'); process.stdout.write(String(process.env.OPENBLAS_THREAD_TIMEOUT))"
  assert.equal(execFileSync(process.execPath, ['-e', probe], { cwd: ROOT, env }).toString(), 'undefined')
  assert.equal(execFileSync(process.execPath, ['-e', probe], { cwd: ROOT, env: { ...env, OPENBLAS_THREAD_TIMEOUT: '7' } }).toString(), '7')
})

describe('mlx-bun --help', () => {
  // The flags each command must document; a command missing here is still checked below for
  // exit code 0 and a description on every option.
  const FLAGS = {
    pull: [],
    generate: ['--prompt', '--model', '--max-tokens', '--temperature', '--top-p', '--top-k', '--seed', '--chat', '--json', '--f32-matmuls'],
    chat: ['--model', '--system', '--max-tokens', '--temperature', '--top-p', '--top-k', '--seed', '--f32-matmuls'],
    bench: ['--model', '--prompt-tokens', '--gen-tokens', '--repeats', '--f32-matmuls', '--prefill-chunk-size'],
    serve: ['--model', '--id', '--host', '--port', '--api-key', '--cors-origin', '--prompt-cache-bytes', '--batch', '--max-queued', '--default-max-tokens', '--log-format', '--chat-template', '--f32-matmuls'],
    convert: ['<MODEL>', '<OUT>', '--dtype', '--q-bits', '--q-group-size'],
    fit: ['<MODEL>', '--ctx', '--kv-bits', '--skus', '--json'],
    embed: ['[TEXTS]', '--model', '--instruction', '--f32-matmuls'],
  }
  const commands = () => {
    const help = execFileSync(BIN, ['--help'], { encoding: 'utf8' })
    const section = help.split(/^Commands:$/m)[1].split(/^\S/m)[0]
    return [...section.matchAll(/^ {2}(\S+) {2,}\S/gm)].map((m) => m[1]).filter((c) => c !== 'help')
  }

  test('mlx-bun --help lists every command', () => {
    const listed = commands()
    for (const c of Object.keys(FLAGS)) assert.ok(listed.includes(c), `${c} missing from: ${listed}`)
  })

  test('every command: --help exits 0 and names its flags; -h describes every option', () => {
    for (const cmd of commands()) {
      const long = execFileSync(BIN, [cmd, '--help'], { encoding: 'utf8' })
      assert.match(long, new RegExp(`^Usage: mlx-bun ${cmd}\\b`, 'm'))
      for (const flag of FLAGS[cmd] ?? []) assert.ok(long.includes(flag), `${cmd} --help does not mention ${flag}`)
      // Short help gives each argument its description on the same line, or on the next one
      // indented further when the descriptions are long.
      const lines = execFileSync(BIN, [cmd, '-h'], { encoding: 'utf8' }).split('\n')
      const entries = lines.map((l, i) => [l, lines[i + 1] ?? '']).filter(([l]) => /^ {2}(-|<)/.test(l))
      assert.ok(entries.length >= 1, lines.join('\n'))
      for (const [l, next] of entries) assert.ok(/^ {2}\S.*? {2,}\S/.test(l) || /^ {8,}\S/.test(next), `${cmd}: no description for "${l.trim()}"`)
    }
  })
})
