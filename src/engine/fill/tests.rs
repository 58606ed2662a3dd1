use std::collections::HashMap;

use super::*;

const EOS: [u32; 1] = [99];

fn echo(max_span: usize, k: usize) -> FillConfig {
    FillConfig { mode: FillMode::Echo, max_span, k, ..Default::default() }
}

fn row(trigger: &[u32], emit: &[u32], kind: FillKind) -> FillRow {
    FillRow { trigger: trigger.to_vec(), emit: emit.to_vec(), kind }
}

#[test]
fn strict_rows_are_asserted_and_the_longest_trigger_wins() {
    let plan = FillPlan {
        rows: vec![row(&[5], &[1, 2], FillKind::Scaffold), row(&[4, 5], &[3, 3, 3], FillKind::Name), row(&[9], &[7], FillKind::Close)],
        ..Default::default()
    };
    let mut s = FillSession::new(&FillConfig { mode: FillMode::Strict, ..Default::default() }, plan, &EOS, &[0, 4]).unwrap();
    s.observe(5);
    let p = s.propose(100, None).expect("the longer row");
    assert_eq!((p.ids.as_slice(), p.policy, p.origin), (&[3, 3, 3][..], Policy::Assert, Origin::Schema));
    s.commit(p, 3, &[]);
    s.observe(0);
    s.observe(5);
    let p = s.propose(100, None).expect("the scaffold row");
    assert_eq!((p.ids.as_slice(), p.origin), (&[1, 2][..], Origin::Template));
    // A span shorter than 2 is never proposed; a budget clamp keeps a strict row asserted.
    s.commit(p, 2, &[]);
    s.observe(9);
    assert!(s.propose(100, None).is_none());
    s.observe(4);
    s.observe(5);
    let p = s.propose(2, None).expect("clamped to the budget");
    assert_eq!((p.ids.as_slice(), p.policy), (&[3, 3][..], Policy::Assert));
    assert!(s.propose(1, None).is_none());
    assert_eq!((s.stats.events, s.stats.injected, s.stats.strict, s.stats.echo, s.stats.decode_steps), (2, 5, 5, 0, 6));
}

#[test]
fn strict_rows_come_before_echo_and_echo_is_off_in_strict_mode() {
    let prompt = [1, 2, 3, 4, 5, 6, 1, 2];
    let plan = || FillPlan { rows: vec![row(&[1, 2], &[8, 8], FillKind::Scaffold)], ..Default::default() };
    let mut s = FillSession::new(&echo(32, 2), plan(), &EOS, &prompt).unwrap();
    assert_eq!(s.propose(100, None).unwrap().ids, vec![8, 8]);
    let mut s = FillSession::new(&echo(32, 2), FillPlan::default(), &EOS, &prompt).unwrap();
    assert_eq!(s.propose(100, None).unwrap().ids, vec![3, 4, 5, 6, 1, 2]);
    let mut s = FillSession::new(&FillConfig { mode: FillMode::Strict, k: 2, ..Default::default() }, FillPlan::default(), &EOS, &prompt).unwrap();
    assert!(s.propose(100, None).is_none());
}

#[test]
fn the_clamp_cuts_before_a_stop_token_then_at_a_delimiter_then_to_span_and_budget() {
    // Two agreeing occurrences of [1, 2] followed by "3 4 50 6 99": 50 delimits, 99 stops.
    let prompt = [1, 2, 3, 4, 50, 6, 99, 0, 1, 2, 3, 4, 50, 6, 99, 7, 1, 2];
    let plan = |delims: &[u32]| FillPlan { delimiters: delims.iter().copied().collect(), ..Default::default() };
    let mut s = FillSession::new(&echo(32, 2), plan(&[]), &EOS, &prompt).unwrap();
    let p = s.propose(100, None).unwrap();
    assert_eq!((p.ids.as_slice(), p.policy), (&[3, 4, 50, 6][..], Policy::Verify), "cut before the stop token: a weakened claim");
    let mut s = FillSession::new(&echo(32, 2), plan(&[50]), &EOS, &prompt).unwrap();
    let p = s.propose(100, None).unwrap();
    assert_eq!((p.ids.as_slice(), p.policy), (&[3, 4, 50][..], Policy::Assert), "corroborated, ends at a delimiter");
    let p = s.propose(2, None).unwrap();
    assert_eq!((p.ids.as_slice(), p.policy), (&[3, 4][..], Policy::Verify), "a budget cut weakens an echo claim");
    let mut s = FillSession::new(&echo(2, 2), plan(&[50]), &EOS, &prompt).unwrap();
    assert_eq!(s.propose(100, None).unwrap().policy, Policy::Verify);
    // A row that cannot rewind takes assertions only.
    let mut s = FillSession::new(&echo(32, 2), plan(&[]), &EOS, &prompt).unwrap();
    assert!(s.propose(100, Some(Policy::Assert)).is_none());
    assert_eq!(s.stats.index_truncated, 1);
}

