//! Sessions outside an engine: delivery bounds, collect buffers, cancellation, reading.
use super::*;

fn limits(events: usize, tokens: usize) -> DeliveryLimits {
    DeliveryLimits { idle_timeout: None, max_queued_events: events, max_queued_tokens: tokens, max_top_logprobs: 2 }
}

fn session(mode: OutputMode, l: DeliveryLimits) -> Session {
    Session::new("s".into(), mode, l, Arc::new(NoHooks))
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
}

fn tokens(events: &[SessionEvent]) -> Vec<(u64, Vec<u32>)> {
    events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::Committed { sequence, token_ids, .. } => Some((*sequence, token_ids.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn collect_buffers_grow_with_their_tokens_not_the_planned_limit() {
    let s = session(OutputMode::Collect, limits(8, 64));
    // A limit of u32::MAX tokens (a caller's maxTokens) once reserved 16 GB here.
    s.begin_output(u64::from(u32::MAX));
    assert_eq!(s.lock().buffer.as_ref().map(Vec::capacity), Some(0));
    s.output().commit(&[1, 2, 3], None).unwrap();
    assert!(s.lock().buffer.as_ref().is_some_and(|b| b.len() == 3 && b.capacity() < 1024));
}

#[test]
fn stream_chunks_and_blocks_until_consumed() {
    let s = session(OutputMode::Stream, limits(8, 4));
    assert_eq!(s.readiness(), Readiness::Waiting, "a stream waits for its first read");
    block_on(async {
        s.lock().started = true;
        s.begin_output(10);
        s.output().commit(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], None).unwrap();
        assert_eq!(s.readiness(), Readiness::Waiting, "only 4 tokens fit");
        let first = s.next_batch().await.unwrap().unwrap();
        assert_eq!(tokens(&first), vec![(0, vec![1, 2, 3, 4])]);
        s.consumed(1);
        let second = s.next_batch().await.unwrap().unwrap();
        assert_eq!(tokens(&second), vec![(1, vec![5, 6, 7, 8])]);
        s.consumed(1);
        assert_eq!(s.readiness(), Readiness::Runnable);
        assert_eq!(s.committed(), 10);
    });
}

#[test]
fn commit_checks_in_order() {
    let s = session(OutputMode::Stream, limits(8, 8));
    s.begin_output(2);
    let lp = |top: usize| TokenLogprobs { logprob: -1.0, top: vec![crate::sample::logprobs::TopLogprob { id: 0, logprob: -1.0 }; top] };
    let err = |r: Result<()>| r.unwrap_err().to_string();
    assert!(err(s.output().commit(&[1, 2, 3], None)).contains("limit"));
    assert!(err(s.output().commit(&[1], Some(&[lp(0), lp(0)]))).contains("align"));
    assert!(err(s.output().commit(&[1], Some(&[lp(3)]))).contains("capacity"));
    s.cancel(CancelReason::Requested);
    assert_eq!(s.output().commit(&[1], None).unwrap_err().code(), "CANCELLED");
}

#[test]
fn never_started_cancel_is_terminal_with_zero_tokens() {
    let s = session(OutputMode::Stream, limits(8, 8));
    s.cancel(CancelReason::ConsumerClosed);
    let o = block_on(s.outcome());
    assert_eq!(o.status, Status::Cancelled(CancelReason::ConsumerClosed));
    assert_eq!(o.committed_tokens, 0);
}

#[test]
fn outcome_precedence() {
    let ok = || Ok(MethodResult { finish_reason: FinishReason::Length, metrics: GenerateStats::default() });
    let s = session(OutputMode::Collect, limits(8, 8));
    s.begin_output(4);
    s.output().commit(&[7, 8], None).unwrap();
    s.cancel(CancelReason::Requested);
    s.finish(Err(Error::Protocol("boom".into())), Ok(()), None);
    let o = block_on(s.outcome());
    assert_eq!(o.status, Status::Cancelled(CancelReason::Requested), "cancelled beats failed");
    assert_eq!(o.output, Some(vec![7, 8]));

    let s = session(OutputMode::Collect, limits(8, 8));
    s.begin_output(4);
    s.cancel(CancelReason::Requested);
    s.finish(ok(), Err(Error::Protocol("close failed".into())), None);
    match block_on(s.outcome()).status {
        Status::Failed(f) => {
            assert_eq!(f.code, "cleanup_failed");
            assert_eq!(f.cleanup_error.as_deref(), Some("close failed"));
        }
        other => panic!("cleanup failure beats cancellation, got {other:?}"),
    }
}

#[test]
fn callback_stop_uncommits_undelivered_tokens() {
    let s = session(OutputMode::Callback, limits(8, 8));
    s.begin_output(10);
    s.output().commit(&[1, 2], None).unwrap();
    let got = block_on(s.next_batch()).unwrap().unwrap();
    s.consumed(got.len());
    s.output().commit(&[3], None).unwrap();
    s.stop_output();
    assert_eq!(s.committed(), 2);
    assert!(s.output().stopped());
}

#[test]
fn a_finished_stream_discards_what_the_method_still_commits() {
    let s = session(OutputMode::Stream, limits(2, 2));
    s.begin_output(10);
    s.output().commit(&[1, 2], None).unwrap();
    s.output().commit(&[3, 4], None).unwrap();
    assert!(s.lock().producer_waiting, "the queue is full");
    s.finish_output();
    assert!(s.output().stopped());
    assert!(!s.lock().producer_waiting && s.lock().outbox.is_empty(), "no longer waiting for the consumer");
    s.output().commit(&[5], None).unwrap();
    s.output().progress(1.0, None).unwrap();
    assert_eq!(s.committed(), 0, "nothing the consumer did not take counts");
}
