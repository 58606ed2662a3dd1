'use strict'
// Engine sessions: the conformance suite of the `InferenceEngine` / `GenerationSession` contract
// (index.d.ts; mlx-bun's EngineSession rules). Most tests drive `testing.createScriptedEngine`,
// whose method replays a script of steps, so each rule is checked deterministically; the last
// group runs the same contract over a tiny random llama and compares with `generate`.
const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const path = require('node:path')
const { setTimeout: sleep } = require('node:timers/promises')

const mlx = require('..')
const { makeTinyLlama, tmpdir, collect, rng, within, eventually, range, TINY } = require('./helpers')

// ---------------------------------------------------------------------------------------------
// Helpers

const outcomeOf = (session, ms) => within(session.result, `the result of session ${session.id}`, ms)

const show = (v) => JSON.stringify(v, (_, x) => (x instanceof Uint32Array ? Array.from(x) : x))

/** An `assert.throws` / `assert.rejects` validator for a coded error. */
function hasCode(code, pattern) {
  return (e) => {
    assert.ok(e instanceof Error, `expected an Error, got ${e}`)
    assert.equal(e.code, code, `${e.code}: ${e.message}`)
    if (pattern) assert.match(e.message, pattern)
    return true
  }
}

const STATES = ['created', 'preparing', 'running', 'settling', 'terminal']

function assertCommon(o) {
  assert.ok(Number.isSafeInteger(o.committedTokens) && o.committedTokens >= 0, `committedTokens: ${show(o)}`)
}
function assertCompleted(o, committedTokens, finishReason) {
  assert.equal(o.status, 'completed', show(o))
  assertCommon(o)
  if (committedTokens !== undefined) assert.equal(o.committedTokens, committedTokens, show(o))
  if (finishReason !== undefined) assert.equal(o.result.finishReason, finishReason, show(o))
  else assert.ok(['stop', 'length'].includes(o.result.finishReason), show(o))
  assert.ok(o.result.metrics && typeof o.result.metrics === 'object', `completed outcome without result.metrics: ${show(o)}`)
}
function assertCancelled(o, reason, committedTokens) {
  assert.equal(o.status, 'cancelled', show(o))
  assert.equal(o.reason, reason, show(o))
  assertCommon(o)
  if (committedTokens !== undefined) assert.equal(o.committedTokens, committedTokens, show(o))
}
function assertFailed(o, code, messagePattern) {
  assert.equal(o.status, 'failed', show(o))
  assert.equal(o.error.code, code, show(o))
  assert.equal(typeof o.error.message, 'string')
  assert.ok(o.error.message.length > 0, show(o))
  if (messagePattern) assert.match(o.error.message, messagePattern)
  assertCommon(o)
}

const REQ = { promptTokens: [1, 2, 3] }
/** A script that never ends on its own: stream producers block on the bounded queue. */
const LONG = { steps: [{ commit: [7], repeat: 1_000_000 }] }
/** One commit step per id. */
const perStep = (ids, extra = {}) => ({ steps: ids.map((id) => ({ commit: [id] })), ...extra })

/** RunControl for `output`; `onTokens` only for callback sessions. */
const control = (output, onTokens = () => {}) => (output === 'callback' ? { output, onTokens } : { output })

const isCommitted = (ev) => ev.type === 'committed'
const tokensOf = (events) => events.filter(isCommitted).flatMap((ev) => Array.from(ev.tokenIds))
const norm = (ev) =>
  isCommitted(ev)
    ? { type: ev.type, sequence: ev.sequence, tokenIds: Array.from(ev.tokenIds) }
    : { type: ev.type, completed: ev.completed, total: ev.total }
/** A TokenLogprobs entry with absent and undefined fields alike. */
const normLp = (lp) => ({ logprob: lp.logprob, top: lp.top?.map(({ id, logprob }) => ({ id, logprob })) })

/** Reads a stream session to its end; an iteration error is returned, not thrown. */
async function readAll(session, { delayMs = 0 } = {}) {
  const events = []
  let error
  try {
    for await (const ev of session.events) {
      events.push(ev)
      if (delayMs) await sleep(typeof delayMs === 'function' ? delayMs(events.length) : delayMs)
    }
  } catch (e) {
    error = e
  }
  return { events, error, tokens: tokensOf(events), committed: events.filter(isCommitted) }
}
const drain = (session, opts) => within(readAll(session, opts), `reading session ${session.id}`)

const iteratorOf = (session) => session.events[Symbol.asyncIterator]()
const nextOf = (it, what = 'next()') => within(it.next(), what)

/** A scripted engine for the duration of `fn`; closed afterwards. */
async function withEngine(script, options, fn) {
  const engine = mlx.testing.createScriptedEngine(script, options)
  let ok = false
  try {
    const r = await fn(engine)
    ok = true
    return r
  } finally {
    const closing = within(engine.close(), 'engine.close()')
    if (ok) await closing
    else await closing.catch(() => {})
  }
}

// ---------------------------------------------------------------------------------------------

describe('sessions: start', () => {
  test('the testing hooks exist', async () => {
    assert.equal(typeof mlx.createEngine, 'function')
    assert.equal(typeof mlx.testing.createScriptedEngine, 'function')
    assert.equal(typeof mlx.testing.liveSessions, 'function')
    assert.ok(Number.isSafeInteger(mlx.testing.liveSessions()))
  })

  test('a collect session starts at once: its result settles with nobody reading', async () => {
    await withEngine({ steps: [{ commit: [1, 2] }, { commit: [3] }] }, {}, async (engine) => {
      const s = engine.open(REQ, { output: 'collect' })
      assert.ok(STATES.includes(s.state), s.state)
      const o = await outcomeOf(s)
      assertCompleted(o, 3, 'length')
      assert.deepEqual(Array.from(o.output), [1, 2, 3])
      assert.equal(s.state, 'terminal')
    })
  })

  test('a callback session starts at once: onTokens runs with nobody reading', async () => {
    await withEngine({ steps: [{ commit: [1, 2] }, { commit: [3] }] }, {}, async (engine) => {
      const got = []
      const s = engine.open(REQ, { output: 'callback', onTokens: (ids) => void got.push(...Array.from(ids)) })
      const o = await outcomeOf(s)
      assertCompleted(o, 3)
      assert.deepEqual(got, [1, 2, 3])
      assert.equal(s.state, 'terminal')
    })
  })

  test('a stream session (the default output) does not start before the first next()', async () => {
    await withEngine({ steps: [{ commit: [1, 2] }] }, {}, async (engine) => {
      for (const ctl of [undefined, {}, { output: 'stream' }]) {
        const s = engine.open(REQ, ctl)
        let settled = false
        s.result.then(() => {
          settled = true
        })
        await sleep(100)
        assert.equal(s.state, 'created', `control ${show(ctl)}`)
        assert.equal(settled, false)
        assert.equal(engine.stats.running, 0)
        assert.equal(engine.stats.liveSessions, 1)
        const { tokens, error } = await drain(s)
        assert.equal(error, undefined)
        assert.deepEqual(tokens, [1, 2])
        assertCompleted(await outcomeOf(s), 2, 'length')
        assert.equal(s.state, 'terminal')
      }
    })
  })

  test('an unread stream session ends as consumer_idle with 0 committed tokens', async () => {
    await withEngine({ steps: [{ commit: [1, 2] }] }, { idleTimeoutMs: 100 }, async (engine) => {
      const t0 = Date.now()
      const s = engine.open(REQ)
      const o = await outcomeOf(s, 5000)
      assertCancelled(o, 'consumer_idle', 0)
      assert.ok(Date.now() - t0 >= 80, `idle after ${Date.now() - t0} ms, timeout is 100 ms`)
      assert.equal(s.state, 'terminal')
    })
  })
})

