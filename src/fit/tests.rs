//! `fit` against mlx-bun's formulas, worked by hand for each case (the comments show the sums),
//! and its properties over many generated cases: the safe context fits and one more token does
//! not, and it never shrinks when the budget grows.
use serde_json::{json, Value};

use super::*;
use crate::model::config::ModelConfig;

const GIB: f64 = (1u64 << 30) as f64;

fn text(v: Value) -> Text {
    Text::from_json(&v).unwrap()
}

/// SmolLM2-135M's geometry: 30 full layers, 3 KV heads of 64 (a fused head dim).
fn smollm() -> Text {
    text(json!({"numHiddenLayers": 30, "numAttentionHeads": 9, "numKeyValueHeads": 3, "headDim": 64, "maxPositionEmbeddings": 8192, "layerTypes": vec!["full_attention"; 30]}))
}

/// Gemma 3 270M: 18 layers, every 6th full, the rest sliding over 512; head dim 256 (unfused).
fn gemma() -> Text {
    let types: Vec<&str> = (0..18).map(|i| if (i + 1) % 6 == 0 { "full_attention" } else { "sliding_attention" }).collect();
    text(json!({"numHiddenLayers": 18, "numAttentionHeads": 4, "numKeyValueHeads": 1, "headDim": 256, "slidingWindow": 512, "maxPositionEmbeddings": 32768, "layerTypes": types}))
}

fn machine(ram_gib: f64, bandwidth_gbs: f64) -> Machine {
    Machine { ram_bytes: ram_gib * GIB, bandwidth_gbs }
}

