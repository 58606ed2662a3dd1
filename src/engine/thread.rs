//! The engine thread: one long-lived OS thread owns every model, KV cache and lazy graph, because
//! MLX streams are per thread (a graph built on one thread cannot be evaluated on another, and
//! every thread that touches MLX leaks a stream and a worker). Callers talk to it over a channel.
//! Each engine's sessions form a group that the scheduler policy drives; the thread ticks every
//! group in turn (a tick ends where the policy yields), takes new commands between ticks, fires
//! idle timers, sleeps when no group has work, and never waits on a consumer.
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use mlx_rs::Array;
use tokio::sync::oneshot;

use super::driver::{Driver, Phase};
use super::admission::Admission;
use super::group::Group;
use super::models::{lookup, ModelId, ModelSlot, Models};
use super::request::MethodSpec;
use super::prompt_tasks::{PromptEmbeddings, PromptLogits};
use super::scheduler::{Clock, Scheduler, Tick};
use super::session::Session;
use super::tasks::ExecutionTasks;
use super::caller_cache::{self, CacheLease, CallerCaches};
use crate::cache::PrefixCache;
use crate::error::{catch_panic, Error, Result};
use crate::mlx::backend::synchronize;
use crate::mlx::gate;
use crate::model::config::ModelConfig;
use crate::model::weights::Weights;
use crate::model::create_model;
use crate::tokenizer;

/// Produces a model's weights on the engine thread (a GGUF file is converted there).
pub type WeightsSource = Box<dyn FnOnce() -> Result<Weights> + Send>;

enum Command {
    Load {
        id: ModelId,
        weights: WeightsSource,
        config: ModelConfig,
        reply: oneshot::Sender<Result<()>>,
    },
    Unload(ModelId),
    Open {
        engine: Arc<Admission>,
        session: Arc<Session>,
        spec: MethodSpec,
    },
    /// A session started, was unblocked or cancelled.
    Wake,
    Logits {
        model: ModelId,
        prompt: Vec<u32>,
        reply: oneshot::Sender<Result<Vec<f32>>>,
    },
    Embed {
        model: ModelId,
        rows: Vec<Vec<u32>>,
        reply: oneshot::Sender<Result<Vec<Vec<f32>>>>,
    },
    /// A caller cache was disposed: its layers go.
    DropCache(u64),
    /// A caller cache saved to, or filled from, a file.
    CacheFile {
        lease: CacheLease,
        path: PathBuf,
        save: bool,
        reply: oneshot::Sender<Result<()>>,
    },
    /// Arbitrary MLX work that is not a model (conversion, benchmarks), queued as a task.
    Run(Box<dyn FnOnce(&mut ExecutionTasks) + Send>),
}

/// Cloneable handle to the process-wide engine thread.
#[derive(Clone)]
pub struct EngineThread {
    tx: Sender<Command>,
}

static ENGINE: OnceLock<EngineThread> = OnceLock::new();

