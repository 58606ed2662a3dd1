//! The engine thread: one long-lived OS thread owns every model, KV cache and lazy graph, because
//! MLX streams are per thread (a graph built on one thread cannot be evaluated on another, and
//! every thread that touches MLX leaks a stream and a worker). Callers talk to it over a channel;
//! it steps active generations round-robin, one unit each, and never waits on a consumer.
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::{Arc, OnceLock};

use mlx_rs::Array;
use tokio::sync::{mpsc, oneshot};

use super::events::Event;
use super::generate::Generation;
use crate::error::{Error, Result};
use crate::mlx::{gate, host};
use crate::model::config::ModelConfig;
use crate::model::weights::Weights;
use crate::model::{create_model, LanguageModel};
use crate::sample::{validate_prompt, GenerateOptions};

pub type ModelId = u64;

enum Command {
    Load { weights: Weights, config: ModelConfig, reply: oneshot::Sender<Result<ModelId>> },
    Unload(ModelId),
    Generate { model: ModelId, prompt: Vec<u32>, opts: GenerateOptions, sink: mpsc::UnboundedSender<Event>, cancel: Arc<AtomicBool> },
    Logits { model: ModelId, prompt: Vec<u32>, reply: oneshot::Sender<Result<Vec<f32>>> },
    /// Arbitrary MLX work that is not a model (conversion, benchmarks).
    Run(Box<dyn FnOnce() + Send>),
}

/// Cloneable handle to the process-wide engine thread.
#[derive(Clone)]
pub struct Engine {
    tx: Sender<Command>,
}

/// A running generation as seen from outside the engine: its events and a cancel flag.
pub struct GenerationHandle {
    pub events: mpsc::UnboundedReceiver<Event>,
    pub cancel: Arc<AtomicBool>,
}

static ENGINE: OnceLock<Engine> = OnceLock::new();

impl Engine {
    /// The engine, started on first use.
    pub fn get() -> &'static Engine {
        ENGINE.get_or_init(|| {
            let (tx, rx) = channel();
            std::thread::Builder::new()
                .name("mlx-bun-engine".into())
                .spawn(move || EngineLoop::new(rx).run())
                .expect("spawning the engine thread");
            Engine { tx }
        })
    }

    fn send(&self, cmd: Command) -> Result<()> {
        self.tx.send(cmd).map_err(|_| Error::EngineClosed)
    }

    pub fn load(&self, weights: Weights, config: ModelConfig) -> oneshot::Receiver<Result<ModelId>> {
        let (reply, rx) = oneshot::channel();
        if let Err(e) = self.send(Command::Load { weights, config, reply }) {
            let (tx, rx2) = oneshot::channel();
            let _ = tx.send(Err(e));
            return rx2;
        }
        rx
    }

    pub fn unload(&self, model: ModelId) {
        let _ = self.send(Command::Unload(model));
    }

    pub fn generate(&self, model: ModelId, prompt: Vec<u32>, opts: GenerateOptions) -> GenerationHandle {
        let (sink, events) = mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        if let Err(e) = self.send(Command::Generate { model, prompt, opts, sink: sink.clone(), cancel: cancel.clone() }) {
            let _ = sink.send(Event::Failed(e));
        }
        GenerationHandle { events, cancel }
    }

    /// Runs `work` on the engine thread (where all MLX work belongs) and returns its result.
    pub fn run<T: Send + 'static>(&self, work: impl FnOnce() -> Result<T> + Send + 'static) -> oneshot::Receiver<Result<T>> {
        let (reply, rx) = oneshot::channel();
        let job = Box::new(move || {
            let _ = reply.send(work());
        });
        if self.send(Command::Run(job)).is_err() {
            let (tx, rx2) = oneshot::channel();
            let _ = tx.send(Err(Error::EngineClosed));
            return rx2;
        }
        rx
    }

    /// Logits of the last prompt position from one full forward on a fresh cache (for parity checks).
    pub fn logits(&self, model: ModelId, prompt: Vec<u32>) -> oneshot::Receiver<Result<Vec<f32>>> {
        let (reply, rx) = oneshot::channel();
        if let Err(e) = self.send(Command::Logits { model, prompt, reply }) {
            let (tx, rx2) = oneshot::channel();
            let _ = tx.send(Err(e));
            return rx2;
        }
        rx
    }
}