fn run(t: &Text, weights: f64, ctx: f64, m: Machine, usable: Option<f64>, kv: &KvScheme) -> FitReport {
    fit(&Request { text: t, weights_bytes: weights, ctx, machine: m, chunk: DEFAULT_CHUNK, experts_bytes: 0.0, usable_bytes: usable, kv }).unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn dense_full_attention_with_a_fused_head_dim() {
    let bf16 = KvScheme::default();
    let w = 538_090_408.0;
    let r = run(&smollm(), w, 4096.0, machine(16.0, 100.0), None, &bf16);
    // KV: 30 layers × 2 (K, V) × 3 heads × 64 × 2 B = 23 040 B a token.
    assert_eq!(r.kv_bytes, 23_040.0 * 4096.0);
    // A 2048-token chunk × 0.55 MB; head dim 64 is fused, so no scores term.
    assert_eq!(r.transient_bytes, 2048.0 * 0.55e6);
    assert_eq!(r.total_bytes, w + 94_371_840.0 + 1_126_400_000.0);
    assert_eq!(r.usable_bytes, 16.0 * GIB * 0.75);
    assert!(r.fits);
    assert_eq!(r.max_safe_context, 8192.0, "the whole context fits");
    assert!(close(r.predicted_decode_tps, 100e9 / (w + 94_371_840.0) * 0.82));
    // Below the chunk, only the context's tokens are in flight.
    assert_eq!(run(&smollm(), w, 100.0, machine(16.0, 100.0), None, &bf16).transient_bytes, 100.0 * 0.55e6);
}

#[test]
fn sdpa_fallback_by_head_dim() {
    let qwen = |head_dim: u32| text(json!({"numHiddenLayers": 4, "numAttentionHeads": 16, "numKeyValueHeads": 8, "headDim": head_dim, "maxPositionEmbeddings": 40960}));
    // Head dim 256: 16 heads × 2048 queries × 10 000 keys × 2 B of scores in the last chunk.
    assert_eq!(sdpa_fallback_bytes(&qwen(256), 2048.0, 10_000.0), 655_360_000.0);
    let r = run(&qwen(256), 1e9, 10_000.0, machine(64.0, 400.0), None, &KvScheme::default());
    assert_eq!(r.transient_bytes, 2048.0 * 0.55e6 + 655_360_000.0);
    // Up to 8 queries the fused decode kernel serves every head dim; 9 queries fall back.
    assert_eq!(sdpa_fallback_bytes(&qwen(256), 2048.0, 8.0), 0.0);
    assert_eq!(sdpa_fallback_bytes(&qwen(256), 2048.0, 9.0), 16.0 * 9.0 * 9.0 * 2.0);
    assert_eq!(sdpa_fallback_bytes(&qwen(256), 8.0, 10_000.0), 0.0, "a chunk of 8 is decode-sized");
    for fused in [64, 72, 80, 96, 128] {
        assert_eq!(sdpa_fallback_bytes(&qwen(fused), 2048.0, 10_000.0), 0.0, "head dim {fused}");
    }
    assert_eq!(sdpa_fallback_bytes(&qwen(192), 512.0, 1000.0), 16.0 * 512.0 * 1000.0 * 2.0);
}

#[test]
fn sliding_layers_are_capped_at_the_window() {
    let t = gemma();
    let bf16 = KvScheme::default();
    // Full: 3 layers × 2 × 1 head × 256 × 2 B = 3072 B a token; sliding: 15 × … = 15 360 B,
    // for at most 512 tokens.
    assert_eq!(kv_bytes_at(&t, 300.0, &bf16), (3072.0 + 15_360.0) * 300.0);
    assert_eq!(kv_bytes_at(&t, 10_000.0, &bf16), 3072.0 * 10_000.0 + 15_360.0 * 512.0);
    // Scores: a sliding layer sees at most window + queries keys (2560 of 10 000), a full
    // layer all of them; the peak is the full layer's 4 × 2048 × 10 000 × 2 B.
    assert_eq!(sdpa_fallback_bytes(&t, 2048.0, 10_000.0), 163_840_000.0);
    let only_sliding = text(json!({"numHiddenLayers": 2, "numAttentionHeads": 4, "numKeyValueHeads": 1, "headDim": 256, "globalHeadDim": 128, "slidingWindow": 512, "layerTypes": ["sliding_attention", "full_attention"]}));
    assert_eq!(sdpa_fallback_bytes(&only_sliding, 2048.0, 10_000.0), 4.0 * 2048.0 * 2560.0 * 2.0, "the full layer's head dim 128 is fused");
    assert_eq!(sdpa_fallback_bytes(&only_sliding, 2048.0, 1000.0), 4.0 * 1000.0 * 1000.0 * 2.0, "keys never exceed the context");
}

#[test]
fn mixture_of_experts_reads_top_k_of_its_experts() {
    let moe = |enabled: bool| text(json!({"numHiddenLayers": 2, "numAttentionHeads": 8, "numKeyValueHeads": 2, "headDim": 128, "maxPositionEmbeddings": 4096, "enableMoeBlock": enabled, "numExperts": 128, "topKExperts": 8}));
    let (w, experts) = (16e9, 12e9);
    let bf16 = KvScheme::default();
    let at = |t: &Text| fit(&Request { text: t, weights_bytes: w, ctx: 1000.0, machine: machine(64.0, 546.0), chunk: DEFAULT_CHUNK, experts_bytes: experts, usable_bytes: None, kv: &bf16 }).unwrap();
    let kv = 2.0 * 2.0 * 2.0 * 128.0 * 2.0 * 1000.0;
    let r = at(&moe(true));
    // 120 of 128 experts are skipped each token; MoE decode runs at 0.76 of the ceiling.
    assert!(close(r.predicted_decode_tps, 546e9 / (w - experts * (1.0 - 8.0 / 128.0) + kv) * 0.76));
    assert_eq!(r.total_bytes, w + kv + 1000.0 * 0.55e6, "every expert stays resident");
    let dense = at(&moe(false));
    assert!(close(dense.predicted_decode_tps, 546e9 / (w + kv) * 0.82), "without the MoE block nothing is skipped");
}

#[test]
fn quantized_kv_bills_bits_and_group_overhead() {
    let t = smollm();
    assert_eq!(kv_quant_bytes_per_element(4.0, 64.0), 0.5625);
    let kv4 = KvScheme::from_json(&json!({"kvBits": 4}), 30).unwrap();
    assert_eq!(kv_bytes_at(&t, 1000.0, &kv4), 30.0 * 2.0 * 3.0 * 64.0 * 0.5625 * 1000.0);
    let kv8 = KvScheme::from_json(&json!({"kvBits": 8, "kvGroupSize": 32}), 30).unwrap();
    assert_eq!(kv_bytes_at(&t, 1000.0, &kv8), 30.0 * 384.0 * 1.125 * 1000.0);
    // kv_config.json: the listed layers quantized, the others bf16.
    let per_layer = KvScheme::from_json(&json!({"kvConfig": [{"layerIdx": 0, "bits": 4, "groupSize": 64}, {"layerIdx": 29, "bits": 8, "groupSize": 128}]}), 30).unwrap();
    assert_eq!(kv_bytes_at(&t, 10.0, &per_layer), (384.0 * 0.5625 + 384.0 * (1.0 + 4.0 / 128.0) + 28.0 * 384.0 * 2.0) * 10.0);
    assert_eq!(KvScheme::bits(Some(4)).unwrap(), kv4);
    let bigger = run(&t, 5e8, 8192.0, machine(1.0, 100.0), None, &KvScheme::default());
    let smaller = run(&t, 5e8, 8192.0, machine(1.0, 100.0), None, &kv4);
    assert!(smaller.max_safe_context > bigger.max_safe_context, "a quantized cache holds more context");
}

#[test]
fn recurrent_state_is_constant_and_zero_for_this_engines_models() {
    let hybrid = text(json!({"numHiddenLayers": 4, "numAttentionHeads": 4, "numKeyValueHeads": 1, "headDim": 64, "layerTypes": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        "linearNumValueHeads": 4, "linearNumKeyHeads": 2, "linearKeyHeadDim": 16, "linearValueHeadDim": 16, "linearConvKernelDim": 4}));
    // Per linear layer: f32 state 4 × 16 × 16 × 4 B + bf16 conv window 3 × (2·2·16 + 4·16) × 2 B.
    let state = 3.0 * (4.0 * 16.0 * 16.0 * 4.0 + 3.0 * 128.0 * 2.0);
    assert_eq!(kv_bytes_at(&hybrid, 0.0, &KvScheme::default()), state);
    assert_eq!(kv_bytes_at(&hybrid, 100.0, &KvScheme::default()), state + 2.0 * 64.0 * 2.0 * 100.0);
    // The engine's architectures have no linear layers: a config of each bills no state.
    let cfg = ModelConfig::from_value(json!({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "linear_num_value_heads": 4}), "config.json".into()).unwrap();
    assert_eq!(kv_bytes_at(&Text::of(&cfg).unwrap(), 0.0, &KvScheme::default()), 0.0);
}

#[test]
fn geometry_of_a_config_is_what_the_engine_builds() {
    let mut raw = json!({"model_type": "gemma3_text", "hidden_size": 640, "num_hidden_layers": 18, "intermediate_size": 2048, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 1000, "max_position_embeddings": 32768});
    // No layer_types and no sliding_window: Gemma 3's pattern (every 6th global) and window 512.
    let t = Text::of(&ModelConfig::from_value(raw.clone(), "config.json".into()).unwrap()).unwrap();
    assert_eq!(t.layer_types, gemma().layer_types);
    assert_eq!(t.sliding_window, 512.0);
    assert_eq!((t.num_global_key_value_heads, t.global_head_dim, t.max_position_embeddings), (1.0, 256.0, Some(32768.0)));
    raw["sliding_window_pattern"] = json!(2);
    let t = Text::of(&ModelConfig::from_value(raw, "config.json".into()).unwrap()).unwrap();
    assert_eq!(t.layer_types.iter().filter(|k| **k == LayerKind::Full).count(), 9);
}

#[test]
fn context_edges_whole_nothing_and_no_declared_maximum() {
    let t = smollm();
    let bf16 = KvScheme::default();
    assert_eq!(run(&t, 1e9, 10.0, machine(1.0, 100.0), Some(1e9), &bf16).max_safe_context, 0.0, "the weights alone fill the budget");
    assert_eq!(run(&t, 1e9, 10.0, machine(1.0, 100.0), Some(1e9 - 1.0), &bf16).max_safe_context, 0.0);
    assert_eq!(run(&t, 0.0, 10.0, machine(1.0, 100.0), Some(1e12), &bf16).max_safe_context, 8192.0);
    // Without maxPositionEmbeddings the budget alone bounds it: (usable − weights − the
    // 2048-token chunk) / 23 040 B a token, rounded down.
    let open = text(json!({"numHiddenLayers": 30, "numAttentionHeads": 9, "numKeyValueHeads": 3, "headDim": 64}));
    let usable = 2e9;
    let want = ((usable - 5e8 - 2048.0 * 0.55e6) / 23_040.0_f64).floor();
    assert_eq!(run(&open, 5e8, 10.0, machine(1.0, 100.0), Some(usable), &bf16).max_safe_context, want);
}

/// A deterministic stream of numbers in [0, 1) (splitmix64), for generated cases.
struct Cases(u64);

impl Cases {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) as f64 / u64::MAX as f64
    }

    fn int(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.next() * f64::from(hi - lo + 1)) as u32 % (hi - lo + 1)
    }
}

