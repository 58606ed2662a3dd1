//! The engine thread's side of one session: prepare the plan, step the method while the
//! consumer has room, then settle — close the run, release the lease and the collect budget,
//! and publish the outcome. mlx-bun's `EngineSession.#execute`, as a step machine.
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use super::caller_cache::CallerCaches;
use super::models::ModelId;
use super::generate::{Caches, Generation, PrefixUse};
use super::admission::{Admission, Lease, Reservation};
use super::placement::{self, Mechanism, Method};
use super::speculative::Speculative;
use super::request::MethodSpec;
use super::method::{MethodRun, Plan, Row, Step};
use super::resources::{dispose_all, Release};
use super::session::{MethodResult, Output, OutputMode, Readiness, Session, SessionState};
use crate::error::{catch_panic, Error, Result};
use crate::cache::{KvQuantOptions, PrefixCache};
use crate::model::LanguageModel;

/// A row's model, as an identity: rows step together only within one model.
pub fn model_key(row: &dyn Row) -> *const () {
    Rc::as_ptr(row.model()) as *const ()
}

/// Largest integer an f64 (a JavaScript number) holds exactly.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

pub struct Driver {
    pub session: Arc<Session>,
    pub engine: Arc<Admission>,
    spec: Option<MethodSpec>,
    run: Option<Box<dyn MethodRun>>,
    lease: Option<Lease>,
    reservation: Option<Reservation>,
    /// The method's result, held until its last publication has been queued.
    finished: Option<Result<MethodResult>>,
    settled: bool,
    /// The group's batched decode step this session last took part in (0: none).
    pub batched_at: u64,
    /// Bytes its context was admitted with under the engine's memory budget (0 without one).
    pub reserved_bytes: f64,
}

/// Where a session stands in its engine's group (the scheduler's view of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Not started by its consumer yet, or already settled.
    Outside,
    /// Started, waiting for admission.
    Queued,
    /// Admitted: its run is being created or its prompt prefilled.
    Preparing,
    /// Decoding (or done and waiting for its last events to be delivered).
    Active,
}

impl Driver {
    pub fn new(engine: Arc<Admission>, session: Arc<Session>, spec: MethodSpec) -> Self {
        Driver {
            session,
            engine,
            spec: Some(spec),
            run: None,
            lease: None,
            reservation: None,
            finished: None,
            settled: false,
            batched_at: 0,
            reserved_bytes: 0.0,
        }
    }

    pub fn settled(&self) -> bool {
        self.settled
    }

    pub fn phase(&self) -> Phase {
        if self.settled {
            return Phase::Outside;
        }
        if self.lease.is_none() {
            return if self.session.is_started() {
                Phase::Queued
            } else {
                Phase::Outside
            };
        }
        match self.run.as_ref().map(|r| r.row_ref().map(|row| row.prompt_left() == 0)) {
            None | Some(Some(false)) => Phase::Preparing,
            Some(_) => Phase::Active,
        }
    }

    /// What a generation's whole context needs of memory: its model, its positions (prompt and
    /// `maxTokens`), its KV quantization and its prefill chunk. `None` for other methods.
    pub fn context(&self) -> Option<(ModelId, usize, &KvQuantOptions, usize)> {
        match &self.spec {
            Some(MethodSpec::Generate { model, prompt, opts, .. }) => Some((*model, prompt.len() + opts.max_tokens as usize, &opts.kv, opts.prefill_chunk_size as usize)),
            _ => None,
        }
    }

    /// Prompt tokens still to prefill before the first decode step.
    pub fn preparation_tokens(&self) -> usize {
        match (&self.spec, self.run.as_ref().and_then(|r| r.row_ref())) {
            (Some(MethodSpec::Generate { prompt, .. }), _) => prompt.len().saturating_sub(1),
            (_, Some(row)) => row.prompt_left(),
            _ => 0,
        }
    }

    /// A started session is `preparing` from the consumer's point of view until it runs.
    pub fn touch(&self) {
        if self.session.is_started() && self.session.state() == SessionState::Created {
            self.session.set_state(SessionState::Preparing);
        }
    }

