//! Qwen3-Next and Qwen3.5 from GGUF (llama.cpp's `qwen3next`, `qwen35`, `qwen35moe`): the
//! config.json their headers describe, and what llama.cpp's converter did to their tensors beyond
//! renaming them, undone so that `qwen3_next.rs` reads them as it reads mlx-lm's folders:
//! - RMSNorm weights are stored as 1 + w, as mlx-lm's sanitize leaves them: kept as they are.
//! - `A_log` is stored as `-exp(A_log)` (`ssm_a`): its log is taken back.
//! - The convolution is stored as [channels, kernel]: given MLX's trailing axis of 1.
//! - The shared expert's gate is stored as a vector: given its row axis back.
//! - Qwen3-Next's fused q/k/v/z projection is stored apart, as q, k, v (`attn_qkv`, the
//!   convolution's order) and z (`attn_gate`); its fused b/a projection is kept
//!   (`GatedDeltaNet` reads either form). Files from before that split hold the fused one.
//! - Qwen3.5's value heads, which mlx-lm groups by key head (head g·r + j is value j of key head
//!   g, r = value heads per key head), are stored tiled (j·key_heads + g) when there are more
//!   value heads than key heads: put back in every tensor that has one row, column or element
//!   per value head.
use serde_json::{json, Value};

use super::config::ModelConfig;
use super::gguf_config::{partial_rotary_factor, sizes, with, Arch, Meta, MAX_HEADS, MAX_LAYERS, MAX_WIDTH};
use crate::error::{Error, Result};

/// Quantization groups of the packed tensors: a value head's columns must fill whole groups to
/// move as a block.
const GROUP: usize = 32;

pub(super) fn config(arch: Arch, m: &Meta) -> Result<Value> {
    let blocks = m.count("block_count", MAX_LAYERS)?;
    // Qwen3.5's multi-token-prediction layers are counted in block_count, after the model's own.
    let prediction = m.u64("nextn_predict_layers").unwrap_or(0);
    if prediction >= blocks {
        return Err(Error::config(m.path, format!("{} is {prediction}, not below block_count {blocks}", m.key("nextn_predict_layers"))));
    }
    let layers = blocks - prediction;
    let mut cfg = sizes(m, "attention.key_length", 1e-6)?;
    cfg["num_hidden_layers"] = json!(layers);
    let (v_heads, inner) = (m.count("ssm.time_step_rank", MAX_HEADS)?, m.count("ssm.inner_size", MAX_WIDTH)?);
    if inner % v_heads != 0 {
        return Err(Error::config(m.path, format!("{} {inner} is not a multiple of {} {v_heads}", m.key("ssm.inner_size"), m.key("ssm.time_step_rank"))));
    }
    let k_heads = m.count("ssm.group_count", MAX_HEADS)?;
    // Each key head serves the same number of value heads (regrouping them below relies on it).
    if v_heads % k_heads != 0 {
        return Err(Error::config(m.path, format!("{} {v_heads} is not a multiple of {} {k_heads}", m.key("ssm.time_step_rank"), m.key("ssm.group_count"))));
    }
    let head_dim = cfg["head_dim"].as_u64().unwrap_or(1);
    let partial = partial_rotary_factor(m, head_dim)?;
    let theta = m.f32("rope.freq_base").unwrap_or(10000.0);
    cfg = with(cfg, json!({
        "linear_conv_kernel_dim": m.count("ssm.conv_kernel", 64)?,
        "linear_key_head_dim": m.count("ssm.state_size", MAX_WIDTH)?,
        "linear_num_key_heads": k_heads,
        "linear_num_value_heads": v_heads,
        "linear_value_head_dim": inner / v_heads,
        "full_attention_interval": m.u64("full_attention_interval").unwrap_or(4),
    }));
    if let Some(experts) = m.u64("expert_count").filter(|&e| e > 0) {
        cfg = with(cfg, json!({
            "num_experts": m.count("expert_count", 1 << 16)?,
            "num_experts_per_tok": m.count("expert_used_count", experts)?,
            "moe_intermediate_size": m.count("expert_feed_forward_length", MAX_WIDTH)?,
            "shared_expert_intermediate_size": m.count("expert_shared_feed_forward_length", MAX_WIDTH)?,
            // llama.cpp renormalises the top-k scores of these models whatever the checkpoint
            // said (GGUF keeps no flag); every released one does.
            "norm_topk_prob": true,
            "decoder_sparse_step": 1,
        }));
        if arch == Arch::Qwen3Next {
            // Its layers route unless the file has no router for them (Qwen3.5's always do).
            let dense: Vec<u64> = (0..layers).filter(|i| m.g.tensor(&format!("blk.{i}.ffn_gate_inp.weight")).is_none()).collect();
            cfg["mlp_only_layers"] = json!(dense);
        }
    }
    let (model_type, class) = match arch {
        Arch::Qwen3Next => ("qwen3_next", "Qwen3NextForCausalLM"),
        Arch::Qwen35 => ("qwen3_5", "Qwen3_5ForCausalLM"),
        _ => ("qwen3_5_moe", "Qwen3_5MoeForCausalLM"),
    };
    cfg = with(cfg, json!({"model_type": model_type, "architectures": [class]}));
    if arch == Arch::Qwen3Next {
        return Ok(with(cfg, json!({"rope_theta": theta, "partial_rotary_factor": partial})));
    }
    // Qwen3.5 rotates text positions alike on each multimodal section, i.e. plain RoPE.
    Ok(with(cfg, json!({"rope_parameters": {"type": "default", "rope_theta": theta, "partial_rotary_factor": partial}})))
}