fn generated(c: &mut Cases) -> Text {
    let layers = c.int(1, 48);
    let pattern = c.int(1, 7);
    let head_dims = [64, 80, 128, 192, 256];
    let types: Vec<&str> = (0..layers)
        .map(|i| match (c.int(0, 9), (i + 1) % pattern == 0) {
            (0, _) => "linear_attention",
            (_, true) => "full_attention",
            _ => "sliding_attention",
        })
        .collect();
    text(json!({"numHiddenLayers": layers, "numAttentionHeads": c.int(1, 32), "numKeyValueHeads": c.int(1, 8), "headDim": head_dims[c.int(0, 4) as usize],
        "globalHeadDim": head_dims[c.int(0, 4) as usize], "slidingWindow": c.int(0, 4096), "maxPositionEmbeddings": c.int(1, 262_144), "layerTypes": types,
        "linearNumValueHeads": c.int(0, 8), "linearNumKeyHeads": c.int(0, 4), "linearKeyHeadDim": 64, "linearValueHeadDim": 64, "linearConvKernelDim": 4}))
}

#[test]
fn the_safe_context_fits_and_one_more_token_does_not() {
    let mut c = Cases(20);
    let mut bisected = 0;
    for case in 0..300 {
        let t = generated(&mut c);
        let kv = if c.int(0, 1) == 0 { KvScheme::default() } else { KvScheme::bits(Some([4, 8][c.int(0, 1) as usize])).unwrap() };
        let weights = c.next() * 4e10;
        // Budgets around what the whole context would need, so most cases land inside it.
        let top = t.max_position_embeddings.unwrap();
        let usable = (weights + c.next() * 1.2 * (kv_bytes_at(&t, top, &kv) + 2.5e9) - 5e8).max(0.0);
        let chunk = f64::from([512, 2048][c.int(0, 1) as usize]);
        let at = |ctx: f64| fit(&Request { text: &t, weights_bytes: weights, ctx, machine: machine(64.0, 400.0), chunk, experts_bytes: 0.0, usable_bytes: Some(usable), kv: &kv }).unwrap();
        let n = at(0.0).max_safe_context;
        assert!(n <= top, "case {case}");
        if n == 0.0 && !at(0.0).fits {
            continue;
        }
        assert!(at(n).fits, "case {case}: {n} tokens must fit");
        assert!(n == top || !at(n + 1.0).fits, "case {case}: {} tokens must not fit", n + 1.0);
        bisected += usize::from(n > 0.0 && n < top);
    }
    assert!(bisected >= 100, "only {bisected} cases needed the bisection");
}

