'use strict'
// The page: a prompt box, Send and Stop, and the answer as it streams in. It talks to the engine
// only through `window.engine` (preload.js), with the messages of engine-process.js.
const $ = (id) => document.getElementById(id)
const status = (text) => { $('status').textContent = text }

let nextId = 1
let current = null // id of the generation being shown

function setBusy(busy) {
  $('send').disabled = busy
  $('stop').disabled = !busy
}

$('send').addEventListener('click', () => {
  current = nextId++
  $('output').textContent = ''
  setBusy(true)
  status('generating…')
  window.engine.send({
    type: 'generate',
    id: current,
    messages: [{ role: 'user', content: $('prompt').value }],
    options: { maxTokens: 512, temperature: 0.7, topP: 0.9, seed: Math.floor(Math.random() * 2 ** 31) },
  })
})

$('stop').addEventListener('click', () => window.engine.send({ type: 'cancel', id: current }))

window.engine.onMessage((msg) => {
  switch (msg.type) {
    case 'engine-started':
      status('loading the model…')
      window.engine.send({ type: 'load', modelPath: msg.modelPath ?? undefined })
      break
    case 'loaded':
      status(`ready: ${msg.modelType} from ${msg.modelPath}`)
      setBusy(false)
      break
    case 'token':
      if (msg.id === current) $('output').textContent += msg.text
      break
    case 'done':
      if (msg.id !== current) break
      setBusy(false)
      status(`${msg.finishReason}: ${msg.stats.generatedTokens} tokens, ${msg.stats.decodeTps.toFixed(1)} tok/s`)
      break
    case 'error':
      if (msg.id === current) setBusy(false)
      status(`error ${msg.code}: ${msg.message}`)
      break
    case 'engine-exit':
      $('send').disabled = true
      $('stop').disabled = true
      status(`the engine process ended (exit code ${msg.code}); reload the window (Ctrl+R) to start a new one`)
      break
  }
})