/// `blk.N.*` of a multi-token-prediction layer (N ≥ `layers`).
pub(super) fn is_prediction_layer(layers: u64, name: &str) -> bool {
    let mut parts = name.splitn(3, '.');
    parts.next() == Some("blk") && parts.next().and_then(|i| i.parse::<u64>().ok()).is_some_and(|i| i >= layers)
}

/// `A_log` from the stored `-exp(A_log)`; `None` (refused) where that was not negative.
pub(super) fn a_log(stored: f32) -> Option<f32> {
    (stored < 0.0).then(|| (-stored).ln()).filter(|v| v.is_finite())
}

/// The value map of GGUF tensor `name` (`A_log`'s), if it has one.
pub(super) fn value_map(arch: Arch, name: &str) -> Option<fn(f32) -> Option<f32>> {
    let hybrid = matches!(arch, Arch::Qwen3Next | Arch::Qwen35 | Arch::Qwen35Moe);
    (hybrid && name.starts_with("blk.") && name.ends_with(".ssm_a")).then_some(a_log as fn(f32) -> Option<f32>)
}

/// The shape mlx-lm gives GGUF tensor `name`, whose shape as stored is `shape`.
pub(super) fn shape(arch: Arch, name: &str, shape: Vec<usize>) -> Vec<usize> {
    if !matches!(arch, Arch::Qwen3Next | Arch::Qwen35 | Arch::Qwen35Moe) {
        return shape;
    }
    match (name.rsplit('.').nth(1), shape.as_slice()) {
        (Some("ssm_conv1d"), &[channels, kernel]) => vec![channels, kernel, 1],
        (Some("ffn_gate_inp_shexp"), &[hidden]) => vec![1, hidden],
        _ => shape,
    }
}

/// Where a tensor holds Qwen3.5's value heads.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Heads {
    /// Blocks of `per` rows, one per value head, after the first `skip` rows.
    Rows { skip: usize, per: usize },
    /// Equal blocks of each row's columns, one per value head.
    Columns,
}

fn heads(cfg: &ModelConfig, name: &str) -> Option<Heads> {
    let get = |k: &str| cfg.usize_opt(k).unwrap_or(0);
    let (k_heads, k_dim, v_dim) = (get("linear_num_key_heads"), get("linear_key_head_dim"), get("linear_value_head_dim"));
    let base = name.rsplit('.').find(|p| !matches!(*p, "weight" | "bias" | "scales" | "biases"))?;
    Some(match base {
        "attn_qkv" | "ssm_conv1d" => Heads::Rows { skip: 2 * k_heads * k_dim, per: v_dim },
        "attn_gate" => Heads::Rows { skip: 0, per: v_dim },
        "ssm_beta" | "ssm_alpha" | "ssm_a" | "ssm_dt" => Heads::Rows { skip: 0, per: 1 },
        "ssm_out" => Heads::Columns,
        _ => return None,
    })
}