impl EngineThread {
    /// The engine, started on first use.
    pub fn get() -> &'static EngineThread {
        ENGINE.get_or_init(|| {
            let (tx, rx) = channel();
            std::thread::Builder::new()
                .name("mlx-bun-engine".into())
                .spawn(move || {
                    let mut engine = EngineLoop::new(rx);
                    // Units contain their own panics (`tick`); one that escapes them ends the
                    // loop, and then nothing may wait forever: every session and reply fails.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.run()));
                    engine.die();
                })
                .expect("spawning the engine thread");
            EngineThread { tx }
        })
    }

    /// Fails only once the engine thread has ended.
    fn send(&self, cmd: Command) -> Result<()> {
        self.tx.send(cmd).map_err(|_| Error::EngineDead)
    }

    /// Queues the load of a model and returns its id at once; the receiver says how the load
    /// ended. Work on the id queues behind the load and fails with its error if it failed.
    pub fn load(&self, weights: WeightsSource, config: ModelConfig) -> (ModelId, oneshot::Receiver<Result<()>>) {
        let id = NEXT_MODEL.fetch_add(1, Ordering::Relaxed);
        let (reply, rx) = oneshot::channel();
        if let Err(e) = self.send(Command::Load { id, weights, config, reply }) {
            let (tx, rx2) = oneshot::channel();
            let _ = tx.send(Err(e));
            return (id, rx2);
        }
        (id, rx)
    }

    pub fn unload(&self, model: ModelId) {
        let _ = self.send(Command::Unload(model));
    }

    pub fn drop_cache(&self, id: u64) {
        let _ = self.send(Command::DropCache(id));
    }

    /// Saves the leased caller cache to `path` (`save`), or fills it from the file there.
    pub fn cache_file(&self, lease: CacheLease, path: PathBuf, save: bool) -> oneshot::Receiver<Result<()>> {
        let (reply, rx) = oneshot::channel();
        if let Err(e) = self.send(Command::CacheFile { lease, path, save, reply }) {
            let (tx, rx2) = oneshot::channel();
            let _ = tx.send(Err(e));
            return rx2;
        }
        rx
    }

    /// Hands a new session to the engine thread.
    pub fn open(&self, engine: Arc<Admission>, session: Arc<Session>, spec: MethodSpec) {
        if let Err(e) = self.send(Command::Open {
            engine: engine.clone(),
            session: session.clone(),
            spec,
        }) {
            engine.arrived();
            session.finish(Err(e), Ok(()), None);
        }
    }

    pub fn wake(&self) {
        let _ = self.send(Command::Wake);
    }

    /// Runs `work` on the engine thread (where all MLX work belongs) and returns its result.
    pub fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> oneshot::Receiver<Result<T>> {
        let (reply, rx) = oneshot::channel();
        let job = Box::new(move |tasks: &mut ExecutionTasks| {
            tasks.enqueue(
                move || {
                    let result = work();
                    warm_up();
                    result
                },
                reply,
            )
        });
        if self.send(Command::Run(job)).is_err() {
            let (tx, rx2) = oneshot::channel();
            let _ = tx.send(Err(Error::EngineDead));
            return rx2;
        }
        rx
    }

    /// Logits of the last prompt position from one full forward on a fresh cache (for parity checks).
    pub fn logits(&self, model: ModelId, prompt: Vec<u32>) -> oneshot::Receiver<Result<Vec<f32>>> {
        let (reply, rx) = oneshot::channel();
        if let Err(e) = self.send(Command::Logits {
            model,
            prompt,
            reply,
        }) {
            let (tx, rx2) = oneshot::channel();
            let _ = tx.send(Err(e));
            return rx2;
        }
        rx
    }

    /// mlx-bun's `embedMany`: each text's ids (`Tokenizer::embedding_input`) and the receiver of
    /// their embeddings.
    pub fn embed_texts(&self, model: ModelId, tokenizer: &tokenizer::Tokenizer, texts: &[String], instruction: Option<&str>) -> Result<(Vec<usize>, oneshot::Receiver<Result<Vec<Vec<f32>>>>)> {
        let rows = texts.iter().map(|t| tokenizer.embedding_input(t, instruction)).collect::<Result<Vec<_>>>()?;
        Ok(self.embed_rows(model, rows))
    }

    /// `embed` of rows of ids, with their lengths.
    pub fn embed_rows(&self, model: ModelId, rows: Vec<Vec<u32>>) -> (Vec<usize>, oneshot::Receiver<Result<Vec<Vec<f32>>>>) {
        let counts = rows.iter().map(Vec::len).collect();
        (counts, self.embed(model, rows))
    }

    /// Each row's embedding: its last hidden state, L2-normalised (padded batches, in steps).
    pub fn embed(&self, model: ModelId, rows: Vec<Vec<u32>>) -> oneshot::Receiver<Result<Vec<Vec<f32>>>> {
        let (reply, rx) = oneshot::channel();
        if let Err(e) = self.send(Command::Embed { model, rows, reply }) {
            let (tx, rx2) = oneshot::channel();
            let _ = tx.send(Err(e));
            return rx2;
        }
        rx
    }
}