#[test]
fn the_safe_context_grows_with_the_budget() {
    let mut c = Cases(7);
    let mut grew = 0;
    for case in 0..100 {
        let t = generated(&mut c);
        let weights = c.next() * 2e10;
        let mut last = 0.0;
        for step in 0..40 {
            let usable = weights + f64::from(step) * 2.5e8;
            let n = run(&t, weights, 0.0, machine(64.0, 400.0), Some(usable), &KvScheme::default()).max_safe_context;
            assert!(n >= last, "case {case}: {usable} B allows {n} tokens, less than {last} with less");
            grew += usize::from(n > last);
            last = n;
        }
    }
    assert!(grew >= 500, "the budget steps changed the context only {grew} times");
}

#[test]
fn sku_matrix_is_fit_on_each_apple_configuration() {
    let t = gemma();
    let rows = sku_matrix(&t, 5.4e8, 32_768.0, 0.0, &KvScheme::default()).unwrap();
    assert_eq!(rows.len(), APPLE_SKUS.iter().map(|s| s.ram_options.len()).sum::<usize>());
    assert_eq!(rows.len(), 41);
    let m4 = rows.iter().find(|r| r.sku == "M4 Pro" && r.ram_gb == 24).unwrap();
    let want = run(&t, 5.4e8, 32_768.0, machine(24.0, 273.0), None, &KvScheme::default());
    assert_eq!((m4.fits, m4.max_context, m4.decode_tps), (want.fits, want.max_safe_context, want.predicted_decode_tps));
}