/// Puts back the grouped order of Qwen3.5's value heads in `data` (`rows` rows, row-major) of
/// GGUF tensor `name`; `packed`: quantized words, scales or biases of a quantized tensor.
/// `None` when the tensor needs nothing.
pub(super) fn group_heads(arch: Arch, cfg: &ModelConfig, name: &str, data: &[u8], rows: usize, packed: bool) -> Result<Option<Vec<u8>>> {
    let (k_heads, v_heads) = (cfg.usize_opt("linear_num_key_heads").unwrap_or(0), cfg.usize_opt("linear_num_value_heads").unwrap_or(0));
    if !matches!(arch, Arch::Qwen35 | Arch::Qwen35Moe) || k_heads == 0 || v_heads <= k_heads {
        return Ok(None);
    }
    let Some(place) = heads(cfg, name) else { return Ok(None) };
    let bad = |why: String| Error::tensor(name, why);
    // The header was checked for this; `source` below stays within the heads only so.
    if v_heads % k_heads != 0 {
        return Err(bad(format!("{v_heads} value heads are not a multiple of {k_heads} key heads")));
    }
    let r = v_heads / k_heads;
    // Grouped head h is value h % r of key head h / r, stored at (h % r)·key_heads + h / r.
    let source = |h: usize| (h % r) * k_heads + h / r;
    if rows == 0 || data.len() % rows != 0 {
        return Err(bad(format!("{} bytes do not split into {rows} rows", data.len())));
    }
    let row = data.len() / rows;
    let mut out = Vec::with_capacity(data.len());
    match place {
        Heads::Rows { skip, per } => {
            if rows != skip + v_heads * per {
                return Err(bad(format!("has {rows} rows, not {skip} + {v_heads} value heads of {per}")));
            }
            out.extend_from_slice(&data[..skip * row]);
            for h in 0..v_heads {
                let start = (skip + source(h) * per) * row;
                out.extend_from_slice(&data[start..start + per * row]);
            }
        }
        Heads::Columns => {
            let v_dim = cfg.usize_opt("linear_value_head_dim").unwrap_or(0);
            if packed && v_dim % GROUP != 0 {
                return Err(bad(format!("quantized in groups of {GROUP} columns, it cannot move its value heads of {v_dim} columns")));
            }
            if row % v_heads != 0 {
                return Err(bad(format!("rows of {row} bytes do not split into {v_heads} value heads")));
            }
            let block = row / v_heads;
            for r0 in data.chunks_exact(row) {
                for h in 0..v_heads {
                    out.extend_from_slice(&r0[source(h) * block..(source(h) + 1) * block]);
                }
            }
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::tests::GgufWriter;
    use crate::gguf::Gguf;
    use crate::model::gguf_config::hf_config;
    use serde_json::json;

    /// A qwen35moe header: 5 blocks of which the last predicts tokens, heads of 16 rotated over 8,
    /// 2 key and 4 value heads of 32 in the linear layers, 8 experts; `change` replaces a number.
    fn qwen35moe(change: Option<(&str, u32)>) -> Result<Value> {
        let numbers = [
            ("block_count", 5), ("nextn_predict_layers", 1), ("embedding_length", 64), ("context_length", 4096),
            ("attention.head_count", 4), ("attention.head_count_kv", 2), ("attention.key_length", 16),
            ("rope.dimension_count", 8), ("ssm.conv_kernel", 4), ("ssm.state_size", 16), ("ssm.group_count", 2),
            ("ssm.time_step_rank", 4), ("ssm.inner_size", 128), ("full_attention_interval", 4), ("expert_count", 8),
            ("expert_used_count", 2), ("expert_feed_forward_length", 32), ("expert_shared_feed_forward_length", 64),
        ];
        let mut w = GgufWriter::new();
        w.str("general.architecture", "qwen35moe").f32("qwen35moe.rope.freq_base", 1e7).strs("tokenizer.ggml.tokens", &["a", "b"]);
        for (k, v) in numbers {
            let v = change.filter(|c| c.0 == k).map_or(v, |c| c.1);
            w.u32(&format!("qwen35moe.{k}"), v);
        }
        let file = w.write();
        hf_config(Arch::Qwen35Moe, &Gguf::open(&file.0).unwrap())
    }

    #[test]
    fn qwen35moe_config_from_its_header() {
        let c = qwen35moe(None).unwrap();
        assert_eq!((c["model_type"].as_str(), c["num_hidden_layers"].as_u64()), (Some("qwen3_5_moe"), Some(4)));
        // No dense width in the file: the experts'.
        assert_eq!(c["intermediate_size"], 32);
        assert_eq!((c["linear_num_key_heads"].clone(), c["linear_num_value_heads"].clone(), c["linear_value_head_dim"].clone()), (json!(2), json!(4), json!(32)));
        assert_eq!(c["rope_parameters"], json!({"type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.5}));
        assert_eq!((c["num_experts"].clone(), c["shared_expert_intermediate_size"].clone(), c["norm_topk_prob"].clone()), (json!(8), json!(64), json!(true)));
        assert!(c.get("mlp_only_layers").is_none());
        let refused = |k: &str, v: u32| qwen35moe(Some((k, v))).unwrap_err().to_string();
        assert!(refused("nextn_predict_layers", 5).contains("nextn_predict_layers"));
        assert!(refused("ssm.inner_size", 102).contains("ssm.inner_size"));
        assert!(refused("ssm.time_step_rank", 0).contains("ssm.time_step_rank"));
        assert!(refused("ssm.time_step_rank", 1).contains("not a multiple of qwen35moe.ssm.group_count"));
    }

    fn cfg(k_heads: usize, v_heads: usize) -> ModelConfig {
        let raw = json!({
            "model_type": "qwen3_5", "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 4, "rms_norm_eps": 1e-6,
            "linear_num_key_heads": k_heads, "linear_num_value_heads": v_heads, "linear_key_head_dim": 1,
            "linear_value_head_dim": 2,
        });
        ModelConfig::from_value(raw, "t".into()).unwrap()
    }

    #[test]
    fn value_heads_go_back_to_their_key_heads() {
        // 2 key heads, 4 value heads of 2 rows: stored tiled (g0v0, g1v0, g0v1, g1v1).
        let c = cfg(2, 4);
        let tiled: Vec<u8> = [[0, 0], [2, 2], [1, 1], [3, 3]].concat();
        let gate = group_heads(Arch::Qwen35, &c, "blk.0.attn_gate.weight", &tiled, 8, false).unwrap().unwrap();
        assert_eq!(gate, [[0, 0], [1, 1], [2, 2], [3, 3]].concat());
        // q and k (one row per key head each) stay; the value rows after them move.
        let qkv: Vec<u8> = [vec![9, 9, 9, 9], tiled.clone()].concat();
        let out = group_heads(Arch::Qwen35Moe, &c, "blk.0.attn_qkv.weight", &qkv, 12, false).unwrap().unwrap();
        assert_eq!(out, [vec![9, 9, 9, 9], [[0, 0], [1, 1], [2, 2], [3, 3]].concat()].concat());
        // One element per head, and columns in each row.
        let a = group_heads(Arch::Qwen35, &c, "blk.0.ssm_a", &[0, 2, 1, 3], 4, false).unwrap().unwrap();
        assert_eq!(a, [0, 1, 2, 3]);
        let out = group_heads(Arch::Qwen35, &c, "blk.0.ssm_out.weight", &[0, 2, 1, 3, 4, 6, 5, 7], 2, false).unwrap().unwrap();
        assert_eq!(out, [0, 1, 2, 3, 4, 5, 6, 7]);
        // Quantized columns move only as whole groups; a wrong row count is refused.
        assert!(group_heads(Arch::Qwen35, &c, "blk.0.ssm_out.weight", &[0; 8], 2, true).is_err());
        assert!(group_heads(Arch::Qwen35, &c, "blk.0.attn_gate.weight", &[0; 10], 10, false).is_err());
        // Equal head counts, Qwen3-Next and other tensors need nothing.
        assert_eq!(group_heads(Arch::Qwen35, &cfg(2, 2), "blk.0.attn_gate.weight", &[0; 4], 4, false).unwrap(), None);
        assert_eq!(group_heads(Arch::Qwen3Next, &c, "blk.0.attn_gate.weight", &tiled, 8, false).unwrap(), None);
        assert_eq!(group_heads(Arch::Qwen35, &c, "blk.0.attn_q.weight", &tiled, 8, false).unwrap(), None);
    }

    #[test]
    fn a_log_is_taken_back_and_checked() {
        let stored = -(0.5f32.exp());
        assert!((a_log(stored).unwrap() - 0.5).abs() < 1e-6);
        assert_eq!(a_log(0.0), None);
        assert_eq!(a_log(1.0), None);
        assert_eq!(a_log(f32::NAN), None);
        assert!(is_prediction_layer(4, "blk.4.nextn.eh_proj.weight") && !is_prediction_layer(4, "blk.3.attn_q.weight"));
        assert!(!is_prediction_layer(4, "output.weight"));
    }
}