struct EngineLoop {
    rx: Receiver<Command>,
    models: Models,
    /// The thread's own group (tasks only) first, then one per engine that has sessions.
    groups: Vec<(Scheduler, Group)>,
    /// Each engine's prefix cache. It outlives the engine's group, which goes when idle, and
    /// goes with the engine: when it is closed, or dropped by its last owner.
    prefixes: Vec<(Weak<Admission>, Rc<RefCell<PrefixCache>>)>,
    caller_caches: CallerCaches,
    clock: ThreadClock,
}

static NEXT_MODEL: AtomicU64 = AtomicU64::new(1);

struct ThreadClock(Instant);

impl Clock for ThreadClock {
    fn now(&self) -> f64 {
        self.0.elapsed().as_secs_f64() * 1e3
    }
}

impl EngineLoop {
    fn new(rx: Receiver<Command>) -> Self {
        let models = Models::default();
        let caller_caches = CallerCaches::default();
        let system = (Scheduler::new(false), Group::new(None, models.clone(), Default::default(), caller_caches.clone()));
        EngineLoop {
            rx,
            models,
            groups: vec![system],
            prefixes: Vec::new(),
            caller_caches,
            clock: ThreadClock(Instant::now()),
        }
    }

    /// `engine`'s prefix cache, made on its first session. Caches of engines dropped since go.
    fn prefix_cache(&mut self, engine: &Arc<Admission>) -> Rc<RefCell<PrefixCache>> {
        self.prefixes.retain(|(w, _)| w.strong_count() > 0);
        if let Some((_, p)) = self.prefixes.iter().find(|(w, _)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(engine))) {
            return p.clone();
        }
        let p = Rc::new(RefCell::new(PrefixCache::new(engine.options.prefix_cache_bytes as usize, engine.prefix_stats.clone())));
        self.prefixes.push((Arc::downgrade(engine), p.clone()));
        p
    }

    fn run(&mut self) {
        loop {
            loop {
                match self.rx.try_recv() {
                    Ok(c) => self.handle(c),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            let Some(_gate) = gate::enter(synchronize) else {
                self.park()
            };
            if self.tick() {
                gate::set_in_flight(true);
                continue;
            }
            drop(_gate);
            // No group has work: go idle until a command arrives or an idle timer runs out.
            self.settle();
            let deadline = self
                .groups
                .iter()
                .filter_map(|(_, g)| g.idle_deadline())
                .min();
            let cmd = match deadline {
                Some(d) => match self
                    .rx
                    .recv_timeout(d.saturating_duration_since(Instant::now()))
                {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                },
                None => match self.rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return,
                },
            };
            if let Some(c) = cmd {
                self.handle(c);
            }
        }
    }

    /// Ticks every group once. Returns whether any ran something. Engine groups that have
    /// closed, or gone idle with no sessions left, are dropped (a new session makes a new one).
    /// A panic inside a group's tick fails the sessions that unit may have touched (see
    /// `contain_panic`) and the thread goes on with every other group.
    fn tick(&mut self) -> bool {
        let mut worked = false;
        let mut i = 0;
        while i < self.groups.len() {
            let (scheduler, group) = &mut self.groups[i];
            group.worked = false;
            let tick = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scheduler.tick(group, &self.clock))) {
                Ok(tick) => tick,
                Err(payload) => {
                    self.contain_panic(i, Error::from_panic(payload));
                    worked = true;
                    i += 1;
                    continue;
                }
            };
            worked |= group.worked;
            let gone = group.engine.is_some()
                && match tick {
                    Tick::Closed => true,
                    Tick::Idle => group.drivers.is_empty() && group.tasks.pending() == 0,
                    Tick::Yield => false,
                };
            if gone {
                let (_, group) = self.groups.remove(i);
                if let Some(e) = group.engine.filter(|e| e.is_closed()) {
                    self.prefixes.retain(|(w, _)| !std::ptr::eq(w.as_ptr(), Arc::as_ptr(&e)));
                }
            } else {
                i += 1;
            }
        }
        worked
    }

    /// After a panic inside group `i`'s tick: its admitted sessions (those a batched unit may have
    /// stepped, whose runs may be half updated) fail with `error`; sessions still queued, and
    /// the group's pending tasks, move to a fresh group and scheduler, so no state the panic
    /// interrupted is used again.
    fn contain_panic(&mut self, i: usize, error: Error) {
        let (_, group) = &mut self.groups[i];
        // The prefix cache stays: its entries are whole (a put or take finishes before any work
        // that could panic).
        let mut fresh = Group::new(group.engine.clone(), self.models.clone(), group.prefix.clone(), self.caller_caches.clone());
        fresh.tasks = std::mem::take(&mut group.tasks);
        for mut d in std::mem::take(&mut group.drivers) {
            match d.phase() {
                Phase::Outside | Phase::Queued if !d.settled() => fresh.drivers.push(d),
                _ => d.fail(error.replicate()),
            }
        }
        self.groups[i] = (Scheduler::new(false), fresh);
    }

    /// The loop has ended (a panic outside every unit): fails every session and reply that
    /// would otherwise wait forever, with `ENGINE_DEAD`. Commands still queued are dropped the
    /// same way; later calls fail to send.
    fn die(mut self) {
        for (_, group) in &mut self.groups {
            group.tasks.reject_all(|| Error::EngineDead);
            group.drivers.clear();
        }
        while let Ok(cmd) = self.rx.try_recv() {
            if let Command::Open { engine, session, .. } = cmd {
                engine.arrived();
                session.finish(Err(Error::EngineDead), Ok(()), None);
            }
        }
    }

    /// Waits for evaluations still running on this thread's stream before going idle, so an exit
    /// while idle has nothing to wait for.
    fn settle(&mut self) {
        let Some(_gate) = gate::enter(synchronize) else {
            self.park()
        };
        synchronize();
        gate::set_in_flight(false);
    }

    /// The process is exiting: MLX's statics may be torn down after the in-flight work ends.
    /// Touch nothing more, drop nothing, never return.
    fn park(&mut self) -> ! {
        gate::park_engine(synchronize)
    }

    fn handle(&mut self, cmd: Command) {
        let Some(_gate) = gate::enter(synchronize) else {
            self.park()
        };
        let system = &mut self.groups[0].1;
        match cmd {
            Command::Load { id, weights, config, reply } => {
                let models = self.models.clone();
                models.borrow_mut().insert(id, ModelSlot::Loading);
                let load = move || {
                    let mut config = config;
                    // generate()'s default stop set is the CLI's and the server's: config.json's
                    // ids, then the tokenizer's own and generation_config.json's.
                    config.eos_token_ids = tokenizer::model_eos_ids(&config);
                    let built = catch_panic(|| create_model(weights()?, config));
                    let mut slots = models.borrow_mut();
                    // Disposed while it loaded: nothing may keep it.
                    let Some(slot) = slots.get_mut(&id) else { return built.map(drop) };
                    match built {
                        Ok(model) => {
                            *slot = ModelSlot::Ready(Rc::from(model));
                            drop(slots);
                            warm_up();
                            Ok(())
                        }
                        Err(e) => {
                            *slot = ModelSlot::Failed(e.replicate());
                            Err(e)
                        }
                    }
                };
                system.tasks.enqueue(load, reply);
            }
            Command::DropCache(id) => {
                self.caller_caches.borrow_mut().remove(&id);
            }
            Command::CacheFile { lease, path, save, reply } => {
                let (models, store) = (self.models.clone(), self.caller_caches.clone());
                let work = move || {
                    let model = lookup(&models, lease.model())?;
                    if save {
                        caller_cache::save(lease, &store, &*model, &path)
                    } else {
                        caller_cache::load(lease, &store, &*model, &path)
                    }
                };
                system.tasks.enqueue(work, reply);
            }
            Command::Unload(id) => {
                self.models.borrow_mut().remove(&id);
            }
            Command::Open {
                engine,
                session,
                spec,
            } => {
                engine.arrived();
                let driver = Driver::new(engine.clone(), session, spec);
                match self
                    .groups
                    .iter_mut()
                    .find(|(_, g)| g.engine.as_ref().is_some_and(|e| Arc::ptr_eq(e, &engine)))
                {
                    Some((_, g)) => g.drivers.push(driver),
                    None => {
                        let prefix = self.prefix_cache(&engine);
                        let mut g = Group::new(Some(engine), self.models.clone(), prefix, self.caller_caches.clone());
                        g.drivers.push(driver);
                        self.groups.push((Scheduler::new(false), g));
                    }
                }
            }
            Command::Wake => {}
            Command::Logits {
                model,
                prompt,
                reply,
            } => {
                let mut logits = PromptLogits { models: self.models.clone(), model, prompt, done: 0, caches: None };
                system.tasks.enqueue_steps(move || logits.step(), reply);
            }
            Command::Embed { model, rows, reply } => {
                let mut embeddings = PromptEmbeddings::new(self.models.clone(), model, rows);
                system.tasks.enqueue_steps(move || embeddings.step(), reply);
            }
            Command::Run(enqueue) => enqueue(&mut system.tasks),
        }
    }
}