#[test]
fn machine_detection() {
    assert_eq!(machine::mem_total("MemTotal:       16318460 kB\nMemFree: 1 kB\n"), Some(16_318_460.0 * 1024.0));
    assert_eq!(machine::mem_total("MemFree: 1 kB\n"), None);
    assert_eq!(machine::cpu_model_name("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags : x\n").as_deref(), Some("AMD EPYC 7B13"));
    assert_eq!(machine::cpu_model_name("processor : 0\n"), None);
    assert_eq!(machine::apple_bandwidth("Apple M4 Pro"), Some(273.0));
    assert_eq!(machine::apple_bandwidth("M3 Ultra"), Some(819.0));
    assert_eq!(machine::apple_bandwidth("M4"), Some(120.0));
    assert_eq!(machine::apple_bandwidth("Intel(R) Xeon(R)"), None);
    let given = this_machine(Some(200.0)).unwrap();
    assert_eq!((given.bandwidth_gbs, given.bandwidth_source), (200.0, BandwidthSource::Given));
    assert!(given.ram_bytes > 0.0);
    let here = this_machine(None).unwrap();
    assert_eq!(here.ram_bytes, given.ram_bytes);
    if cfg!(target_os = "linux") {
        assert_eq!((here.bandwidth_gbs, here.bandwidth_source), (51.2, BandwidthSource::Estimated));
    }
    assert!(this_machine(Some(0.0)).is_err() && this_machine(Some(f64::NAN)).is_err());
}