describe('sessions: cancel and close', () => {
  test('cancel() on a never-started session: cancelled, 0 tokens, and cancel() resolves after result', async () => {
    await withEngine({ steps: [{ commit: [1] }] }, {}, async (engine) => {
      const s = engine.open(REQ)
      const order = []
      s.result.then(() => order.push('result'))
      await within(s.cancel().then(() => order.push('cancel')), 'cancel()')
      assert.deepEqual(order, ['result', 'cancel'])
      assertCancelled(await outcomeOf(s), 'requested', 0)
      assert.equal(s.state, 'terminal')
    })
  })

  test('cancel() on a running stream session resolves after result and drops queued events', async () => {
    await withEngine(LONG, {}, async (engine) => {
      const s = engine.open(REQ)
      const it = iteratorOf(s)
      const first = await nextOf(it)
      assert.equal(first.done, false)
      assert.equal(first.value.type, 'committed')
      await sleep(20) // the producer fills the queue
      assert.equal(s.state, 'running')
      const order = []
      s.result.then(() => order.push('result'))
      await within(s.cancel().then(() => order.push('cancel')), 'cancel()')
      assert.deepEqual(order, ['result', 'cancel'])
      // Queued events are gone: the iteration is over.
      assert.equal((await nextOf(it)).done, true)
      const o = await outcomeOf(s)
      assertCancelled(o, 'requested')
      assert.ok(o.committedTokens >= 1, show(o))
    })
  })

  test('each cancel reason passed to cancel() ends up in the outcome', async () => {
    await withEngine({ steps: [{ commit: [1] }] }, {}, async (engine) => {
      for (const reason of ['requested', 'consumer_closed', 'consumer_idle', 'engine_closed']) {
        const s = engine.open(REQ)
        await within(s.cancel(reason), `cancel(${reason})`)
        assertCancelled(await outcomeOf(s), reason, 0)
      }
    })
  })

  test('close() is cancel("consumer_closed"), on a never-started and on a running session', async () => {
    await withEngine(LONG, {}, async (engine) => {
      const idle = engine.open(REQ)
      await within(idle.close(), 'close()')
      assertCancelled(await outcomeOf(idle), 'consumer_closed', 0)

      const running = engine.open(REQ)
      const it = iteratorOf(running)
      await nextOf(it)
      let settled = false
      running.result.then(() => {
        settled = true
      })
      await within(running.close(), 'close()')
      assert.equal(settled, true, 'close() resolved before result')
      const o = await outcomeOf(running)
      assertCancelled(o, 'consumer_closed')
      assert.ok(o.committedTokens >= 1)
    })
  })

  test('the first cancel reason wins', async () => {
    await withEngine(LONG, {}, async (engine) => {
      const s = engine.open(REQ)
      const it = iteratorOf(s)
      await nextOf(it)
      const a = s.cancel('requested')
      const b = s.close()
      await within(Promise.all([a, b]), 'cancel() and close()')
      assertCancelled(await outcomeOf(s), 'requested')
    })
  })

  test('cancel() and close() on a terminal session resolve and change nothing', async () => {
    await withEngine({ steps: [{ commit: [4, 5] }] }, {}, async (engine) => {
      const s = engine.open(REQ, { output: 'collect' })
      const o = await outcomeOf(s)
      assertCompleted(o, 2)
      await within(s.cancel(), 'cancel()')
      await within(s.close(), 'close()')
      await within(s.cancel('engine_closed'), 'cancel(engine_closed)')
      const again = await outcomeOf(s)
      assert.equal(again.status, 'completed')
      assert.deepEqual(Array.from(again.output), [4, 5])
    })
  })
})

describe('sessions: cancel reasons', () => {
  test('consumer_closed: breaking out of for-await closes the session', async () => {
    await withEngine(LONG, {}, async (engine) => {
      const s = engine.open(REQ)
      let n = 0
      await within(
        (async () => {
          for await (const ev of s.events) if (isCommitted(ev) && ++n === 3) break
        })(),
        'for-await with break',
      )
      assert.equal(n, 3)
      const o = await outcomeOf(s)
      assertCancelled(o, 'consumer_closed')
      assert.ok(o.committedTokens >= 3 && o.committedTokens < 1_000_000, show(o))
      assert.equal(s.state, 'terminal')
    })
  })

  test('consumer_closed: iterator return() closes the session and resolves done', async () => {
    await withEngine(LONG, {}, async (engine) => {
      const s = engine.open(REQ)
      const it = iteratorOf(s)
      await nextOf(it)
      const r = await within(it.return(), 'return()')
      assert.equal(r.done, true)
      assertCancelled(await outcomeOf(s), 'consumer_closed')
      assert.equal((await nextOf(it)).done, true)
    })
  })

  test('consumer_idle: a consumer that reads one event and stalls (producer blocked on maxQueuedEvents)', async () => {
    const maxQueuedEvents = 2
    await withEngine(LONG, { idleTimeoutMs: 100, maxQueuedEvents }, async (engine) => {
      const s = engine.open(REQ)
      const it = iteratorOf(s)
      const first = await nextOf(it)
      assert.equal(first.value.type, 'committed')
      const o = await outcomeOf(s, 5000)
      assertCancelled(o, 'consumer_idle')
      // One token read plus at most the bounded queue (one event of slack for a commit in flight).
      assert.ok(o.committedTokens >= 1 && o.committedTokens <= 1 + maxQueuedEvents + 1, show(o))
    })
  })

  test('consumer_idle: a producer blocked on maxQueuedTokens is cancelled when the consumer stalls', async () => {
    await withEngine({ steps: [{ commit: [1, 2, 3], repeat: 100_000 }] }, { idleTimeoutMs: 100, maxQueuedTokens: 3 }, async (engine) => {
      const s = engine.open(REQ)
      const it = iteratorOf(s)
      const first = await nextOf(it)
      assert.deepEqual(Array.from(first.value.tokenIds), [1, 2, 3])
      const o = await outcomeOf(s, 5000)
      assertCancelled(o, 'consumer_idle')
      assert.ok(o.committedTokens >= 3 && o.committedTokens <= 3 + 3 + 3, show(o))
    })
  })

  test('consumer_idle does not hit a consumer that keeps reading (each next() re-arms the timer)', async () => {
    await withEngine(LONG, { idleTimeoutMs: 100 }, async (engine) => {
      const s = engine.open(REQ)
      const it = iteratorOf(s)
      const t0 = Date.now()
      let n = 0
      while (Date.now() - t0 < 400) {
        const r = await nextOf(it)
        if (r.done) assert.fail(`the session ended after ${n} events: ${show(await s.result)}`)
        n++
        await sleep(30) // well under the idle timeout
      }
      assert.notEqual(s.state, 'terminal')
      await within(s.close(), 'close()')
      assertCancelled(await outcomeOf(s), 'consumer_closed')
    })
  })

  test('consumer_idle does not hit a pending next() (waiting for admission)', async () => {
    await withEngine(LONG, { idleTimeoutMs: 150, maxActive: 1 }, async (engine) => {
      const a = engine.open(REQ)
      const itA = iteratorOf(a)
      await nextOf(itA)
      const b = engine.open(REQ)
      const pB = iteratorOf(b).next() // no lease yet: stays pending while A runs
      const t0 = Date.now()
      while (Date.now() - t0 < 500) {
        const r = await nextOf(itA) // A keeps reading, so A keeps its lease
        assert.equal(r.done, false)
      }
      if (b.state === 'terminal') assert.fail(`B ended while its next() was pending: ${show(await b.result)}`)
      await within(a.close(), 'A close()')
      const rb = await within(pB, "B's pending next()")
      assert.equal(rb.done, false)
      assert.equal(rb.value.type, 'committed')
      await within(b.close(), 'B close()')
      assertCancelled(await outcomeOf(b), 'consumer_closed')
    })
  })

  test('requested: aborting the AbortSignal cancels a running session', async () => {
    await withEngine(LONG, {}, async (engine) => {
      const ac = new AbortController()
      const s = engine.open(REQ, { signal: ac.signal })
      const it = iteratorOf(s)
      await nextOf(it)
      ac.abort()
      const o = await outcomeOf(s)
      assertCancelled(o, 'requested')
      assert.ok(o.committedTokens >= 1)
    })
  })

  test('requested: an already-aborted signal cancels before anything runs', async () => {
    await withEngine({ steps: [{ commit: [1, 2] }] }, {}, async (engine) => {
      for (const output of ['collect', 'callback', 'stream']) {
        const ac = new AbortController()
        ac.abort()
        let calls = 0
        const s = engine.open(REQ, { ...control(output, () => void calls++), signal: ac.signal })
        const o = await outcomeOf(s)
        assertCancelled(o, 'requested', 0)
        assert.equal(calls, 0)
        if (output === 'stream') assert.equal((await nextOf(iteratorOf(s))).done, true)
      }
    })
  })

  test('aborting after a session ended changes nothing', async () => {
    await withEngine({ steps: [{ commit: [1, 2] }] }, {}, async (engine) => {
      const ac = new AbortController()
      const s = engine.open(REQ, { output: 'collect', signal: ac.signal })
      assertCompleted(await outcomeOf(s), 2)
      ac.abort()
      await sleep(10)
      assertCompleted(await outcomeOf(s), 2)
    })
  })
})

