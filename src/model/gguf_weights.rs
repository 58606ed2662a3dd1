//! GGUF → the same tensors and config.json an HF/MLX folder of the model would have. Q4_0, Q4_1
//! and Q8_0 blocks are repacked into MLX affine quantization without loss (each block of 32 is
//! one MLX group: w = scale·q + bias); F32/F16/BF16 tensors keep their dtype.
use std::collections::BTreeMap;

use half::f16;
use serde_json::{json, Value};

use super::config::ModelConfig;
use super::gguf::{Gguf, GgmlType, TensorInfo};
use super::weights::{DType, Tensor, WeightFormat, Weights};
use crate::error::{Error, Result};

const GROUP: usize = 32;

pub fn load(g: &Gguf) -> Result<(Weights, ModelConfig)> {
    let path = g.path().to_path_buf();
    let arch = g.architecture().ok_or_else(|| Error::config(&path, "GGUF has no general.architecture"))?;
    if arch != "llama" {
        return Err(Error::UnsupportedModelType(arch.to_owned()));
    }
    let mut raw = llama_config(g, &path)?;
    let cfg_heads = raw["num_attention_heads"].as_u64().unwrap_or(1) as usize;
    let cfg_kv = raw["num_key_value_heads"].as_u64().unwrap_or(1) as usize;

    let mut tensors = BTreeMap::new();
    let mut quant: BTreeMap<String, usize> = BTreeMap::new();
    for t in &g.tensors {
        let name = hf_name(&t.name).ok_or_else(|| Error::tensor(&t.name, "unknown GGUF tensor name"))?;
        let heads = if t.name.ends_with("attn_q.weight") {
            Some(cfg_heads)
        } else if t.name.ends_with("attn_k.weight") {
            Some(cfg_kv)
        } else {
            None
        };
        let (rows, cols) = matrix_dims(t)?;
        let data = g.tensor_data(t)?;
        match t.kind {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
                let dtype = match t.kind {
                    GgmlType::F32 => DType::F32,
                    GgmlType::F16 => DType::F16,
                    _ => DType::BF16,
                };
                let bytes = match heads {
                    Some(h) => unpermute_rows(data, rows, h),
                    None => data.to_vec(),
                };
                let shape = t.dims.iter().rev().map(|&d| d as usize).collect();
                tensors.insert(name, Tensor::owned(dtype, shape, bytes));
            }
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
                let bits = if t.kind == GgmlType::Q8_0 { 8 } else { 4 };
                let (w, s, b) = repack(t, data, rows, cols)?;
                let base = name.strip_suffix(".weight").unwrap_or(&name).to_owned();
                let (w, s, b) = match heads {
                    Some(h) => (unpermute_rows(&w, rows, h), unpermute_rows(&s, rows, h), unpermute_rows(&b, rows, h)),
                    None => (w, s, b),
                };
                tensors.insert(format!("{base}.weight"), Tensor::owned(DType::U32, vec![rows, cols * bits / 32], w));
                tensors.insert(format!("{base}.scales"), Tensor::owned(DType::F16, vec![rows, cols / GROUP], s));
                tensors.insert(format!("{base}.biases"), Tensor::owned(DType::F16, vec![rows, cols / GROUP], b));
                quant.insert(base, bits);
            }
            other => {
                return Err(Error::UnsupportedQuant { tensor: t.name.clone(), kind: other.name().to_owned() })
            }
        }
    }
    raw["tie_word_embeddings"] = json!(!tensors.contains_key("lm_head.weight"));
    if let Some(q) = quantization_block(&quant) {
        raw["quantization"] = q.clone();
        raw["quantization_config"] = q;
    }
    let config = ModelConfig::from_value(raw, path.clone())?;
    Ok((Weights::from_tensors(path, WeightFormat::Gguf, tensors), config))
}

/// The config.json of a llama-architecture GGUF, with HF key names.
fn llama_config(g: &Gguf, path: &std::path::Path) -> Result<Value> {
    let key = |k: &str| format!("llama.{k}");
    let need = |k: &str| g.get_u64(&key(k)).ok_or_else(|| Error::config(path, format!("GGUF is missing llama.{k}")));
    let hidden = need("embedding_length")?;
    let heads = need("attention.head_count")?;
    let vocab = g
        .get_str_array("tokenizer.ggml.tokens")
        .map(|t| t.len() as u64)
        .or_else(|| g.get_u64(&key("vocab_size")))
        .ok_or_else(|| Error::config(path, "GGUF has no tokenizer.ggml.tokens"))?;
    let eps = g.get_f32(&key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5);
    let mut cfg = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": need("feed_forward_length")?,
        "num_hidden_layers": need("block_count")?,
        "num_attention_heads": heads,
        "num_key_value_heads": g.get_u64(&key("attention.head_count_kv")).unwrap_or(heads),
        "head_dim": g.get_u64(&key("rope.dimension_count")).unwrap_or(hidden / heads),
        "max_position_embeddings": g.get_u64(&key("context_length")),
        // Six significant digits, as the f32 in the file was written from a short decimal.
        "rms_norm_eps": format!("{eps:.5e}").parse::<f64>().unwrap_or(eps as f64),
        "rope_theta": g.get_f32(&key("rope.freq_base")).unwrap_or(10000.0),
        "hidden_act": "silu",
        "vocab_size": vocab,
        "bos_token_id": g.get_u64("tokenizer.ggml.bos_token_id"),
        "eos_token_id": g.get_u64("tokenizer.ggml.eos_token_id"),
        "pad_token_id": g.get_u64("tokenizer.ggml.padding_token_id"),
    });
    if let (Some(factor), Some(kind)) = (g.get_f32(&key("rope.scaling.factor")), g.get_str(&key("rope.scaling.type"))) {
        if kind == "linear" {
            cfg["rope_scaling"] = json!({"type": "linear", "factor": factor});
        }
    }
    Ok(cfg)
}

