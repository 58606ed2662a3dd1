//! What a session runs: a plan (the output limit plus a way to start the method) and the method's
//! run, stepped one unit at a time by the engine thread. Sessions know nothing else about methods.
use std::rc::Rc;

use mlx_rs::Array;
use serde::{Deserialize, Deserializer};

use super::events::{FinishReason, GenerateStats};
use super::rows::{Feed, RowCaches};
use super::session::{MethodResult, Output};
use crate::cache::LayerCache;
use crate::error::{Error, Result};
use crate::model::LanguageModel;
use crate::sample::logprobs::TokenLogprobs;

pub enum Step {
    Continue,
    Done(MethodResult),
}

pub trait MethodRun {
    /// One unit of work (a prefill chunk, a decode step); publishes through `out`.
    fn step(&mut self, out: &mut Output<'_>) -> Result<Step>;
    /// Timings so far.
    fn metrics(&self) -> GenerateStats;
    /// Releases the run's native state; always called once, whatever happened.
    fn close(self: Box<Self>) -> Result<()>;
    /// The row this run steps through its model, if it does: the engine then runs its steps with
    /// other rows of the model (`rows::step`).
    fn row(&mut self) -> Option<&mut dyn Row> {
        None
    }
    fn row_ref(&self) -> Option<&dyn Row> {
        None
    }
}

/// A method's side of the model steps (see `rows`): what it feeds each step, what it does with
/// the logits, and what the scheduler needs to know to place its steps.
pub trait Row {
    fn model(&self) -> &Rc<dyn LanguageModel>;
    fn caches(&mut self) -> &mut RowCaches;
    /// Whether its steps may run in one graph with other rows of its model (its placement is
    /// continuous).
    fn batchable(&self) -> bool;
    /// Whether its caches may join a stacked batch cache; a row that trims its caches after a
    /// step keeps its own, and the rows it steps with then attend row by row.
    fn stackable(&self) -> bool {
        true
    }
    /// Prompt tokens still to prefill before it decodes.
    fn prompt_left(&self) -> usize;
    /// The most prompt tokens one of its steps may take.
    fn chunk_limit(&self) -> usize;
    /// The prompt and how much of it the caches hold, when the row may start from another row's
    /// prefix (its placement uses the prompt cache).
    fn shared_prompt(&self) -> Option<(&[u32], usize)>;
    /// Starts from caches holding the first `n` prompt tokens.
    fn adopt_prefix(&mut self, caches: Vec<LayerCache>, n: usize);
    /// What it feeds the next step, at most `max` tokens; `None`: nothing (it has stopped, or
    /// only publishes what the step before computed).
    fn propose(&mut self, out: &Output<'_>, max: usize) -> Result<Option<Feed>>;
    /// The step's logits for its feed, as it asked (`None` if it fed nothing or wanted none);
    /// returns what to evaluate ahead, before anything is read.
    fn accept(&mut self, logits: Option<Array>) -> Result<Vec<Array>>;
    /// Work to do while the step's forward runs, before any row reads its results (a grammar
    /// row computes its mask here).
    fn overlap(&mut self) -> Result<()> {
        Ok(())
    }
    /// Publishes what it can now; says whether it goes on.
    fn publish(&mut self, out: &mut Output<'_>) -> Result<Step>;
}

/// A method's plan: its output limit, and how to start its run.
pub struct Plan {
    /// Tokens the method may publish at most; must be a safe integer ≥ 0 (an `f64`, as a
    /// planner's arithmetic may produce any number and the session rejects bad ones).
    pub output_token_limit: f64,
    pub start: Box<dyn FnOnce() -> Result<Box<dyn MethodRun>>>,
}

/// A method that replays a script: the session contract's test double, usable from JavaScript
/// (`testing.createScriptedEngine`) so the conformance suite runs the real session code.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Script {
    pub steps: Vec<ScriptStep>,
    /// Default: every token the script commits.
    #[serde(default, deserialize_with = "some_number")]
    pub output_token_limit: Option<f64>,
    #[serde(default = "length")]
    pub finish_reason: FinishReason,
    /// `close()` fails with this message.
    pub cleanup_error: Option<String>,
}

fn length() -> FinishReason {
    FinishReason::Length
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScriptStep {
    pub commit: Option<Vec<u32>>,
    pub logprobs: Option<Vec<TokenLogprobs>>,
    pub progress: Option<ScriptProgress>,
    /// The method fails with this message.
    pub fail: Option<String>,
    /// The method panics with this message: a bug inside a unit of engine work, for the tests of
    /// panic isolation.
    pub panic: Option<String>,
    pub repeat: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptProgress {
    #[serde(deserialize_with = "number")]
    pub completed: f64,
    #[serde(default, deserialize_with = "some_number")]
    pub total: Option<f64>,
}

/// A number, or its text: JSON cannot carry NaN or infinities, so the binding sends those as
/// strings ("NaN", "Infinity") and scripts can still exercise the checks that reject them.
fn number<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Number {
        Value(f64),
        Text(String),
    }
    match Number::deserialize(d)? {
        Number::Value(v) => Ok(v),
        Number::Text(t) => t.parse().map_err(serde::de::Error::custom),
    }
}

fn some_number<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<f64>, D::Error> {
    number(d).map(Some)
}

impl Script {
    pub fn from_json(v: serde_json::Value) -> Result<Self> {
        serde_json::from_value(v).map_err(|e| Error::option("script", e.to_string()))
    }

    pub fn plan(&self) -> Plan {
        let total: u64 = self
            .steps
            .iter()
            .map(|s| s.commit.as_ref().map_or(0, Vec::len) as u64 * u64::from(s.repeat.unwrap_or(1)))
            .sum();
        let script = self.clone();
        Plan {
            output_token_limit: self.output_token_limit.unwrap_or(total as f64),
            start: Box::new(move || Ok(Box::new(ScriptRun { script, step: 0, repeat: 0, committed: 0 }) as Box<dyn MethodRun>)),
        }
    }
}

struct ScriptRun {
    script: Script,
    step: usize,
    repeat: u32,
    committed: u32,
}

impl MethodRun for ScriptRun {
    fn step(&mut self, out: &mut Output<'_>) -> Result<Step> {
        let Some(step) = self.script.steps.get(self.step) else {
            return Ok(Step::Done(MethodResult { finish_reason: self.script.finish_reason, metrics: self.metrics() }));
        };
        if out.stopped() {
            return Ok(Step::Done(MethodResult { finish_reason: FinishReason::Stop, metrics: self.metrics() }));
        }
        if let Some(p) = &step.progress {
            out.progress(p.completed, p.total)?;
        }
        if let Some(ids) = &step.commit {
            out.commit(ids, step.logprobs.as_deref())?;
            self.committed += ids.len() as u32;
        }
        if let Some(message) = &step.fail {
            return Err(Error::Protocol(message.clone()));
        }
        if let Some(message) = &step.panic {
            panic!("{message}");
        }
        self.repeat += 1;
        if self.repeat >= step.repeat.unwrap_or(1) {
            self.step += 1;
            self.repeat = 0;
        }
        Ok(Step::Continue)
    }

    fn metrics(&self) -> GenerateStats {
        GenerateStats { generated_tokens: self.committed, ..Default::default() }
    }

    fn close(self: Box<Self>) -> Result<()> {
        match self.script.cleanup_error {
            Some(m) => Err(Error::Protocol(m)),
            None => Ok(()),
        }
    }
}