#[test]
fn bad_inputs_are_refused_by_name() {
    let t = smollm();
    let bf16 = KvScheme::default();
    let base = Request { text: &t, weights_bytes: 1e9, ctx: 100.0, machine: machine(16.0, 100.0), chunk: 2048.0, experts_bytes: 0.0, usable_bytes: None, kv: &bf16 };
    let refused = |r: Request, name: &str| {
        let e = fit(&r).unwrap_err();
        assert_eq!(e.code(), "INVALID_OPTION");
        assert!(e.to_string().starts_with(name), "{e}");
    };
    refused(Request { ctx: -1.0, ..base.clone() }, "ctx");
    refused(Request { ctx: 1.5, ..base.clone() }, "ctx");
    refused(Request { chunk: 0.0, ..base.clone() }, "chunk");
    refused(Request { weights_bytes: f64::NAN, ..base.clone() }, "weightsBytes");
    refused(Request { experts_bytes: 2e9, ..base.clone() }, "expertsBytes");
    refused(Request { usable_bytes: Some(f64::INFINITY), ..base.clone() }, "usableBytes");
    refused(Request { machine: machine(16.0, 0.0), ..base.clone() }, "machine.bandwidthGBs");
    refused(Request { machine: machine(-1.0, 100.0), ..base }, "machine.ramBytes");
    let scheme = |v: Value| KvScheme::from_json(&v, 30).unwrap_err().to_string();
    assert!(scheme(json!({"kvBits": 7})).contains("bits must be one of"));
    assert!(scheme(json!({"kvBits": 4, "kvGroupSize": 48})).contains("group size"));
    assert!(scheme(json!({"kvBits": 4, "kvConfig": []})).contains("not both"));
    assert!(scheme(json!({"kvGroupSize": 64})).starts_with("kvGroupSize"));
    assert!(scheme(json!({"kvConfig": [{"layerIdx": 30, "bits": 4, "groupSize": 64}]})).contains("layerIdx"));
    assert!(scheme(json!({"kvConfig": [{"layerIdx": 1, "bits": 4, "groupSize": 64}, {"layerIdx": 1, "bits": 8, "groupSize": 64}]})).contains("twice"));
    assert!(scheme(json!({"kvConfig": [{"layerIdx": 1, "bits": 4}]})).contains("groupSize"));
    let config = |v: Value| Text::from_json(&v).unwrap_err().to_string();
    assert!(config(json!({"numAttentionHeads": 1, "numKeyValueHeads": 1, "headDim": 64})).contains("text.numHiddenLayers is required"));
    assert!(config(json!({"numHiddenLayers": 1.5, "numAttentionHeads": 1, "numKeyValueHeads": 1, "headDim": 64})).contains("text.numHiddenLayers"));
    assert!(config(json!({"numHiddenLayers": 1e9, "numAttentionHeads": 1, "numKeyValueHeads": 1, "headDim": 64})).contains("more layers"));
    assert!(config(json!({"numHiddenLayers": 1, "numAttentionHeads": 1, "numKeyValueHeads": 1, "headDim": "64"})).contains("text.headDim"));
    assert!(config(json!({"numHiddenLayers": 1, "numAttentionHeads": 1, "numKeyValueHeads": 1, "headDim": 64, "layerTypes": [1]})).contains("layerTypes"));
    assert!(config(json!({"numHiddenLayers": 1, "numAttentionHeads": 1, "numKeyValueHeads": 1, "headDim": 64, "enableMoeBlock": true, "numExperts": 4, "topKExperts": 8})).contains("topKExperts"));
    assert!(config(json!([1])).contains("loadModelConfig"));
}

#[test]
fn json_numbers_read_as_javascript_writes_them() {
    assert_eq!(json_number(8192.0).to_string(), "8192");
    assert_eq!(json_number(0.5625).to_string(), "0.5625");
    assert_eq!(json_number(f64::INFINITY), Value::Null);
    let r = run(&smollm(), 1e9, 4096.0, machine(16.0, 100.0), None, &KvScheme::default());
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["contextTokens"].to_string(), "4096");
    assert_eq!(v["usableBytes"].to_string(), "12884901888");
}

#[test]
fn a_qwen3_5_config_bills_its_linear_layers_as_recurrent_state() {
    let cfg = ModelConfig::from_value(
        json!({"model_type": "qwen3_5", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 100,
            "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4}),
        "config.json".into(),
    )
    .unwrap();
    let t = Text::of(&cfg).unwrap();
    // Layers 0-2 linear (full attention every 4th), as the model builds them.
    let state = 3.0 * (4.0 * 16.0 * 16.0 * 4.0 + 3.0 * 128.0 * 2.0);
    assert_eq!(kv_bytes_at(&t, 100.0, &KvScheme::default()), state + 2.0 * 64.0 * 2.0 * 100.0);
}
