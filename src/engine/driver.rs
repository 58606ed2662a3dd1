//! The engine thread's side of one session: prepare the plan, step the method while the
//! consumer has room, then settle — close the run, release the lease and the collect budget,
//! and publish the outcome. The seed's `EngineSession.#execute`, as a step machine.
use std::rc::Rc;
use std::sync::Arc;

use super::generate::Generation;
use super::inference::{InferenceEngine, Lease, MethodSpec, Reservation};
use super::method::{MethodRun, Step};
use super::resources::{dispose_all, Release};
use super::session::{MethodResult, Output, OutputMode, Readiness, Session, SessionState};
use crate::error::{Error, Result};
use crate::model::LanguageModel;

/// Largest integer an f64 (a JavaScript number) holds exactly.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

pub struct Driver {
    pub session: Arc<Session>,
    pub engine: Arc<InferenceEngine>,
    spec: Option<MethodSpec>,
    run: Option<Box<dyn MethodRun>>,
    lease: Option<Lease>,
    reservation: Option<Reservation>,
    /// The method's result, held until its last publication has been queued.
    finished: Option<Result<MethodResult>>,
}

/// What a call to [`Driver::advance`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Advanced {
    Worked,
    Idle,
    Terminal,
}

impl Driver {
    pub fn new(engine: Arc<InferenceEngine>, session: Arc<Session>, spec: MethodSpec) -> Self {
        Driver { session, engine, spec: Some(spec), run: None, lease: None, reservation: None, finished: None }
    }

    /// Admission: a started session waits in `preparing` until it gets a lease.
    pub fn admit(&mut self) -> bool {
        if self.lease.is_some() || !self.session.is_started() {
            return false;
        }
        if self.session.state() == SessionState::Created {
            self.session.set_state(SessionState::Preparing);
        }
        if !matches!(self.session.readiness(), Readiness::Runnable) {
            return false;
        }
        self.lease = self.engine.try_lease();
        self.lease.is_some()
    }

    /// One unit of work for this session, if it has any.
    pub fn advance(&mut self, model: &dyn Fn(u64) -> Result<Rc<dyn LanguageModel>>) -> Advanced {
        match self.session.readiness() {
            Readiness::Terminal => Advanced::Terminal,
            Readiness::Settle => {
                let result = match self.session.consumer_error() {
                    Some(message) => Err(Error::Protocol(message)),
                    None => self.finished.take().unwrap_or(Err(Error::Cancelled("settling"))),
                };
                self.settle(result);
                Advanced::Terminal
            }
            _ if self.finished.is_some() => {
                if !self.session.delivered() {
                    return Advanced::Idle;
                }
                let result = self.finished.take().expect("checked");
                self.settle(result);
                Advanced::Terminal
            }
            Readiness::Waiting => Advanced::Idle,
            Readiness::Runnable if self.lease.is_none() => Advanced::Idle,
            Readiness::Runnable => {
                let step = match self.run.as_mut() {
                    None => self.prepare(model).map(|()| Step::Continue),
                    Some(run) => run.step(&mut self.session.output()),
                };
                self.conclude(step)
            }
        }
    }

    /// The batch this session's next unit may join: its model, when that unit is a decode
    /// step of a continuous generation that may run now.
    pub fn batch_key(&mut self) -> Option<*const ()> {
        if self.lease.is_none() || self.finished.is_some() || self.session.readiness() != Readiness::Runnable {
            return None;
        }
        let g = self.run.as_mut()?.as_generation()?;
        if g.decode_ready() {
            g.batch_key()
        } else {
            None
        }
    }

    /// The generation and the output a batched step works on (see `batch_key`).
    pub fn batch_parts(&mut self) -> Option<(&mut Generation, Output<'_>)> {
        let out = self.session.output();
        Some((self.run.as_mut()?.as_generation()?, out))
    }

    /// Handles the outcome of one unit of the method's work.
    pub fn conclude(&mut self, step: Result<Step>) -> Advanced {
        let result = match step {
            Ok(Step::Continue) => return Advanced::Worked,
            Ok(Step::Done(result)) => Ok(result),
            Err(e) => Err(e),
        };
        // What was published reaches the consumer before the outcome.
        if !self.session.delivered() {
            self.finished = Some(result);
            self.session.mark_finishing();
            return Advanced::Worked;
        }
        self.settle(result);
        Advanced::Terminal
    }

    fn prepare(&mut self, model: &dyn Fn(u64) -> Result<Rc<dyn LanguageModel>>) -> Result<()> {
        let plan = match self.spec.take().expect("prepared once") {
            MethodSpec::Generate { model: id, prompt, opts, continuous } => Generation::plan(model(id)?, prompt, opts, continuous),
            MethodSpec::Script(script) => script.plan(),
        };
        let limit = plan.output_token_limit;
        if limit.fract() != 0.0 || !(0.0..=MAX_SAFE_INTEGER).contains(&limit) {
            return Err(Error::Protocol(format!("invalid planned output token limit {limit}")));
        }
        if self.session.mode == OutputMode::Collect {
            self.reservation = Some(self.engine.reserve_collect(limit as u64)?);
        }
        self.run = Some((plan.start)()?);
        self.session.begin_output(limit as u64);
        Ok(())
    }

    /// Closes the run and releases everything the session held, then publishes the outcome.
    fn settle(&mut self, result: Result<MethodResult>) {
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