#[test]
fn commit_counts_what_was_kept_and_grows_the_index() {
    let prompt = [10, 11, 12, 13, 14, 15, 16, 10, 11];
    let mut s = FillSession::new(&echo(32, 2), FillPlan::default(), &EOS, &prompt).unwrap();
    let p = s.propose(100, None).unwrap();
    assert_eq!(p.ids, vec![12, 13, 14, 15, 16, 10, 11]);
    s.commit(p, 3, &[12, 13, 14, 20]);
    s.observe(20);
    assert_eq!((s.stats.verify_events, s.stats.verify_accepted, s.stats.verify_rejected, s.stats.echo), (1, 3, 4, 3));
    // The kept tokens and the sampled one entered the index: "14 20" now has an occurrence.
    s.observe(21);
    s.observe(14);
    s.observe(20);
    assert_eq!(s.propose(100, None).unwrap().ids, vec![21, 14, 20]);
    let rejected = s.propose(100, None).unwrap();
    s.commit(rejected, 0, &[1]);
    assert_eq!((s.stats.events, s.stats.verify_events, s.stats.verify_rejected), (1, 2, 7));
}

#[test]
fn the_trace_writes_one_line_per_proposal() {
    let path = std::env::temp_dir().join(format!("fill-trace-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let config = FillConfig { trace: Some(path.clone()), ..echo(32, 2) };
    let mut s = FillSession::new(&config, FillPlan::default(), &EOS, &[1, 2, 3, 4, 1, 2]).unwrap();
    let p = s.propose(100, None).unwrap();
    s.commit(p, 1, &[3, 5, 6]);
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(line["origin"], "echo");
    assert_eq!(line["policy"], "verify");
    assert_eq!(line["accepted"], 1);
    assert_eq!(line["firstMismatch"], 1);
    assert_eq!(line["proposed"], serde_json::json!([3, 4, 1, 2]));
}

#[test]
fn settings_come_from_the_environment_or_the_engine_option() {
    let vars = |pairs: &[(&str, &str)]| {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        FillConfig::from_vars(move |n| map.get(n).cloned())
    };
    assert_eq!(vars(&[]).unwrap(), FillConfig::default());
    let c = vars(&[("MLX_BUN_FILL", "echo"), ("MLX_BUN_FILL_MAX_SPAN", "1"), ("MLX_BUN_FILL_K", "4.7"), ("MLX_BUN_FILL_INDEX_MAX", "1e12"), ("MLX_BUN_FILL_TRACE", "/tmp/t.jsonl")]).unwrap();
    assert_eq!((c.mode, c.max_span, c.k, c.index_max, c.trace.as_deref()), (FillMode::Echo, 2, 4, MAX_INDEX, Some(std::path::Path::new("/tmp/t.jsonl"))));
    assert_eq!(vars(&[("MLX_BUN_FILL", "1"), ("MLX_BUN_FILL_TRACE", "1")]).unwrap().mode, FillMode::Strict);
    assert!(vars(&[("MLX_BUN_FILL", "on")]).is_err());

    let json = |v: serde_json::Value| FillConfig::from_json(&v, FillConfig::default());
    assert_eq!(json(serde_json::json!("echo")).unwrap().mode, FillMode::Echo);
    let c = json(serde_json::json!({"mode": "strict", "maxSpan": 16, "k": 4, "candidates": 2, "indexMax": 4096})).unwrap();
    assert_eq!((c.mode, c.max_span, c.k, c.candidates, c.index_max), (FillMode::Strict, 16, 4, 2, 4096));
    for bad in [serde_json::json!("on"), serde_json::json!({"maxSpan": 1}), serde_json::json!({"k": 2.5}), serde_json::json!({"span": 4}), serde_json::json!(true), serde_json::json!({"trace": 3})] {
        let e = json(bad.clone()).unwrap_err();
        assert_eq!(e.code(), "INVALID_OPTION", "{bad}");
    }
    // The option applies over the environment's settings.
    let base = FillConfig { k: 3, ..Default::default() };
    assert_eq!(FillConfig::from_json(&serde_json::json!("echo"), base).unwrap().k, 3);
}