describe('sessions: the events iterator', () => {
  test('getting the iterator of a collect or callback session throws NOT_A_STREAM', async () => {
    await withEngine({ steps: [{ commit: [1, 2] }] }, {}, async (engine) => {
      const c = engine.open(REQ, { output: 'collect' })
      assert.throws(() => c.events[Symbol.asyncIterator](), hasCode('NOT_A_STREAM'))
      const k = engine.open(REQ, { output: 'callback', onTokens: () => {} })
      assert.throws(() => k.events[Symbol.asyncIterator](), hasCode('NOT_A_STREAM'))
      // The sessions themselves are unaffected.
      assertCompleted(await outcomeOf(c), 2)
      assertCompleted(await outcomeOf(k), 2)
    })
  })

  test('a second iterator throws ALREADY_CONSUMED (before, during and after the first is read)', async () => {
    await withEngine({ steps: [{ commit: [1] }, { commit: [2] }] }, {}, async (engine) => {
      const s = engine.open(REQ)
      assert.equal(typeof s.events[Symbol.asyncIterator], 'function')
      const it = iteratorOf(s)
      assert.throws(() => s.events[Symbol.asyncIterator](), hasCode('ALREADY_CONSUMED'))
      await nextOf(it)
      assert.throws(() => s.events[Symbol.asyncIterator](), hasCode('ALREADY_CONSUMED'))
      while (!(await nextOf(it)).done);
      assert.throws(() => s.events[Symbol.asyncIterator](), hasCode('ALREADY_CONSUMED'))
      assertCompleted(await outcomeOf(s), 2)
    })
  })

  test('overlapping next() calls: the second rejects with CONCURRENT_NEXT, the first still resolves', async () => {
    await withEngine({ steps: [{ commit: [1] }, { commit: [2] }] }, {}, async (engine) => {
      const s = engine.open(REQ)
      const it = iteratorOf(s)
      const first = it.next()
      await assert.rejects(() => it.next(), hasCode('CONCURRENT_NEXT'))
      const r = await within(first, 'first next()')
      assert.equal(r.done, false)
      assert.deepEqual(Array.from(r.value.tokenIds), [1])
      // Reading goes on normally afterwards.
      const rest = []
      for (let x; !(x = await nextOf(it)).done; ) rest.push(...tokensOf([x.value]))
      assert.deepEqual(rest, [2])
      assertCompleted(await outcomeOf(s), 2)
    })
  })

  test('iterator throw(err) closes the session and rethrows err', async () => {
    await withEngine(LONG, {}, async (engine) => {
      const s = engine.open(REQ)
      const it = iteratorOf(s)
      await nextOf(it)
      const err = new Error('consumer gave up')
      await within(
        assert.rejects(() => it.throw(err), (e) => e === err),
        'throw()',
      )
      assertCancelled(await outcomeOf(s), 'consumer_closed')
      assert.equal((await nextOf(it)).done, true)
    })
  })

  test('next() after the end keeps returning done', async () => {
    await withEngine({ steps: [{ commit: [1] }] }, {}, async (engine) => {
      const s = engine.open(REQ)
      const it = iteratorOf(s)
      assert.equal((await nextOf(it)).done, false)
      assert.equal((await nextOf(it)).done, true)
      assert.equal((await nextOf(it)).done, true)
      assertCompleted(await outcomeOf(s), 1)
    })
  })
})

