//! Gemma 4 from GGUF (llama.cpp's `gemma4`): the config.json of mlx-lm's `gemma4_text` that its
//! header describes. llama.cpp stores Gemma 4's tensors as mlx-lm holds them (no norm shift, no
//! scale folded in; names in gguf_names.rs, experts with gate and up fused), so only the config
//! needs work:
//! - sliding and full layers come from a per-layer boolean array, each kind's head size and RoPE
//!   base from its own key (`*_swa` for the sliding layers);
//! - the KV head count and the MLP width may be per-layer arrays: the full layers' KV heads
//!   (`num_global_key_value_heads`), and the doubled width of the layers that share KV
//!   (`use_double_wide_mlp`);
//! - the full layers' partial rotation is stored only as factors (`rope_freqs`): 1 for each
//!   rotated frequency, ~1e30 (never rotating) for the rest;
//! - keys used as values on full layers (`attention_k_eq_v`) and the MoE block are told by the
//!   tensors (no `attn_v`, a router);
//! - `final_logit_softcapping` defaults to 30 when absent, as llama.cpp's runtime does.
//!
//! The layers that share KV read the last earlier layer of their kind (mlx-lm's rule); llama.cpp
//! hardcodes the two layers before the first sharing one, which is the same layer in every
//! released Gemma 4.
use serde_json::{json, Value};

use super::gguf_config::{with, Meta, MAX_HEADS, MAX_LAYERS, MAX_WIDTH};
use crate::error::{Error, Result};
use crate::gguf::quants;

/// The tensor that holds the full layers' RoPE factors (config, not a weight).
pub(super) const ROPE_FREQS: &str = "rope_freqs.weight";

/// Factors at least this large stop a frequency from rotating (llama.cpp writes 1e30).
const NO_ROTATION: f32 = 1e20;