fn hf_name(gguf: &str) -> Option<String> {
    match gguf {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let mut parts = gguf.splitn(4, '.');
    let (blk, i, base, suffix) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if blk != "blk" {
        return None;
    }
    let module = match base {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{i}.{module}.{suffix}"))
}

/// (rows, cols) of a tensor seen as a matrix: cols = ne0 (the contiguous axis).
fn matrix_dims(t: &TensorInfo) -> Result<(usize, usize)> {
    let cols = *t.dims.first().ok_or_else(|| Error::tensor(&t.name, "no dimensions"))? as usize;
    let rows = t.dims.iter().skip(1).product::<u64>() as usize;
    Ok((rows, cols))
}

/// One quantization block per MLX group: (packed u32 words, f16 scales, f16 biases), row-major.
fn repack(t: &TensorInfo, data: &[u8], rows: usize, cols: usize) -> Result<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    if cols % GROUP != 0 {
        return Err(Error::tensor(&t.name, format!("row length {cols} is not a multiple of {GROUP}")));
    }
    let (block_bytes, bits) = match t.kind {
        GgmlType::Q4_0 => (18, 4),
        GgmlType::Q4_1 => (20, 4),
        _ => (34, 8),
    };
    let blocks = rows * cols / GROUP;
    if data.len() != blocks * block_bytes {
        return Err(Error::tensor(&t.name, format!("expected {} bytes, found {}", blocks * block_bytes, data.len())));
    }
    let mut words = Vec::with_capacity(blocks * GROUP * bits / 8);
    let mut scales = Vec::with_capacity(blocks * 2);
    let mut biases = Vec::with_capacity(blocks * 2);
    for block in data.chunks_exact(block_bytes) {
        let d = f16::from_le_bytes([block[0], block[1]]);
        let (bias, q): (f16, [u8; GROUP]) = match t.kind {
            // w = d·(q − 8)
            GgmlType::Q4_0 => (f16::from_f32(-8.0 * d.to_f32()), nibbles(&block[2..18])),
            // w = d·q + m
            GgmlType::Q4_1 => (f16::from_le_bytes([block[2], block[3]]), nibbles(&block[4..20])),
            // w = d·q with signed q: shift to unsigned, w = d·(q + 128) − 128·d
            _ => (f16::from_f32(-128.0 * d.to_f32()), std::array::from_fn(|k| (block[2 + k] as i8 as i16 + 128) as u8)),
        };
        scales.extend_from_slice(&d.to_le_bytes());
        biases.extend_from_slice(&bias.to_le_bytes());
        let per_word = 32 / bits;
        for chunk in q.chunks_exact(per_word) {
            let word = chunk.iter().enumerate().fold(0u32, |w, (k, &v)| w | (v as u32) << (k * bits));
            words.extend_from_slice(&word.to_le_bytes());
        }
    }
    Ok((words, scales, biases))
}

/// The 32 4-bit values of a Q4 block: low nibbles are elements 0..16, high nibbles 16..32.
fn nibbles(qs: &[u8]) -> [u8; GROUP] {
    std::array::from_fn(|k| if k < 16 { qs[k] & 0x0F } else { qs[k - 16] >> 4 })
}

/// Undoes llama.cpp's interleaving of q/k rows for RoPE: within each head, row 2i+j moves to
/// j·(head_dim/2)+i. Works on any row-major data (values, packed words, scales).
fn unpermute_rows(data: &[u8], rows: usize, heads: usize) -> Vec<u8> {
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
    out
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

    #[test]
    fn names_map_to_hf() {
        assert_eq!(hf_name("blk.3.attn_q.weight").unwrap(), "model.layers.3.self_attn.q_proj.weight");
        assert_eq!(hf_name("blk.0.ffn_norm.weight").unwrap(), "model.layers.0.post_attention_layernorm.weight");
        assert_eq!(hf_name("token_embd.weight").unwrap(), "model.embed_tokens.weight");
        assert_eq!(hf_name("blk.0.unknown.weight"), None);
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
        assert_eq!(unpermute_rows(&permuted, heads * hd, heads), original);
    }

    #[test]
    fn q4_1_and_q8_0_blocks_repack_exactly() {
        let info = |kind| TensorInfo { name: "t".into(), dims: vec![32, 1], kind, offset: 0 };
        // Q4_1: d = 0.5, m = -1.0, q_k = k % 16
        let mut b = Vec::new();
        b.extend_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b.extend_from_slice(&f16::from_f32(-1.0).to_le_bytes());
        b.extend((0..16u8).map(|k| k | (((k + 16) % 16) << 4)));
        let (w, s, bias) = repack(&info(GgmlType::Q4_1), &b, 1, 32).unwrap();
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
        let (w, s, bias) = repack(&info(GgmlType::Q8_0), &b, 1, 32).unwrap();
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
}