describe('sessions: execution and outcomes', () => {
  for (const outputTokenLimit of [-1, 1.5]) {
    for (const output of ['collect', 'stream']) {
      test(`an outputTokenLimit of ${outputTokenLimit} fails the ${output} session (execution_failed)`, async () => {
        await withEngine({ steps: [{ commit: [1] }], outputTokenLimit }, {}, async (engine) => {
          const s = engine.open(REQ, { output })
          if (output === 'stream') {
            const { tokens, error } = await drain(s)
            assert.equal(error, undefined)
            assert.deepEqual(tokens, [])
          }
          const o = await outcomeOf(s)
          assertFailed(o, 'execution_failed')
          assert.equal(o.committedTokens, 0)
        })
      })
    }
  }

  test('outputTokenLimit 0 with nothing to commit completes with 0 tokens', async () => {
    await withEngine({ steps: [], outputTokenLimit: 0, finishReason: 'stop' }, {}, async (engine) => {
      const o = await outcomeOf(engine.open(REQ, { output: 'collect' }))
      assertCompleted(o, 0, 'stop')
      assert.equal(o.output.length, 0)
    })
  })

  test('committing more than outputTokenLimit fails; tokens committed before count', async () => {
    await withEngine({ steps: [{ commit: [1, 2] }, { commit: [3, 4] }], outputTokenLimit: 3 }, {}, async (engine) => {
      for (const output of ['collect', 'stream', 'callback']) {
        const got = []
        const s = engine.open(REQ, control(output, (ids) => void got.push(...Array.from(ids))))
        if (output === 'stream') got.push(...(await drain(s)).tokens)
        const o = await outcomeOf(s)
        assertFailed(o, 'execution_failed')
        assert.equal(o.committedTokens, 2, `${output}: ${show(o)}`)
        assert.deepEqual(got.length ? got : Array.from(o.output), [1, 2])
      }
    })
  })

  test('a failing method step: failed execution_failed with its message; committedTokens counts earlier tokens', async () => {
    await withEngine({ steps: [{ commit: [1, 2] }, { commit: [3] }, { fail: 'scripted boom' }, { commit: [4] }] }, {}, async (engine) => {
      const c = await outcomeOf(engine.open(REQ, { output: 'collect' }))
      assertFailed(c, 'execution_failed', /scripted boom/)
      assert.equal(c.committedTokens, 3)
      assert.deepEqual(Array.from(c.output), [1, 2, 3])
      const got = []
      const k = await outcomeOf(engine.open(REQ, { output: 'callback', onTokens: (ids) => void got.push(...Array.from(ids)) }))
      assertFailed(k, 'execution_failed', /scripted boom/)
      assert.equal(k.committedTokens, 3)
      assert.deepEqual(got, [1, 2, 3])
    })
  })

  test('a failed stream session still delivers its queued events, then its iteration ends without throwing', async () => {
    await withEngine({ steps: [{ commit: [1, 2] }, { commit: [3] }, { fail: 'scripted boom' }] }, {}, async (engine) => {
      const s = engine.open(REQ)
      const { tokens, error } = await drain(s)
      assert.equal(error, undefined, `iteration threw ${error}`)
      assert.deepEqual(tokens, [1, 2, 3])
      const o = await outcomeOf(s)
      assertFailed(o, 'execution_failed', /scripted boom/)
      assert.equal(o.committedTokens, 3)
    })
  })

  test('cleanupError on a run that completed: failed cleanup_failed with cleanupError', async () => {
    await withEngine({ steps: [{ commit: [1, 2] }], cleanupError: 'close exploded' }, {}, async (engine) => {
      const o = await outcomeOf(engine.open(REQ, { output: 'collect' }))
      assertFailed(o, 'cleanup_failed')
      assert.match(o.error.cleanupError, /close exploded/)
      assert.equal(o.committedTokens, 2)
      assert.deepEqual(Array.from(o.output), [1, 2])
    })
  })

  test('cleanupError on a run that failed: cleanup_failed keeps the execution message', async () => {
    await withEngine({ steps: [{ commit: [1] }, { fail: 'scripted boom' }], cleanupError: 'close exploded' }, {}, async (engine) => {
      const o = await outcomeOf(engine.open(REQ, { output: 'collect' }))
      assertFailed(o, 'cleanup_failed', /scripted boom/)
      assert.match(o.error.cleanupError, /close exploded/)
      assert.equal(o.committedTokens, 1)
    })
  })

  test('cleanupError on a cancelled running session: failed cleanup_failed beats cancelled; close() still resolves', async () => {
    await withEngine({ ...LONG, cleanupError: 'close exploded' }, {}, async (engine) => {
      const s = engine.open(REQ)
      await nextOf(iteratorOf(s))
      await within(s.close(), 'close()')
      const o = await outcomeOf(s)
      assertFailed(o, 'cleanup_failed')
      assert.match(o.error.cleanupError, /close exploded/)
      assert.ok(o.committedTokens >= 1)
    })
  })

  test('cleanupError on a never-started session: nothing ran, so it is plain cancelled', async () => {
    await withEngine({ ...LONG, cleanupError: 'close exploded' }, {}, async (engine) => {
      const s = engine.open(REQ)
      await within(s.cancel(), 'cancel()')
      assertCancelled(await outcomeOf(s), 'requested', 0)
    })
  })

  test('cancelled beats failed: a session cancelled while its method fails ends cancelled', async () => {
    await withEngine({ steps: [{ commit: [1] }, { commit: [2] }] }, {}, async (engine) => {
      let s
      s = engine.open(REQ, {
        output: 'callback',
        onTokens: () => {
          s.cancel().catch(() => {})
          throw new Error('callback failed after cancel')
        },
      })
      assertCancelled(await outcomeOf(s), 'requested')
    })
  })

  test("finishReason comes from the method: 'stop' and 'length'", async () => {
    for (const finishReason of ['stop', 'length']) {
      await withEngine({ steps: [{ commit: [1, 2] }], finishReason }, {}, async (engine) => {
        assertCompleted(await outcomeOf(engine.open(REQ, { output: 'collect' })), 2, finishReason)
        const s = engine.open(REQ)
        await drain(s)
        assertCompleted(await outcomeOf(s), 2, finishReason)
      })
    }
  })

  test('session ids are non-empty, unique strings; every state is a SessionState; all end terminal', async () => {
    await withEngine({ steps: [{ commit: [1] }] }, {}, async (engine) => {
      const sessions = []
      for (let i = 0; i < 40; i++) {
        const output = ['stream', 'collect', 'callback'][i % 3]
        sessions.push(engine.open(REQ, control(output)))
      }
      const ids = sessions.map((s) => s.id)
      for (const id of ids) assert.ok(typeof id === 'string' && id.length > 0, `id ${show(id)}`)
      assert.equal(new Set(ids).size, ids.length)
      for (const s of sessions) assert.ok(STATES.includes(s.state), s.state)
      for (const s of sessions) if (s.state === 'created') await s.cancel()
      await within(Promise.all(sessions.map((s) => s.result)), 'all results')
      for (const s of sessions) assert.equal(s.state, 'terminal')
      assert.equal(engine.stats.liveSessions, 0)
      assert.equal(engine.stats.running, 0)
    })
  })
})

describe('sessions: publication checks', () => {
  const top = (n) => Array.from({ length: n }, (_, i) => ({ id: i, logprob: -(i + 1) / 4 }))

  test('logprobs whose length differs from the committed ids fail the session', async () => {
    for (const logprobs of [[{ logprob: -0.5 }], [{ logprob: -0.5 }, { logprob: -1 }, { logprob: -2 }]]) {
      await withEngine({ steps: [{ commit: [1, 2], logprobs }] }, {}, async (engine) => {
        const s = engine.open(REQ)
        const { tokens } = await drain(s)
        assert.deepEqual(tokens, [])
        const o = await outcomeOf(s)
        assertFailed(o, 'execution_failed')
        assert.equal(o.committedTokens, 0)
      })
    }
  })

  test('top logprobs longer than maxTopLogprobs fail the session; exactly maxTopLogprobs is fine', async () => {
    await withEngine({ steps: [{ commit: [1], logprobs: [{ logprob: -0.25, top: top(3) }] }] }, { maxTopLogprobs: 3 }, async (engine) => {
      const s = engine.open(REQ)
      const { committed } = await drain(s)
      assertCompleted(await outcomeOf(s), 1)
      assert.deepEqual(committed[0].logprobs.map(normLp), [{ logprob: -0.25, top: top(3) }])
    })
    await withEngine({ steps: [{ commit: [1], logprobs: [{ logprob: -0.25, top: top(4) }] }] }, { maxTopLogprobs: 3 }, async (engine) => {
      const s = engine.open(REQ)
      const { tokens } = await drain(s)
      assert.deepEqual(tokens, [])
      assertFailed(await outcomeOf(s), 'execution_failed')
    })
  })
})