    /// Admission: takes an execution lease, if the engine has one free.
    pub fn admit(&mut self) -> bool {
        if self.lease.is_none() {
            self.lease = self.engine.try_lease();
        }
        self.lease.is_some()
    }

    /// Settles a session that needs no more work: cancelled, consumer failed, or finished with
    /// everything delivered. Returns whether it is settled.
    pub fn housekeep(&mut self) -> bool {
        if self.settled {
            return true;
        }
        match self.session.readiness() {
            Readiness::Terminal => self.settled = true,
            Readiness::Settle => {
                let result = match self.session.consumer_error() {
                    Some(message) => Err(Error::Protocol(message)),
                    None => self
                        .finished
                        .take()
                        .unwrap_or(Err(Error::Cancelled("settling"))),
                };
                self.settle(result);
            }
            _ if self.finished.is_some() && self.session.delivered() => {
                let result = self.finished.take().expect("checked");
                self.settle(result);
            }
            _ => {}
        }
        self.settled
    }

    /// Whether the session holds a lease, has work left and its consumer has room.
    pub fn runnable(&self) -> bool {
        !self.settled
            && self.lease.is_some()
            && self.finished.is_none()
            && self.session.readiness() == Readiness::Runnable
    }

    /// One unit of this session's own work: creating its run, or one step of it.
    /// A panic inside it fails this session alone (`INTERNAL_ERROR`), released as after an error.
    pub fn step(&mut self, model: &dyn Fn(u64) -> Result<Option<Rc<dyn LanguageModel>>>, prefix: &Rc<RefCell<PrefixCache>>, caller_caches: &CallerCaches) {
        let step = catch_panic(|| match self.run.as_mut() {
            None => self.prepare(model, prefix, caller_caches).map(|()| Step::Continue),
            Some(run) => run.step(&mut self.session.output()),
        });
        self.conclude(step);
    }

    /// Ends the session with `error` at once, dropping what it held without running its
    /// releases: after a panic inside a unit this session took part in, its run may be half
    /// updated, and closing it could fail the same way.
    pub fn fail(&mut self, error: Error) {
        if self.settled {
            return;
        }
        self.settled = true;
        self.run = None;
        self.reservation = None;
        self.lease = None;
        self.session.finish(Err(error), Ok(()), None);
    }

    /// The row this session's run steps through its model, once the run exists.
    pub fn row(&self) -> Option<&dyn Row> {
        self.run.as_ref()?.row_ref()
    }

    pub fn row_mut(&mut self) -> Option<&mut dyn Row> {
        self.run.as_mut()?.row()
    }

    /// The batch this session's next unit may join: its model, when that unit is a decode
    /// step of a continuous generation that may run now.
    pub fn batch_key(&mut self) -> Option<*const ()> {
        if !self.runnable() {
            return None;
        }
        self.decode_key()
    }

    /// The batch this session's next decode step would join, when all it waits for is its
    /// consumer taking the tokens already published.
    pub fn awaited_key(&mut self) -> Option<*const ()> {
        if self.settled || self.lease.is_none() || self.finished.is_some() || self.session.readiness() != Readiness::Waiting {
            return None;
        }
        self.decode_key()
    }

    fn decode_key(&mut self) -> Option<*const ()> {
        let row = self.row()?;
        (row.prompt_left() == 0 && row.batchable()).then(|| model_key(row))
    }

    /// The row and the output a batched unit works on.
    pub fn batch_parts(&mut self) -> Option<(&mut dyn Row, Output<'_>)> {
        let out = self.session.output();
        Some((self.run.as_mut()?.row()?, out))
    }

    /// Handles the outcome of one unit of the method's work.
    pub fn conclude(&mut self, step: Result<Step>) {
        let result = match step {
            Ok(Step::Continue) => return,
            Ok(Step::Done(result)) => Ok(result),
            Err(e) => Err(e),
        };
        // What was published reaches the consumer before the outcome.
        if !self.session.delivered() {
            self.finished = Some(result);
            self.session.mark_finishing();
            return;
        }
        self.settle(result);
    }

