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
        let f32_form = affine::bits(t.kind).map_or(n.saturating_mul(4), |bits| n.saturating_mul(bits as u128) / 8 + n / GROUP as u128 * 8);
        f32_bytes = f32_bytes.saturating_add(f32_form);
        bf16_bytes = bf16_bytes.saturating_add(n.saturating_mul(2));
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
#[path = "gguf_weights_tests.rs"]
mod tests;