describe('sessions: collect mode', () => {
  test('result.output is a Uint32Array of exactly the committed tokens', async () => {
    await withEngine({ steps: [{ commit: [5, 6, 7] }, { commit: [8] }, { commit: [0xffffffff] }], outputTokenLimit: 10 }, {}, async (engine) => {
      const o = await outcomeOf(engine.open(REQ, { output: 'collect' }))
      assertCompleted(o, 5)
      assert.ok(o.output instanceof Uint32Array, `output is ${Object.prototype.toString.call(o.output)}`)
      assert.equal(o.output.length, 5)
      assert.deepEqual(Array.from(o.output), [5, 6, 7, 8, 0xffffffff])
    })
  })

  test('stream and callback sessions have no output', async () => {
    await withEngine({ steps: [{ commit: [1] }] }, {}, async (engine) => {
      const s = engine.open(REQ)
      await drain(s)
      assert.equal((await outcomeOf(s)).output, undefined)
      assert.equal((await outcomeOf(engine.open(REQ, { output: 'callback', onTokens: () => {} }))).output, undefined)
    })
  })

  test('logprobs are rejected in collect mode (execution_failed)', async () => {
    await withEngine({ steps: [{ commit: [1, 2], logprobs: [{ logprob: -0.5 }, { logprob: -1 }] }] }, {}, async (engine) => {
      const o = await outcomeOf(engine.open(REQ, { output: 'collect' }))
      assertFailed(o, 'execution_failed')
      assert.equal(o.committedTokens, 0)
    })
  })

  test('a collect session needing more than maxCollectTokens fails; exactly maxCollectTokens completes', async () => {
    await withEngine(perStep(range(0, 11)), { maxCollectTokens: 10 }, async (engine) => {
      const o = await outcomeOf(engine.open(REQ, { output: 'collect' }))
      assertFailed(o, 'execution_failed')
      assert.equal(o.committedTokens, 0)
      // Stream and callback sessions reserve nothing.
      const s = engine.open(REQ)
      assert.deepEqual((await drain(s)).tokens, range(0, 11))
      assertCompleted(await outcomeOf(s), 11)
    })
    await withEngine(perStep(range(0, 10)), { maxCollectTokens: 10 }, async (engine) => {
      assertCompleted(await outcomeOf(engine.open(REQ, { output: 'collect' })), 10)
    })
  })

  test('collect reservations are released: back-to-back sessions each reserving the whole budget complete', async () => {
    await withEngine(perStep(range(0, 10)), { maxCollectTokens: 10 }, async (engine) => {
      for (let i = 0; i < 5; i++) {
        const o = await outcomeOf(engine.open(REQ, { output: 'collect' }))
        assertCompleted(o, 10)
        assert.deepEqual(Array.from(o.output), range(0, 10))
      }
      assert.equal(engine.stats.reservedCollectTokens, 0)
    })
  })
})

describe('sessions: callback mode', () => {
  test('onTokens receives every committed token, with logprobs when there are some', async () => {
    const lp = (x) => ({ logprob: x })
    const script = { steps: [{ commit: [1, 2], logprobs: [lp(-0.5), lp(-1)] }, { commit: [3], logprobs: [lp(-2)] }, { commit: [4, 5, 6], logprobs: [lp(-0.25), lp(-0.5), lp(-1)] }] }
    await withEngine(script, {}, async (engine) => {
      const ids = []
      const lps = []
      const o = await outcomeOf(
        engine.open(REQ, {
          output: 'callback',
          onTokens: (batch, logprobs) => {
            assert.ok(batch.length > 0)
            ids.push(...Array.from(batch))
            assert.equal(logprobs?.length, batch.length)
            lps.push(...logprobs.map((x) => x.logprob))
          },
        }),
      )
      assertCompleted(o, 6)
      assert.deepEqual(ids, [1, 2, 3, 4, 5, 6])
      assert.deepEqual(lps, [-0.5, -1, -2, -0.25, -0.5, -1])
    })
  })

  test('onTokens is awaited: batches never overlap and arrive in order', async () => {
    await withEngine(perStep(range(0, 20)), {}, async (engine) => {
      let inFlight = 0
      let maxInFlight = 0
      const ids = []
      const o = await outcomeOf(
        engine.open(REQ, {
          output: 'callback',
          onTokens: async (batch) => {
            maxInFlight = Math.max(maxInFlight, ++inFlight)
            await sleep(2)
            ids.push(...Array.from(batch))
            inFlight--
          },
        }),
      )
      assertCompleted(o, 20)
      assert.equal(maxInFlight, 1)
      assert.deepEqual(ids, range(0, 20))
    })
  })

  for (const [name, stop] of [
    ['returning false', () => false],
    ['resolving to false', async () => false],
  ]) {
    test(`onTokens ${name} stops output: completed with the tokens delivered so far`, async () => {
      const total = 2000
      await withEngine({ steps: [{ commit: [1, 2], repeat: total / 2 }] }, {}, async (engine) => {
        const batches = []
        const o = await outcomeOf(
          engine.open(REQ, {
            output: 'callback',
            onTokens: (batch) => {
              batches.push(Array.from(batch))
              return stop()
            },
          }),
        )
        await sleep(20)
        assert.equal(batches.length, 1, 'onTokens was called after it returned false')
        assertCompleted(o, batches[0].length)
        assert.ok(o.committedTokens < total, show(o))
      })
    })
  }

  for (const [name, onTokens] of [
    ['throwing', () => {
      throw new Error('callback boom')
    }],
    ['rejecting', async () => {
      throw new Error('callback boom')
    }],
  ]) {
    test(`onTokens ${name} fails the session with its message`, async () => {
      await withEngine({ steps: [{ commit: [1] }, { commit: [2] }] }, {}, async (engine) => {
        const o = await outcomeOf(engine.open(REQ, { output: 'callback', onTokens }))
        assertFailed(o, 'execution_failed', /callback boom/)
      })
    })
  }
})