    fn prepare(&mut self, model: &dyn Fn(u64) -> Result<Option<Rc<dyn LanguageModel>>>, prefix: &Rc<RefCell<PrefixCache>>, caller_caches: &CallerCaches) -> Result<()> {
        // A model whose load is still queued: this unit does nothing, the next one looks again.
        let (loaded, draft) = match &self.spec {
            Some(MethodSpec::Generate { model: id, draft, .. }) => {
                let Some(m) = model(*id)? else { return Ok(()) };
                let d = match draft {
                    Some(d) => match model(d.model)? {
                        Some(dm) => Some((dm, d.tokens)),
                        None => return Ok(()),
                    },
                    None => None,
                };
                (Some(m), d)
            }
            _ => (None, None),
        };
        let plan = match self.spec.take().expect("prepared once") {
            MethodSpec::Generate { model: _, prompt, opts, prefix: key, cache, draft: _, fill: plan } => {
                let options = &self.engine.options;
                let model = loaded.expect("looked up above");
                let checkpoints = crate::model::restores_checkpoints(model.config());
                let placed = placement::for_generation(&opts, draft.is_some(), checkpoints, &placement::features(options.grammar_jump, options.fill.enabled()));
                let continuous = placed.mechanism == Mechanism::Continuous;
                let fill = placed.fill.then(|| (options.fill.clone(), plan));
                if let (Some(draft), Method::Speculative) = (&draft, placed.method) {
                    let plan = Speculative::plan(model, Some(draft.clone()), fill, prompt, opts, continuous, Caches::Fresh);
                    return self.start(plan);
                }
                // A caller's own cache replaces the engine's prefix cache.
                let caches = match cache {
                    Some(lease) => Caches::Caller(lease, caller_caches.clone()),
                    None if placed.prompt_cache && prefix.borrow().enabled() => {
                        // Caches quantized differently hold different numbers: each scheme has
                        // its own entries.
                        let namespace = match opts.kv.policy(model.new_cache().len(), model.config().head_dim)? {
                            Some(kv) => format!("{}\u{0}{}", key.namespace, kv.tag()),
                            None => key.namespace,
                        };
                        Caches::Prefix(PrefixUse { cache: prefix.clone(), namespace, session: key.session })
                    }
                    None => Caches::Fresh,
                };
                match fill {
                    Some(fill) => Speculative::plan(model, None, Some(fill), prompt, opts, continuous, caches),
                    None => Generation::plan(model, prompt, opts, &placed, caches),
                }
            }
            MethodSpec::Script(script) => script.plan(),
        };
        self.start(plan)
    }

    /// Starts the method's run, within the output limit its plan states.
    fn start(&mut self, plan: Plan) -> Result<()> {
        let limit = plan.output_token_limit;
        if limit.fract() != 0.0 || !(0.0..=MAX_SAFE_INTEGER).contains(&limit) {
            return Err(Error::Protocol(format!(
                "invalid planned output token limit {limit}"
            )));
        }
        if self.session.mode == OutputMode::Collect {
            self.reservation = Some(self.engine.reserve_collect(limit as u64)?);
        }
        self.run = Some((plan.start)()?);
        self.session.begin_output(limit as u64);
        Ok(())
    }

    /// Closes the run and releases everything the session held, then publishes the outcome.
    pub fn settle(&mut self, result: Result<MethodResult>) {
        self.settled = true;
        self.session.set_state(SessionState::Settling);
        let metrics = self.run.as_ref().map(|r| r.metrics());
        let run = self.run.take();
        let lease = self.lease.take();
        let reservation = self.reservation.take();
        let releases: Vec<Release<'_>> = vec![
            Box::new(move || run.map_or(Ok(()), |r| r.close())),
            Box::new(move || {
                drop(reservation);
                Ok(())
            }),
            Box::new(move || {
                drop(lease);
                Ok(())
            }),
        ];
        let cleanup = dispose_all(releases);
        self.session.finish(result, cleanup, metrics);
    }
}

/// A session whose driver goes away unsettled would wait forever: that happens only when the
/// engine thread ends (see `thread::EngineLoop`), so it ends with `ENGINE_DEAD`.
impl Drop for Driver {
    fn drop(&mut self) {
        self.fail(Error::EngineDead);
    }
}