/// After MLX has run once on this thread, its lazily built statics exist; registering the exit
/// hook now makes it run before their destructors. Called by the thread's first tasks.
fn warm_up() {
    static WARMED: std::sync::Once = std::sync::Once::new();
    WARMED.call_once(|| {
        let a = Array::from_slice(&[1.0f32], &[1]);
        let _ = a.add(&a).and_then(|b| b.eval());
        gate::close_at_process_exit();
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::admission::EngineOptions;
    use crate::engine::method::Script;
    use crate::engine::session::{DeliveryLimits, NoHooks, OutputMode, Status};

    #[test]
    fn a_loop_that_ends_fails_every_session_and_reply_with_engine_dead() {
        let (tx, rx) = channel();
        let mut engine_loop = EngineLoop::new(rx);
        let script = Script::from_json(serde_json::json!({"steps": [{"commit": [1]}]})).unwrap();
        let engine = Admission::new(EngineOptions::default());
        let limits = DeliveryLimits { idle_timeout: None, max_queued_events: 8, max_queued_tokens: 8, max_top_logprobs: 2 };
        let session = || Arc::new(Session::new("s".into(), OutputMode::Collect, limits, Arc::new(NoHooks)));
        // One session the loop holds, one still on its way in the channel, one pending task.
        let held = session();
        engine_loop.groups[0].1.drivers.push(Driver::new(engine.clone(), held.clone(), MethodSpec::Script(script.clone())));
        let arriving = session();
        tx.send(Command::Open { engine, session: arriving.clone(), spec: MethodSpec::Script(script) }).unwrap();
        let (reply, mut task) = oneshot::channel::<Result<()>>();
        engine_loop.groups[0].1.tasks.enqueue(|| Ok(()), reply);
        engine_loop.die();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        for s in [held, arriving] {
            match rt.block_on(s.outcome()).status {
                Status::Failed(f) => assert_eq!(f.cause, Some("ENGINE_DEAD")),
                other => panic!("expected ENGINE_DEAD, got {other:?}"),
            }
        }
        assert_eq!(task.try_recv().unwrap().unwrap_err().code(), "ENGINE_DEAD");
        drop(tx);
    }
}