pub(super) fn config(m: &Meta) -> Result<Value> {
    let bad = |msg: String| Error::config(m.path, msg);
    let layers = m.count("block_count", MAX_LAYERS)? as usize;
    let sliding = m
        .g
        .get_bool_array(&m.key("attention.sliding_window_pattern"))
        .filter(|p| p.len() == layers)
        .ok_or_else(|| bad(format!("GGUF needs {} as {layers} booleans", m.key("attention.sliding_window_pattern"))))?;
    let heads = m.count("attention.head_count", MAX_HEADS)?;
    let full_head_dim = m.count("attention.key_length", MAX_WIDTH)?;
    let head_dim = match m.u64("attention.key_length_swa") {
        Some(_) => m.count("attention.key_length_swa", MAX_WIDTH)?,
        None => full_head_dim,
    };
    let kv = per_layer(m, "attention.head_count_kv", layers, MAX_HEADS)?.unwrap_or_else(|| vec![heads; layers]);
    // One count per kind of layer, as mlx-lm's config has.
    let of_kind = |want: bool| -> Result<Option<u64>> {
        let mut counts = (0..layers).filter(|&i| sliding[i] == want).map(|i| kv[i]);
        let first = counts.next();
        match counts.find(|&c| Some(c) != first) {
            Some(other) => Err(bad(format!("{} differs between layers of one kind ({first:?} and {other})", m.key("attention.head_count_kv")))),
            None => Ok(first),
        }
    };
    let kv_sliding = of_kind(true)?.unwrap_or(kv[0]);
    let kv_full = of_kind(false)?.unwrap_or(kv_sliding);
    let first_full = sliding.iter().position(|&s| !s);
    let has = |i: usize, t: &str| m.g.tensor(&format!("blk.{i}.{t}.weight")).is_some();
    let k_eq_v = first_full.is_some_and(|i| has(i, "attn_k") && !has(i, "attn_v"));
    if kv_full != kv_sliding && !k_eq_v {
        return Err(bad(format!("full layers have {kv_full} KV heads and sliding ones {kv_sliding}: mlx-lm's gemma4_text allows that only where keys are the values")));
    }

    let shared = m.u64("attention.shared_kv_layers").unwrap_or(0) as usize;
    if shared >= layers {
        return Err(bad(format!("{} is {shared}, not below block_count {layers}", m.key("attention.shared_kv_layers"))));
    }
    // The width of the MLP, doubled on the layers that share KV when the file says so.
    let ff = per_layer(m, "feed_forward_length", layers, MAX_WIDTH)?.ok_or_else(|| bad(format!("GGUF is missing {}", m.key("feed_forward_length"))))?;
    let width = ff[0];
    let doubled = ff.iter().any(|&f| f == 2 * width);
    for (i, &f) in ff.iter().enumerate() {
        let want = if doubled && i >= layers - shared { 2 * width } else { width };
        if f != want {
            return Err(bad(format!("{} of layer {i} is {f}, not {want}", m.key("feed_forward_length"))));
        }
    }

    let experts = (0..layers).any(|i| has(i, "ffn_gate_inp"));
    let mut cfg = json!({
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "hidden_size": m.count("embedding_length", MAX_WIDTH)?,
        "intermediate_size": width,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_sliding,
        "num_global_key_value_heads": kv_full,
        "attention_k_eq_v": k_eq_v,
        "head_dim": head_dim,
        "global_head_dim": full_head_dim,
        "layer_types": sliding.iter().map(|&s| if s { "sliding_attention" } else { "full_attention" }).collect::<Vec<_>>(),
        // Needed only where some layer slides.
        "sliding_window": match sliding.contains(&true) {
            true => Some(m.count("attention.sliding_window", 1 << 24)?),
            false => m.u64("attention.sliding_window"),
        },
        "num_kv_shared_layers": shared,
        "use_double_wide_mlp": doubled,
        "hidden_size_per_layer_input": m.u64("embedding_length_per_layer_input").unwrap_or(0),
        "final_logit_softcapping": m.f32("final_logit_softcapping").unwrap_or(30.0),
        "max_position_embeddings": m.u64("context_length"),
        "rms_norm_eps": m.rms_norm_eps(1e-6),
        "vocab_size": m.vocab_size()?,
        "bos_token_id": m.token_id("bos"),
        "eos_token_id": m.token_id("eos"),
        "pad_token_id": m.token_id("padding"),
        "hidden_activation": "gelu_pytorch_tanh",
        "enable_moe_block": experts,
        "rope_parameters": {
            "full_attention": {"rope_type": "proportional", "rope_theta": m.f32("rope.freq_base").unwrap_or(1_000_000.0), "partial_rotary_factor": partial_rotation(m, full_head_dim)?},
            "sliding_attention": {"rope_type": "default", "rope_theta": m.f32("rope.freq_base_swa").unwrap_or(10000.0)},
        },
    });
    if let Some(t) = m.g.tensor("per_layer_token_embd.weight") {
        cfg["vocab_size_per_layer_input"] = json!(t.dims.get(1).copied().unwrap_or(0));
    }
    if experts {
        let n = m.count("expert_count", 1 << 16)?;
        cfg = with(cfg, json!({
            "num_experts": n,
            "top_k_experts": m.count("expert_used_count", n)?,
            "moe_intermediate_size": m.count("expert_feed_forward_length", MAX_WIDTH)?,
        }));
    }
    Ok(cfg)
}