describe('sessions: stream mode', () => {
  test('a commit larger than maxQueuedTokens arrives in chunks (4, 4, 2) with sequence 0, 1, 2', async () => {
    await withEngine({ steps: [{ commit: range(0, 10) }] }, { maxQueuedTokens: 4 }, async (engine) => {
      const s = engine.open(REQ)
      const { events } = await drain(s)
      assert.deepEqual(events.map(norm), [
        { type: 'committed', sequence: 0, tokenIds: [0, 1, 2, 3] },
        { type: 'committed', sequence: 1, tokenIds: [4, 5, 6, 7] },
        { type: 'committed', sequence: 2, tokenIds: [8, 9] },
      ])
      for (const ev of events) {
        assert.ok(Array.isArray(ev.tokenIds))
        assert.equal(ev.logprobs, undefined)
      }
      assertCompleted(await outcomeOf(s), 10)
    })
  })

  test('logprobs are chunked along with their tokens', async () => {
    const logprobs = range(1, 11).map((i) => ({ logprob: -i / 4, top: [{ id: i, logprob: -i / 4 }] }))
    await withEngine({ steps: [{ commit: range(0, 10), logprobs }] }, { maxQueuedTokens: 4 }, async (engine) => {
      const s = engine.open(REQ)
      const { committed } = await drain(s)
      assert.deepEqual(committed.map((ev) => ev.tokenIds.length), [4, 4, 2])
      for (const ev of committed) assert.equal(ev.logprobs.length, ev.tokenIds.length)
      assert.deepEqual(committed.flatMap((ev) => ev.logprobs.map(normLp)), logprobs)
      assertCompleted(await outcomeOf(s), 10)
    })
  })

  test('sequence counts committed events only; progress events interleave in order', async () => {
    const script = {
      steps: [
        { progress: { completed: 0, total: 4 } },
        { commit: [1, 2] },
        { progress: { completed: 2, total: 4 } },
        { commit: [3] },
        { progress: { completed: 4 } },
        { commit: [4] },
      ],
    }
    await withEngine(script, {}, async (engine) => {
      const s = engine.open(REQ)
      const { events } = await drain(s)
      assert.deepEqual(events.map(norm), [
        { type: 'progress', completed: 0, total: 4 },
        { type: 'committed', sequence: 0, tokenIds: [1, 2] },
        { type: 'progress', completed: 2, total: 4 },
        { type: 'committed', sequence: 1, tokenIds: [3] },
        { type: 'progress', completed: 4, total: undefined },
        { type: 'committed', sequence: 2, tokenIds: [4] },
      ])
      assertCompleted(await outcomeOf(s), 4)
    })
  })

  test('backpressure: a slow consumer with maxQueuedEvents 2 still gets every token, in order', { timeout: 30_000 }, async () => {
    await withEngine(perStep(range(0, 100)), { maxQueuedEvents: 2 }, async (engine) => {
      const s = engine.open(REQ)
      const { committed, tokens, error } = await drain(s, { delayMs: (n) => (n % 7 === 0 ? 10 : 1) })
      assert.equal(error, undefined)
      assert.deepEqual(tokens, range(0, 100))
      assert.deepEqual(committed.map((ev) => ev.sequence), range(0, 100))
      assertCompleted(await outcomeOf(s), 100)
    })
  })

  test('backpressure: the producer stops at maxQueuedEvents beyond what the consumer read', async () => {
    const maxQueuedEvents = 2
    await withEngine(perStep(range(0, 100)), { maxQueuedEvents }, async (engine) => {
      const s = engine.open(REQ)
      const it = iteratorOf(s)
      const got = []
      for (let i = 0; i < 10; i++) got.push(...tokensOf([(await nextOf(it)).value]))
      assert.deepEqual(got, range(0, 10))
      await sleep(100) // time for the producer to fill the queue, and no more
      assert.equal(s.state, 'running')
      await within(s.close(), 'close()')
      const o = await outcomeOf(s)
      assertCancelled(o, 'consumer_closed')
      // One event of slack for a commit in flight when the queue filled.
      assert.ok(o.committedTokens >= 10 && o.committedTokens <= 10 + maxQueuedEvents + 1, show(o))
    })
  })

  test('backpressure: the producer stops at maxQueuedTokens beyond what the consumer read', async () => {
    const maxQueuedTokens = 3
    await withEngine(perStep(range(0, 100)), { maxQueuedTokens }, async (engine) => {
      const s = engine.open(REQ)
      const it = iteratorOf(s)
      for (let i = 0; i < 10; i++) assert.equal((await nextOf(it)).done, false)
      await sleep(100)
      await within(s.close(), 'close()')
      const o = await outcomeOf(s)
      assertCancelled(o, 'consumer_closed')
      assert.ok(o.committedTokens >= 10 && o.committedTokens <= 10 + maxQueuedTokens + 1, show(o))
    })
  })

  test("events carry copies: mutating one event's arrays changes no other event", async () => {
    const logprobs = [{ logprob: -0.5, top: [{ id: 7, logprob: -0.5 }] }, { logprob: -1 }]
    await withEngine({ steps: [{ commit: [7, 8], logprobs, repeat: 3 }] }, {}, async (engine) => {
      const s = engine.open(REQ)
      const it = iteratorOf(s)
      const first = (await nextOf(it)).value
      first.tokenIds[0] = 999
      first.tokenIds.push(1000)
      first.logprobs[0].top[0].id = 999
      first.logprobs[0].logprob = 1
      first.logprobs.push({ logprob: 3 })
      const rest = []
      for (let r; !(r = await nextOf(it)).done; ) rest.push(r.value)
      assert.equal(rest.length, 2)
      for (const ev of rest) {
        assert.deepEqual(Array.from(ev.tokenIds), [7, 8])
        assert.deepEqual(ev.logprobs.map(normLp), logprobs.map(normLp))
      }
      assertCompleted(await outcomeOf(s), 6)
    })
  })
})

describe('sessions: progress', () => {
  test('progress is delivered in stream mode only (collect and callback see tokens alone)', async () => {
    const script = { steps: [{ progress: { completed: 0, total: 2 } }, { commit: [1, 2] }, { progress: { completed: 2, total: 2 } }, { commit: [3] }] }
    await withEngine(script, {}, async (engine) => {
      const s = engine.open(REQ)
      const { events } = await drain(s)
      assert.equal(events.filter((ev) => ev.type === 'progress').length, 2)
      assertCompleted(await outcomeOf(s), 3)

      const got = []
      const k = await outcomeOf(engine.open(REQ, { output: 'callback', onTokens: (ids) => void got.push(...Array.from(ids)) }))
      assertCompleted(k, 3)
      assert.deepEqual(got, [1, 2, 3])

      const c = await outcomeOf(engine.open(REQ, { output: 'collect' }))
      assertCompleted(c, 3)
      assert.deepEqual(Array.from(c.output), [1, 2, 3])
    })
  })

  for (const [name, progress] of [
    ['negative completed', { completed: -1 }],
    ['NaN completed', { completed: NaN }],
    ['total below completed', { completed: 5, total: 3 }],
  ]) {
    test(`invalid progress (${name}) fails the session in every output mode`, async () => {
      await withEngine({ steps: [{ commit: [1] }, { progress }, { commit: [2] }] }, {}, async (engine) => {
        for (const output of ['stream', 'collect', 'callback']) {
          const s = engine.open(REQ, control(output))
          if (output === 'stream') assert.deepEqual((await drain(s)).tokens, [1])
          const o = await outcomeOf(s)
          assertFailed(o, 'execution_failed')
          assert.equal(o.committedTokens, 1, `${output}: ${show(o)}`)
        }
      })
    })
  }
})

