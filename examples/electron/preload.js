'use strict'
// Runs in the window before its page, with access to ipcRenderer. It keeps the engine's
// MessagePort to itself and exposes two functions to the page: `send(message)` and
// `onMessage(listener)`; the page never holds the port or any Electron API.
const { contextBridge, ipcRenderer } = require('electron')

let port = null
const listeners = []
const deliver = (msg) => listeners.forEach((fn) => fn(msg))

ipcRenderer.on('engine-port', (event, { modelPath }) => {
  ;[port] = event.ports
  port.onmessage = (e) => deliver(e.data) // assigning onmessage starts the port
  deliver({ type: 'engine-started', modelPath })
})
ipcRenderer.on('engine-exit', (_event, code) => {
  port = null
  deliver({ type: 'engine-exit', code })
})

contextBridge.exposeInMainWorld('engine', {
  send(msg) {
    if (port === null) throw new Error('the engine process is not running')
    port.postMessage(msg)
  },
  onMessage(listener) {
    listeners.push(listener)
  },
})
