//! One request's generation as an HTTP handler reads it: an engine session streamed into text
//! pieces (detokenized, stop strings cut), then a summary with the usage both APIs report.
//! Dropping a `Run` before its end (the client went away) cancels the session, so no decode
//! goes on for nobody.
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::context::ServerContext;
use super::error::ApiError;
use super::stop::StopMatcher;
use crate::engine::fill::FillPlan;
use crate::engine::session::{CancelReason, OutputMode, Session, SessionEvent, Status};
use crate::engine::{FinishReason, InferenceEngine, MethodSpec};
use crate::error::Error;
use crate::sample::logprobs::TokenLogprobs;
use crate::sample::GenerateOptions;
use crate::tokenizer::detok::StreamDecoder;

/// A piece of output: new text and, when asked for, each new token's logprobs.
pub struct Piece {
    pub text: String,
    pub tokens: Vec<(u32, TokenLogprobs)>,
}

#[derive(Debug, Clone)]
pub struct Summary {
    /// `Stop` also when a stop string ended the output (`stop_sequence` says which).
    pub finish_reason: FinishReason,
    pub stop_sequence: Option<String>,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    /// Tokens up to and including the one that completed a stop string.
    pub completion_tokens: u32,
    pub ttft_ms: f64,
}

pub enum Chunk {
    Piece(Piece),
    Done(Summary),
}

pub struct Run {
    session: Arc<Session>,
    decoder: StreamDecoder,
    stop: StopMatcher,
    events: VecDeque<SessionEvent>,
    tokens: u32,
    logprobs: bool,
    /// Set once the output is over: by the session's end, or by a stop string (`Some`).
    end: Option<Option<String>>,
    started: Instant,
    ttft_ms: Option<f64>,
    ended: bool,
}

impl Run {
    /// Opens the session (admission may refuse it: `429`).
    /// `fill`: the prompt's strict fill rows.
    pub fn start(engine: &Arc<InferenceEngine>, ctx: &ServerContext, prompt: Vec<u32>, opts: GenerateOptions, stop: Vec<String>, fill: FillPlan) -> Result<Run, ApiError> {
        let logprobs = opts.wants_logprobs();
        // The server's draft (its vocabulary checked at start) goes with every request; placement
        // drops it where the request cannot take it (a quantized KV cache).
        let draft = ctx.draft;
        let spec = MethodSpec::Generate { model: ctx.model, prompt, opts, prefix: Default::default(), cache: None, draft, fill };
        let session = engine.open(spec, OutputMode::Stream, false)?;
        session.claim_reader()?;
        Ok(Run {
            session,
            decoder: StreamDecoder::new(&ctx.tokenizer, true),
            stop: StopMatcher::new(stop),
            events: VecDeque::new(),
            tokens: 0,
            logprobs,
            end: None,
            started: Instant::now(),
            ttft_ms: None,
            ended: false,
        })
    }

    /// The next piece of output, then the summary; `None` after the summary.
    pub async fn next(&mut self) -> Option<Result<Chunk, ApiError>> {
        if self.ended {
            return None;
        }
        let result = self.advance().await;
        if !matches!(result, Ok(Chunk::Piece(_))) {
            self.ended = true;
        }
        Some(result)
    }

    async fn advance(&mut self) -> Result<Chunk, ApiError> {
        loop {
            if self.end.is_some() {
                return self.summary().await;
            }
            if self.events.is_empty() {
                match self.session.next_batch().await? {
                    Some(batch) => self.events.extend(batch),
                    None => {
                        let tail = self.decoder.finish()?;
                        let matched = self.stop.push(&tail);
                        let mut text = matched.text;
                        if matched.stop.is_none() {
                            text += &self.stop.finish();
                        }
                        self.end = Some(matched.stop);
                        if !text.is_empty() {
                            return Ok(Chunk::Piece(Piece { text, tokens: Vec::new() }));
                        }
                        continue;
                    }
                }
            }
            let mut piece = Piece { text: String::new(), tokens: Vec::new() };
            while let Some(event) = self.events.pop_front() {
                self.session.consumed(1);
                let SessionEvent::Committed { token_ids, logprobs, .. } = event else { continue };
                self.ttft_ms.get_or_insert_with(|| self.started.elapsed().as_secs_f64() * 1e3);
                for (i, &id) in token_ids.iter().enumerate() {
                    self.tokens += 1;
                    if self.logprobs {
                        if let Some(lp) = logprobs.as_ref().and_then(|l| l.get(i)) {
                            piece.tokens.push((id, lp.clone()));
                        }
                    }
                    let matched = self.stop.push(&self.decoder.push(id)?);
                    piece.text += &matched.text;
                    if let Some(stop) = matched.stop {
                        // The rest is cut: the session stops at its next step and hands its
                        // caches to the prefix cache, for the conversation's next turn.
                        self.end = Some(Some(stop));
                        self.session.finish_output();
                        self.events.clear();
                        return Ok(Chunk::Piece(piece));
                    }
                }
            }
            if !piece.text.is_empty() || !piece.tokens.is_empty() {
                return Ok(Chunk::Piece(piece));
            }
        }
    }

    async fn summary(&mut self) -> Result<Chunk, ApiError> {
        let outcome = self.session.outcome().await;
        let stop_sequence = self.end.take().flatten();
        let finish_reason = match outcome.status {
            // The answer was complete at the stop string, whatever ended the session after it.
            _ if stop_sequence.is_some() => FinishReason::Stop,
            Status::Completed(r) => r.finish_reason,
            Status::Cancelled(reason) => return Err(Error::Cancelled(reason.as_str().into()).into()),
            Status::Failed(f) => {
                let code = f.cause.unwrap_or(f.code);
                return Err(Error::Copied { code, message: f.message }.into());
            }
        };
        let m = outcome.metrics.unwrap_or_default();
        Ok(Chunk::Done(Summary {
            finish_reason,
            stop_sequence,
            prompt_tokens: m.prompt_tokens,
            cached_tokens: m.cached_tokens,
            completion_tokens: self.tokens,
            ttft_ms: self.ttft_ms.unwrap_or_else(|| self.started.elapsed().as_secs_f64() * 1e3),
        }))
    }

    /// Reads everything: the whole text, the tokens' logprobs and the summary.
    pub async fn collect(mut self) -> Result<(Piece, Summary), ApiError> {
        let mut all = Piece { text: String::new(), tokens: Vec::new() };
        while let Some(chunk) = self.next().await {
            match chunk? {
                Chunk::Piece(p) => {
                    all.text += &p.text;
                    all.tokens.extend(p.tokens);
                }
                Chunk::Done(s) => return Ok((all, s)),
            }
        }
        Err(ApiError::from(Error::Internal("the generation ended without a summary".into())))
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if !self.ended {
            self.session.cancel(CancelReason::ConsumerClosed);
        }
    }
}