describe('sessions: engine options and admission', () => {
  const OPTIONS = ['idleTimeoutMs', 'maxQueuedEvents', 'maxQueuedTokens', 'maxTopLogprobs', 'maxCollectTokens', 'maxActive', 'maxQueued', 'maxIterationTokens', 'maxPreparationTokens']
  const BAD = [0, -1, 1.5, NaN, 'x', Infinity, 2 ** 53]

  for (const key of OPTIONS) {
    test(`engine option ${key} must be a positive safe integer (INVALID_OPTION)`, async () => {
      for (const value of BAD) {
        assert.throws(
          () => mlx.testing.createScriptedEngine({ steps: [] }, { [key]: value }),
          hasCode('INVALID_OPTION', new RegExp(key)),
          `${key}: ${String(value)}`,
        )
      }
      const ok = mlx.testing.createScriptedEngine({ steps: [] }, { [key]: 1 })
      await within(ok.close(), 'engine.close()')
    })
  }

  test('invalid run control throws INVALID_OPTION at open', async () => {
    await withEngine({ steps: [{ commit: [1] }] }, {}, async (engine) => {
      assert.throws(() => engine.open(REQ, { output: 'bogus' }), hasCode('INVALID_OPTION'))
      assert.throws(() => engine.open(REQ, { output: 'callback' }), hasCode('INVALID_OPTION'))
      assert.throws(() => engine.open(REQ, { output: 'callback', onTokens: 42 }), hasCode('INVALID_OPTION'))
      assert.equal(engine.stats.liveSessions, 0)
      // The engine still works.
      assertCompleted(await outcomeOf(engine.open(REQ, { output: 'collect' })), 1)
    })
  })

  test('admission: with maxActive 1 and maxQueued 1 a third open throws ADMISSION_REJECTED; room returns when sessions end', async () => {
    await withEngine(LONG, { maxActive: 1, maxQueued: 1 }, async (engine) => {
      const a = engine.open(REQ)
      await nextOf(iteratorOf(a)) // A runs and holds the only lease
      const b = engine.open(REQ)
      const pB = iteratorOf(b).next() // B waits for the lease
      await sleep(50)
      assert.equal(engine.stats.running, 1)
      assert.equal(engine.stats.liveSessions, 2)
      assert.notEqual(b.state, 'running')
      assert.throws(() => engine.open(REQ), hasCode('ADMISSION_REJECTED'))
      assert.throws(() => engine.open(REQ, { output: 'callback', onTokens: () => {} }), hasCode('ADMISSION_REJECTED'))
      assert.equal(engine.stats.liveSessions, 2)

      await within(a.close(), 'A close()')
      assertCancelled(await outcomeOf(a), 'consumer_closed')
      const rb = await within(pB, "B's next() once A is gone")
      assert.equal(rb.done, false)
      assert.equal(b.state, 'running')

      const c = engine.open(REQ) // there is room again
      await within(c.close(), 'C close()')
      assertCancelled(await outcomeOf(c), 'consumer_closed', 0)
      await within(b.close(), 'B close()')
      assert.ok(await eventually(() => engine.stats.liveSessions === 0 && engine.stats.running === 0), show(engine.stats))
    })
  })

  test('admission is FIFO: queued sessions run in the order they were opened', async () => {
    await withEngine(LONG, { maxActive: 1, maxQueued: 3 }, async (engine) => {
      const a = engine.open(REQ)
      await nextOf(iteratorOf(a))
      const order = []
      const queued = ['B', 'C', 'D'].map((name) =>
        engine.open(REQ, {
          output: 'callback',
          onTokens: () => {
            order.push(name)
            return false
          },
        }),
      )
      await sleep(50)
      assert.deepEqual(order, [])
      await within(a.close(), 'A close()')
      for (const s of queued) {
        const o = await outcomeOf(s)
        assertCompleted(o)
        assert.ok(o.committedTokens >= 1, show(o))
      }
      assert.deepEqual(order, ['B', 'C', 'D'])
    })
  })

  test('a session waiting for admission can be cancelled: cancelled with 0 tokens, never ran', async () => {
    await withEngine(LONG, { maxActive: 1 }, async (engine) => {
      const a = engine.open(REQ)
      await nextOf(iteratorOf(a))
      let calls = 0
      const b = engine.open(REQ, { output: 'callback', onTokens: () => void calls++ })
      await sleep(30)
      assert.ok(['created', 'preparing'].includes(b.state), b.state)
      await within(b.cancel(), 'cancel()')
      assertCancelled(await outcomeOf(b), 'requested', 0)
      assert.equal(calls, 0)
      assert.equal(a.state, 'running')
      await within(a.close(), 'A close()')
    })
  })
})

describe('sessions: engine close', () => {
  test('engine.close() cancels every open session with engine_closed and resolves once all are terminal', async () => {
    const engine = mlx.testing.createScriptedEngine(LONG, {})
    try {
      assert.equal(engine.closed, false)
      const done = engine.open(REQ, { output: 'callback', onTokens: () => false })
      const doneOutcome = await outcomeOf(done)
      assertCompleted(doneOutcome)

      const unstarted = engine.open(REQ)
      const blocked = engine.open(REQ)
      await nextOf(iteratorOf(blocked))
      const callback = engine.open(REQ, { output: 'callback', onTokens: () => sleep(10) })
      await sleep(30)
      assert.equal(engine.stats.liveSessions, 3)

      await within(engine.close(), 'engine.close()')
      assert.equal(engine.closed, true)
      for (const s of [unstarted, blocked, callback]) assert.equal(s.state, 'terminal')
      assertCancelled(await outcomeOf(unstarted), 'engine_closed', 0)
      assertCancelled(await outcomeOf(blocked), 'engine_closed')
      assertCancelled(await outcomeOf(callback), 'engine_closed')
      assert.deepEqual(await outcomeOf(done), doneOutcome) // already terminal: untouched
      assert.equal(engine.stats.liveSessions, 0)

      for (const ctl of [undefined, { output: 'collect' }]) {
        assert.throws(() => engine.open(REQ, ctl), hasCode('ENGINE_CLOSED'))
      }
      await within(engine.close(), 'a second engine.close()')
    } finally {
      if (!engine.closed) await within(engine.close(), 'engine.close()').catch(() => {})
    }
  })
})