struct EngineLoop {
    rx: Receiver<Command>,
    models: HashMap<ModelId, Rc<dyn LanguageModel>>,
    runs: VecDeque<Generation>,
    warmed: bool,
}

static NEXT_MODEL: AtomicU64 = AtomicU64::new(1);

impl EngineLoop {
    fn new(rx: Receiver<Command>) -> Self {
        EngineLoop { rx, models: HashMap::new(), runs: VecDeque::new(), warmed: false }
    }

    fn run(mut self) {
        loop {
            let cmd = if self.runs.is_empty() {
                self.settle();
                match self.rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return,
                }
            } else {
                match self.rx.try_recv() {
                    Ok(c) => Some(c),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => return,
                }
            };
            let Some(_gate) = gate::enter() else { self.park() };
            match cmd {
                Some(c) => self.handle(c),
                None => self.step(),
            }
            gate::set_in_flight(true);
        }
    }

    /// Waits for evaluations still running on this thread's stream before going idle, so an exit
    /// while idle has nothing to wait for.
    fn settle(&mut self) {
        let Some(_gate) = gate::enter() else { self.park() };
        synchronize();
        gate::set_in_flight(false);
    }

    /// The process is exiting: MLX's statics may be torn down after the in-flight work ends.
    /// Touch nothing more, drop nothing, never return.
    fn park(&mut self) -> ! {
        gate::park_engine(synchronize)
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Load { weights, config, reply } => {
                let result = create_model(&weights, config).map(|m| {
                    let id = NEXT_MODEL.fetch_add(1, Ordering::Relaxed);
                    self.models.insert(id, Rc::from(m));
                    id
                });
                drop(weights);
                if result.is_ok() {
                    self.warm_up();
                }
                let _ = reply.send(result);
            }
            Command::Unload(id) => {
                self.models.remove(&id);
            }
            Command::Generate { model, prompt, opts, sink, cancel } => {
                let started = self.model(model).and_then(|m| {
                    validate_prompt(&prompt, m.config().vocab_size)?;
                    opts.validate(m.config().vocab_size)?;
                    Generation::new(m, prompt, opts, sink.clone(), cancel)
                });
                match started {
                    Ok(g) => self.runs.push_back(g),
                    Err(e) => {
                        let _ = sink.send(Event::Failed(e));
                    }
                }
            }
            Command::Logits { model, prompt, reply } => {
                let _ = reply.send(self.model(model).and_then(|m| last_logits(&*m, &prompt)));
            }
            Command::Run(work) => {
                work();
                self.warm_up();
            }
        }
    }

    /// Advances the generation at the front of the queue by one unit, then rotates it to the back.
    fn step(&mut self) {
        let Some(mut g) = self.runs.pop_front() else { return };
        match g.advance() {
            Ok(None) => self.runs.push_back(g),
            Ok(Some(_)) => {}
            Err(e) => g.fail(e),
        }
    }

    fn model(&self, id: ModelId) -> Result<Rc<dyn LanguageModel>> {
        self.models.get(&id).cloned().ok_or(Error::ModelDisposed)
    }

    /// After MLX has run once on this thread, its lazily built statics exist; registering the
    /// exit hook now makes it run before their destructors.
    fn warm_up(&mut self) {
        if !self.warmed {
            let a = Array::from_slice(&[1.0f32], &[1]);
            let _ = a.add(&a).and_then(|b| b.eval());
            gate::close_at_process_exit();
            self.warmed = true;
        }
    }
}

/// Blocks until everything queued on this thread's MLX stream has been evaluated.
fn synchronize() {
    // SAFETY: plain call into mlx-c for the calling thread's default stream.
    unsafe { mlx_sys::mlx_synchronize_default() };
}

fn last_logits(model: &dyn LanguageModel, prompt: &[u32]) -> Result<Vec<f32>> {
    validate_prompt(prompt, model.config().vocab_size)?;
    let mut caches = model.new_cache();
    let ids = Array::from_slice(prompt, &[1, prompt.len() as i32]);
    let hidden = model.hidden(&ids, &mut caches)?;
    use mlx_rs::ops::indexing::IndexOp;
    let logits = model.logits(&hidden.index((.., -1.., ..)))?;
    host::to_f32_vec(&logits)
}
