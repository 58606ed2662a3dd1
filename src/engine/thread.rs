//! The engine thread: one long-lived OS thread owns every model, KV cache and lazy graph, because
//! MLX streams are per thread (a graph built on one thread cannot be evaluated on another, and
//! every thread that touches MLX leaks a stream and a worker). Callers talk to it over a channel;
//! it admits sessions, steps the runnable ones round-robin, one unit each, fires idle timers,
//! and never waits on a consumer.
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use mlx_rs::Array;
use tokio::sync::oneshot;

use super::driver::{Advanced, Driver};
use super::generate::Generation;
use super::inference::{InferenceEngine, MethodSpec};
use super::session::Session;
use crate::error::{Error, Result};
use crate::mlx::{gate, host};
use crate::model::config::ModelConfig;
use crate::model::weights::Weights;
use crate::model::{create_model, LanguageModel};
use crate::sample::validate_prompt;

pub type ModelId = u64;

enum Command {
    Load { weights: Weights, config: ModelConfig, reply: oneshot::Sender<Result<ModelId>> },
    Unload(ModelId),
    Open { engine: Arc<InferenceEngine>, session: Arc<Session>, spec: MethodSpec },
    /// A session started, was unblocked or cancelled.
    Wake,
    Logits { model: ModelId, prompt: Vec<u32>, reply: oneshot::Sender<Result<Vec<f32>>> },
    /// Arbitrary MLX work that is not a model (conversion, benchmarks).
    Run(Box<dyn FnOnce() + Send>),
}

/// Cloneable handle to the process-wide engine thread.
#[derive(Clone)]
pub struct Engine {
    tx: Sender<Command>,
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

    /// Hands a new session to the engine thread.
    pub fn open(&self, engine: Arc<InferenceEngine>, session: Arc<Session>, spec: MethodSpec) {
        if let Err(e) = self.send(Command::Open { engine, session: session.clone(), spec }) {
            session.finish(Err(e), Ok(()), None);
        }
    }

    pub fn wake(&self) {
        let _ = self.send(Command::Wake);
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
    /// Sessions in the order they were opened (admission is FIFO over it).
    drivers: Vec<Driver>,
    /// Round-robin position among the drivers.
    cursor: usize,
    warmed: bool,
}

static NEXT_MODEL: AtomicU64 = AtomicU64::new(1);
static BATCHED_STEPS: AtomicU64 = AtomicU64::new(0);
static BATCHED_ROWS: AtomicU64 = AtomicU64::new(0);

/// Batched decode steps run so far, and the rows they advanced (for tests and benchmarks).
pub fn batch_counts() -> (u64, u64) {
    (BATCHED_STEPS.load(Ordering::Relaxed), BATCHED_ROWS.load(Ordering::Relaxed))
}

impl EngineLoop {
    fn new(rx: Receiver<Command>) -> Self {
        EngineLoop { rx, models: HashMap::new(), drivers: Vec::new(), cursor: 0, warmed: false }
    }

    fn run(mut self) {
        loop {
            let cmd = match self.rx.try_recv() {
                Ok(c) => Some(c),
                Err(TryRecvError::Disconnected) => return,
                Err(TryRecvError::Empty) => None,
            };
            let Some(_gate) = gate::enter() else { self.park() };
            if let Some(c) = cmd {
                self.handle(c);
                gate::set_in_flight(true);
                continue;
            }
            if self.step() {
                gate::set_in_flight(true);
                continue;
            }
            drop(_gate);
            // Nothing runnable: go idle until a command arrives or an idle timer runs out.
            self.settle();
            let deadline = self.drivers.iter().filter_map(|d| d.session.idle_deadline()).min();
            let cmd = match deadline {
                Some(d) => match self.rx.recv_timeout(d.saturating_duration_since(Instant::now())) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                },
                None => match self.rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return,
                },
            };
            let Some(_gate) = gate::enter() else { self.park() };
            if let Some(c) = cmd {
                self.handle(c);
            }
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
            Command::Open { engine, session, spec } => self.drivers.push(Driver::new(engine, session, spec)),
            Command::Wake => {}
            Command::Logits { model, prompt, reply } => {
                let _ = reply.send(self.model(model).and_then(|m| last_logits(&*m, &prompt)));
            }
            Command::Run(work) => {
                work();
                self.warm_up();
            }
        }
    }

    /// Fires idle timers, admits waiting sessions, then gives one unit of work to the next
    /// runnable session after the last one served. Returns whether anything happened.
    fn step(&mut self) -> bool {
        let now = Instant::now();
        for d in &self.drivers {
            d.session.check_idle(now);
        }
        for d in &mut self.drivers {
            d.admit();
        }
        let n = self.drivers.len();
        for k in 0..n {
            let i = (self.cursor + k) % n;
            if let Some(key) = self.drivers[i].batch_key() {
                // Every session whose next unit is a decode step of the same model joins.
                let members: Vec<usize> = (0..n).map(|k| (i + k) % n).filter(|&j| j == i || self.drivers[j].batch_key() == Some(key)).collect();
                if members.len() > 1 {
                    self.step_batch(&members);
                    // Past the last member, so sessions still prefilling get the next turn.
                    self.cursor = members.last().map_or(i, |&j| j) + 1;
                    return true;
                }
            }
            let models = &self.models;
            let model = |id: ModelId| models.get(&id).cloned().ok_or(Error::ModelDisposed);
            match self.drivers[i].advance(&model) {
                Advanced::Idle => continue,
                Advanced::Worked => {}
                Advanced::Terminal => self.remove(&[i]),
            }
            self.cursor = i + 1;
            return true;
        }
        false
    }

    /// One decode step of `members` (indices of drivers) in one graph.
    fn step_batch(&mut self, members: &[usize]) {
        BATCHED_STEPS.fetch_add(1, Ordering::Relaxed);
        BATCHED_ROWS.fetch_add(members.len() as u64, Ordering::Relaxed);
        let mut sorted = members.to_vec();
        sorted.sort_unstable();
        let mut drivers: Vec<&mut Driver> =
            self.drivers.iter_mut().enumerate().filter(|(j, _)| members.contains(j)).map(|(_, d)| d).collect();
        let results = {
            let mut rows: Vec<_> = drivers.iter_mut().map(|d| d.batch_parts().expect("batch members are generations")).collect();
            Generation::step_batch(&mut rows)
        };
        let mut ended = Vec::new();
        for ((d, result), &j) in drivers.iter_mut().zip(results).zip(&sorted) {
            if d.conclude(result) == Advanced::Terminal {
                ended.push(j);
            }
        }
        self.remove(&ended);
    }

    /// Drops the drivers at `indices`, whose sessions have ended.
    fn remove(&mut self, indices: &[usize]) {
        let mut sorted = indices.to_vec();
        sorted.sort_unstable();
        for &i in sorted.iter().rev() {
            self.drivers.remove(i);
        }
        if self.drivers.is_empty() {
            mlx_rs::memory::clear_cache().ok();
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