describe('sessions over a tiny random llama', () => {
  const PROMPT = [1, 2, 3]
  const OPTS = { maxTokens: 9, eosTokenIds: [] }
  let model
  let engine
  let reference

  before(async () => {
    model = await mlx.loadModel(makeTinyLlama(path.join(tmpdir('session'), 'tiny')))
    engine = mlx.createEngine(model)
    reference = (await collect(mlx.generate(model, PROMPT, OPTS))).tokens
  })
  after(async () => {
    if (engine) await within(engine.close(), 'engine.close()')
    model?.dispose()
  })
  test('messages on a model without a tokenizer fail with the loader\'s own code, every time', () => {
    const request = { messages: [{ role: 'user', content: 'hi' }], maxTokens: 2 }
    for (let i = 0; i < 2; i++) {
      assert.throws(() => engine.open(request), (e) => e.code === 'TOKENIZER_ERROR' && /tokenizer\.json/.test(e.message))
    }
  })


  test('collect: output equals the tokens of generate; metrics describe the run', { timeout: 30_000 }, async () => {
    const o = await outcomeOf(engine.open({ promptTokens: PROMPT, ...OPTS }, { output: 'collect' }))
    assertCompleted(o, 9, 'length')
    assert.deepEqual(Array.from(o.output), reference)
    assert.equal(o.result.metrics.generatedTokens, 9)
    assert.equal(o.result.metrics.promptTokens, 3)
  })

  test('stream: tokens equal generate; progress events precede the first committed event', { timeout: 30_000 }, async () => {
    const prompt = Array.from({ length: 40 }, (_, i) => (i * 7) % TINY.vocab)
    const expected = (await collect(mlx.generate(model, prompt, { ...OPTS, prefillChunkSize: 8 }))).tokens
    const s = engine.open({ promptTokens: prompt, ...OPTS, prefillChunkSize: 8 })
    const { events, tokens, committed, error } = await drain(s)
    assert.equal(error, undefined)
    assert.deepEqual(tokens, expected)
    assert.deepEqual(committed.map((ev) => ev.sequence), range(0, committed.length))
    const firstCommitted = events.findIndex(isCommitted)
    const progress = events.filter((ev) => ev.type === 'progress')
    assert.ok(progress.length >= 1, 'no progress event')
    events.forEach((ev, i) => {
      if (ev.type === 'progress') assert.ok(i < firstCommitted, `progress event at ${i} after the first committed at ${firstCommitted}`)
    })
    for (let i = 0; i < progress.length; i++) {
      const p = progress[i]
      assert.ok(p.completed >= 0 && (p.total === undefined || p.total >= p.completed), show(p))
      if (i > 0) assert.ok(p.completed >= progress[i - 1].completed)
    }
    assertCompleted(await outcomeOf(s), 9, 'length')
  })

  test('callback: the tokens equal generate', { timeout: 30_000 }, async () => {
    const got = []
    const o = await outcomeOf(engine.open({ promptTokens: new Uint32Array(PROMPT), ...OPTS }, { output: 'callback', onTokens: (ids) => void got.push(...Array.from(ids)) }))
    assertCompleted(o, 9, 'length')
    assert.deepEqual(got, reference)
  })

  test("an EOS token ends the session with finishReason 'stop' and is not delivered", { timeout: 30_000 }, async () => {
    const eos = reference[4]
    const o = await outcomeOf(engine.open({ promptTokens: PROMPT, ...OPTS, eosTokenIds: [eos] }, { output: 'collect' }))
    const cut = reference.indexOf(eos)
    assertCompleted(o, cut, 'stop')
    assert.deepEqual(Array.from(o.output), reference.slice(0, cut))
  })

  test('stream with logprobs: each committed event carries logprobs equal to those of generate', { timeout: 30_000 }, async () => {
    const opts = { ...OPTS, logprobs: true, topLogprobs: 3 }
    const ref = []
    for await (const t of mlx.generate(model, PROMPT, opts)) ref.push(t)
    const s = engine.open({ promptTokens: PROMPT, ...opts })
    const { committed, tokens } = await drain(s)
    assertCompleted(await outcomeOf(s), 9)
    assert.deepEqual(tokens, reference)
    const lps = committed.flatMap((ev) => {
      assert.equal(ev.logprobs?.length, ev.tokenIds.length)
      return ev.logprobs
    })
    lps.forEach((lp, i) => {
      assert.ok(Math.abs(lp.logprob - ref[i].logprobs.logprob) < 1e-5, `token ${i}: ${lp.logprob} vs ${ref[i].logprobs.logprob}`)
      assert.equal(lp.top.length, 3)
      assert.deepEqual(lp.top.map((x) => x.id), ref[i].logprobs.top.map((x) => x.id))
      assert.equal(lp.top[0].id, tokens[i])
    })
  })

  test('collect with logprobs: true fails the session (execution_failed)', { timeout: 30_000 }, async () => {
    const o = await outcomeOf(engine.open({ promptTokens: PROMPT, ...OPTS, logprobs: true }, { output: 'collect' }))
    assertFailed(o, 'execution_failed')
    assert.equal(o.committedTokens, 0)
  })

  test('a stream session closed mid-decode delivered a prefix of the greedy tokens', { timeout: 30_000 }, async () => {
    const long = (await collect(mlx.generate(model, PROMPT, { maxTokens: 64, eosTokenIds: [] }))).tokens
    const s = engine.open({ promptTokens: PROMPT, maxTokens: 64, eosTokenIds: [] })
    const got = []
    await within(
      (async () => {
        for await (const ev of s.events) if (isCommitted(ev) && got.push(...ev.tokenIds) >= 3) break
      })(),
      'reading three tokens',
    )
    const o = await outcomeOf(s)
    assert.ok(o.status === 'cancelled' || o.status === 'completed', show(o))
    if (o.status === 'cancelled') assert.equal(o.reason, 'consumer_closed')
    assert.deepEqual(got, long.slice(0, got.length))
    assert.ok(o.committedTokens >= got.length && o.committedTokens <= 64, show(o))
  })

  test('the collect budget is shared: two overlapping sessions over maxCollectTokens → one fails', { timeout: 60_000 }, async () => {
    const e2 = mlx.createEngine(model, { maxCollectTokens: 1000 })
    try {
      const req = { promptTokens: PROMPT, maxTokens: 600, eosTokenIds: [] }
      const outcomes = await within(Promise.all([e2.open(req, { output: 'collect' }).result, e2.open(req, { output: 'collect' }).result]), 'two collect sessions', 50_000)
      const statuses = outcomes.map((o) => o.status).sort()
      assert.deepEqual(statuses, ['completed', 'failed'], show(outcomes.map((o) => ({ ...o, output: undefined }))))
      const failed = outcomes.find((o) => o.status === 'failed')
      assertFailed(failed, 'execution_failed')
      assert.equal(failed.committedTokens, 0)
      assert.equal(e2.stats.reservedCollectTokens, 0)
    } finally {
      await within(e2.close(), 'engine.close()')
    }
  })

  test('invalid generation options throw INVALID_OPTION synchronously at open', async () => {
    for (const bad of [{ maxTokens: -1 }, { maxTokens: 2.5 }, { temperature: 'x' }, { temperature: -0.5 }, { topP: -0.1 }, { topLogprobs: 99 }]) {
      for (const output of ['stream', 'collect']) {
        assert.throws(() => engine.open({ promptTokens: PROMPT, ...bad }, { output }), hasCode('INVALID_OPTION'), show(bad))
      }
    }
    assert.equal(engine.stats.liveSessions, 0)
  })

  test('a bad prompt throws INVALID_PROMPT synchronously at open', async () => {
    for (const promptTokens of [[], new Uint32Array(0), [1, TINY.vocab], [1, -1]]) {
      assert.throws(() => engine.open({ promptTokens }), hasCode('INVALID_PROMPT'), show(promptTokens))
    }
    assert.equal(engine.stats.liveSessions, 0)
  })

  test('createEngine validates its options like the scripted engine (INVALID_OPTION)', async () => {
    for (const key of ['idleTimeoutMs', 'maxQueuedEvents', 'maxQueuedTokens', 'maxTopLogprobs', 'maxCollectTokens', 'maxActive', 'maxQueued', 'maxIterationTokens', 'maxPreparationTokens']) {
      for (const value of [0, -1, 1.5, NaN, 'x']) {
        assert.throws(() => mlx.createEngine(model, { [key]: value }), hasCode('INVALID_OPTION'), `${key}: ${String(value)}`)
      }
    }
  })
})

describe('sessions: leaks', () => {
  test('no session is left alive once every engine is closed', async () => {
    assert.ok(await eventually(() => mlx.testing.liveSessions() === 0, 5000), `liveSessions() is ${mlx.testing.liveSessions()}`)
  })
})
