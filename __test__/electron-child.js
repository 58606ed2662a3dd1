'use strict'
// A stand-in for Electron's utilityProcess, for electron-protocol.test.js. process.parentPort and
// the port it delivers have the shapes Electron documents: a 'message' event of { data, ports },
// and a MessagePortMain that holds messages until start(). It loads the example's
// engine-process.js as main.js forks it, drives load → generate → close over the other end of the
// channel and writes each message as a JSON line. Only the engine's process.exit (on close) ends
// this process with code 0: a timer keeps it alive otherwise, and ends it with code 3 after 30 s.
const fs = require('node:fs')
const { EventEmitter } = require('node:events')
const { MessageChannel } = require('node:worker_threads')

class MessagePortMain extends EventEmitter {
  #port
  #held = []
  constructor(port) {
    super()
    this.#port = port
    port.on('message', (data) => (this.#held ? this.#held.push(data) : this.emit('message', { data, ports: [] })))
  }

  start() {
    const held = this.#held
    this.#held = null
    for (const data of held) this.emit('message', { data, ports: [] })
  }

  postMessage(msg) {
    this.#port.postMessage(msg)
  }

  close() {
    this.#port.close()
  }
}

// Written synchronously: the process may exit right after.
const print = (msg) => fs.writeSync(1, `${JSON.stringify(msg)}\n`)

process.parentPort = new EventEmitter()
require('../examples/electron/engine-process.js')

const [modelPath, prompt] = process.argv.slice(2)
const { port1, port2 } = new MessageChannel()
port2.on('message', (msg) => {
  print(msg)
  if (msg.type === 'loaded') port2.postMessage({ type: 'generate', id: 1, prompt, options: { maxTokens: 4, eosTokenIds: [], temperature: 0 } })
  if (msg.type === 'done') port2.postMessage({ type: 'close' })
})
process.on('exit', (code) => print({ type: 'exit', code }))
port2.postMessage({ type: 'load', modelPath })
process.parentPort.emit('message', { data: { type: 'port' }, ports: [new MessagePortMain(port1)] })
setTimeout(() => process.exit(3), 30_000)