/// `key` for each layer: one number for all, or an array of one per layer, each 1 to `max`.
fn per_layer(m: &Meta, key: &str, layers: usize, max: u64) -> Result<Option<Vec<u64>>> {
    let values = match m.g.get_i64_array(&m.key(key)) {
        Some(a) if a.len() == layers => a,
        Some(a) => return Err(Error::config(m.path, format!("{} has {} values, not one per layer ({layers})", m.key(key), a.len()))),
        None if m.u64(key).is_none() => return Ok(None),
        None => return Ok(Some(vec![m.count(key, max)?; layers])),
    };
    values
        .into_iter()
        .map(|v| u64::try_from(v).ok().filter(|v| (1..=max).contains(v)).ok_or_else(|| Error::config(m.path, format!("{} holds {v}, not between 1 and {max}", m.key(key)))))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// The fraction of a full layer's head that rotates: its rotated frequencies (factor 1) over all
/// of them, from `rope_freqs` (every frequency rotates without it).
fn partial_rotation(m: &Meta, head_dim: u64) -> Result<f64> {
    let Some(t) = m.g.tensor(ROPE_FREQS) else { return Ok(1.0) };
    let n = (head_dim / 2) as usize;
    if t.dims.len() != 1 || t.dims[0] != n as u64 {
        return Err(Error::tensor(ROPE_FREQS, format!("has shape {:?}, not the {n} frequencies of a full layer's head", t.dims)));
    }
    let factors = quants::dequantize(ROPE_FREQS, t.kind, m.g.tensor_data(t)?, n)?;
    let rotated = factors.iter().take_while(|&&f| f == 1.0).count();
    if factors[rotated..].iter().any(|&f| !(f >= NO_ROTATION)) {
        return Err(Error::tensor(ROPE_FREQS, "holds factors other than 1 (rotated) followed by huge ones (not rotated)"));
    }
    Ok(rotated as f64 / n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::tests::GgufWriter;
    use crate::gguf::Gguf;
    use crate::model::gguf_config::{hf_config, Arch};

    /// A gemma4 header of 4 layers (sliding, sliding, full, sliding): hidden 64, 4 heads of 16
    /// (32 on the full layer), RoPE factors rotating a quarter of the full layer's head; `edit`
    /// writes more keys and tensors.
    fn gemma4(kv: u32, edit: impl Fn(&mut GgufWriter)) -> Result<Value> {
        let mut w = GgufWriter::new();
        w.str("general.architecture", "gemma4")
            .u32("gemma4.block_count", 4)
            .u32("gemma4.embedding_length", 64)
            .u32("gemma4.attention.head_count", 4)
            .u32("gemma4.attention.head_count_kv", kv)
            .u32("gemma4.attention.key_length", 32)
            .u32("gemma4.attention.key_length_swa", 16)
            .u32("gemma4.attention.sliding_window", 512)
            .strs("tokenizer.ggml.tokens", &["a", "b"]);
        w.raw("gemma4.attention.sliding_window_pattern", 9, &[&7u32.to_le_bytes()[..], &4u64.to_le_bytes(), &[1, 1, 0, 1]].concat());
        let factors: Vec<u8> = [1.0f32, 1.0, 1.0, 1.0].iter().chain(&[1e30f32; 12]).flat_map(|f| f.to_le_bytes()).collect();
        w.tensor(ROPE_FREQS, &[16], 0, &factors);
        edit(&mut w);
        let file = w.write();
        hf_config(Arch::Gemma4, &Gguf::open(&file.0).unwrap())
    }

    #[test]
    fn gemma4_config_from_its_header() {
        let c = gemma4(2, |w| {
            w.u32("gemma4.feed_forward_length", 128);
        })
        .unwrap();
        assert_eq!(c["layer_types"], json!(["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]));
        assert_eq!((c["head_dim"].clone(), c["global_head_dim"].clone()), (json!(16), json!(32)));
        assert_eq!(c["rope_parameters"]["full_attention"]["partial_rotary_factor"], 0.25);
        assert_eq!((c["final_logit_softcapping"].clone(), c["use_double_wide_mlp"].clone()), (json!(30.0), json!(false)));
        assert_eq!((c["attention_k_eq_v"].clone(), c["enable_moe_block"].clone()), (json!(false), json!(false)));
        // A width array doubled on the layers that share KV.
        let c = gemma4(2, |w| {
            w.u32("gemma4.attention.shared_kv_layers", 1);
            w.raw("gemma4.feed_forward_length", 9, &[&4u32.to_le_bytes()[..], &4u64.to_le_bytes(), &[128u32, 128, 128, 256].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>()].concat());
        })
        .unwrap();
        assert_eq!((c["intermediate_size"].clone(), c["use_double_wide_mlp"].clone()), (json!(128), json!(true)));
        // Widths that double anywhere else are not Gemma 4's.
        let e = gemma4(2, |w| {
            w.raw("gemma4.feed_forward_length", 9, &[&4u32.to_le_bytes()[..], &4u64.to_le_bytes(), &[128u32, 256, 128, 128].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>()].concat());
        })
        .unwrap_err();
        assert!(e.to_string().contains("layer 1"), "{e}");
        // No feed-forward width at all.
        assert!(gemma4(2, |_| {}).unwrap_err().to_string().contains("feed_forward_length"));
    }
}
