'use strict'
// Errors as JavaScript sees them: every one an `Error` with a stable `code`. Native errors cross
// the boundary as "CODE: message"; this moves the code where callers read it.

const CODED = /^([A-Z][A-Z0-9_]+): ([\s\S]*)$/
// napi's own argument conversion errors (a string where a number belongs, ...) are bad options.
const NAPI_ARG = new Set(['InvalidArg', 'ObjectExpected', 'StringExpected', 'NameExpected', 'FunctionExpected', 'NumberExpected', 'BooleanExpected', 'ArrayExpected', 'BigintExpected'])

/** Moves the `CODE: ` prefix of a native error message into `err.code`. */
function mapError(e) {
  if (e instanceof Error && typeof e.message === 'string') {
    const m = CODED.exec(e.message)
    if (m) {
      e.code = m[1]
      e.message = m[2]
    } else if (NAPI_ARG.has(e.code)) {
      e.code = 'INVALID_OPTION'
    } else if (e.code === 'GenericFailure') {
      // A panic inside a binding (napi's catch_unwind): a bug, thrown instead of aborting.
      e.code = 'INTERNAL_ERROR'
    }
  }
  return e
}

function coded(code, message) {
  return Object.assign(new Error(message), { code })
}

function wrap(fn) {
  return function (...args) {
    let r
    try {
      r = fn.apply(this, args)
    } catch (e) {
      throw mapError(e)
    }
    return r && typeof r.then === 'function' ? r.catch((e) => Promise.reject(mapError(e))) : r
  }
}

module.exports = { coded, mapError, wrap }
