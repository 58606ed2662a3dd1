'use strict'
// Electron's main process: one window, and the engine in a utilityProcess. The main process never
// loads mlx-bun; it only connects the two ends of a MessageChannelMain, one to the engine and one
// to the window's preload, and tells the window when the engine process ends.
const path = require('node:path')
const { app, BrowserWindow, MessageChannelMain, utilityProcess } = require('electron')

let engine = null

/** Forks a fresh engine for the page just loaded (a reload gets a new one, with a new channel). */
function startEngine(win) {
  engine?.kill()
  const { port1, port2 } = new MessageChannelMain()
  const child = utilityProcess.fork(path.join(__dirname, 'engine-process.js'), [], { serviceName: 'mlx-bun engine', stdio: 'inherit' })
  engine = child
  child.postMessage({ type: 'port' }, [port1])
  // MLX_BUN_MODEL: a model folder or .gguf file; unset, the engine loads defaultModelPath().
  win.webContents.postMessage('engine-port', { modelPath: process.env.MLX_BUN_MODEL ?? null }, [port2])
  child.on('exit', (code) => {
    if (engine !== child) return // an engine replaced by a reload
    engine = null
    if (!win.isDestroyed()) win.webContents.send('engine-exit', code)
  })
}

app.whenReady().then(() => {
  // contextIsolation and sandbox are on by default: the page reaches the engine only through
  // the two functions preload.js exposes.
  const win = new BrowserWindow({ width: 900, height: 700, webPreferences: { preload: path.join(__dirname, 'preload.js') } })
  win.webContents.on('did-finish-load', () => startEngine(win))
  win.loadFile(path.join(__dirname, 'index.html'))
})

app.on('window-all-closed', () => app.quit())
app.on('will-quit', () => engine?.kill())
