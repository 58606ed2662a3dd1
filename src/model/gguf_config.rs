//! The config.json a GGUF file's header describes, per llama.cpp architecture, with the HF key
//! names and the values mlx-lm reads. Reads metadata, and the one kind of tensor that is config
//! rather than weights: Phi-3's LongRoPE factors (a few hundred floats).
use std::path::Path;

use serde_json::{json, Value};

use super::{gguf_gemma4, gguf_hybrid};
use crate::gguf::{quants, Gguf};
use crate::error::{Error, Result};

/// Gemma 3 alternates five sliding-window layers with one global layer; llama.cpp hardcodes
/// this too (GGUF has no key for it).
const GEMMA3_SLIDING_PATTERN: u64 = 6;

/// Bounds for the header's sizes, far above any published model's (widths of 16K, 128 heads,
/// 126 layers), so that a corrupt header fails before it sizes anything.
pub(super) const MAX_WIDTH: u64 = 1 << 20;
pub(super) const MAX_HEADS: u64 = 1 << 12;
pub(super) const MAX_LAYERS: u64 = super::config::MAX_LAYERS as u64;

/// The llama.cpp architectures (`general.architecture`) we read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Arch {
    Llama,
    Gemma,
    Gemma2,
    Gemma3,
    Olmo2,
    Starcoder2,
    Granite,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Phi3,
    Glm4,
    Smollm3,
    Minicpm,
    Qwen3Next,
    Qwen35,
    Qwen35Moe,
    Gemma4,
}

impl Arch {
    pub(super) fn of(g: &Gguf) -> Result<Arch> {
        match g.architecture() {
            Some("llama") => Ok(Arch::Llama),
            Some("gemma") => Ok(Arch::Gemma),
            Some("gemma2") => Ok(Arch::Gemma2),
            Some("gemma3") => Ok(Arch::Gemma3),
            Some("olmo2") => Ok(Arch::Olmo2),
            Some("starcoder2") => Ok(Arch::Starcoder2),
            Some("granite") => Ok(Arch::Granite),
            Some("qwen2") => Ok(Arch::Qwen2),
            Some("qwen3") => Ok(Arch::Qwen3),
            Some("qwen3moe") => Ok(Arch::Qwen3Moe),
            Some("phi3") => Ok(Arch::Phi3),
            Some("glm4") => Ok(Arch::Glm4),
            Some("smollm3") => Ok(Arch::Smollm3),
            Some("minicpm") => Ok(Arch::Minicpm),
            Some("qwen3next") => Ok(Arch::Qwen3Next),
            Some("qwen35") => Ok(Arch::Qwen35),
            Some("qwen35moe") => Ok(Arch::Qwen35Moe),
            Some("gemma4") => Ok(Arch::Gemma4),
            Some(other) => Err(Error::UnsupportedModelType(other.to_owned())),
            None => Err(Error::config(g.path(), "GGUF has no general.architecture")),
        }
    }
}

/// config.json for a file of architecture `arch`, without what the tensor table decides
/// (quantization, tied output, dtype).
pub(super) fn hf_config(arch: Arch, g: &Gguf) -> Result<Value> {
    let path = g.path();
    match arch {
        Arch::Llama => llama_config(&Meta { g, path, prefix: "llama" }),
        Arch::Gemma => gemma_config(&Meta { g, path, prefix: "gemma" }),
        Arch::Gemma2 => gemma2_config(&Meta { g, path, prefix: "gemma2" }),
        Arch::Gemma3 => gemma3_config(&Meta { g, path, prefix: "gemma3" }),
        Arch::Olmo2 => olmo2_config(&Meta { g, path, prefix: "olmo2" }),
        Arch::Starcoder2 => starcoder2_config(&Meta { g, path, prefix: "starcoder2" }),
        Arch::Granite => granite_config(&Meta { g, path, prefix: "granite" }),
        Arch::Qwen2 => qwen_config(&Meta { g, path, prefix: "qwen2" }, "qwen2", "Qwen2ForCausalLM"),
        Arch::Qwen3 => qwen_config(&Meta { g, path, prefix: "qwen3" }, "qwen3", "Qwen3ForCausalLM"),
        Arch::Qwen3Moe => qwen3_moe_config(&Meta { g, path, prefix: "qwen3moe" }),
        Arch::Phi3 => phi3_config(&Meta { g, path, prefix: "phi3" }),
        Arch::Glm4 => glm4_config(&Meta { g, path, prefix: "glm4" }),
        Arch::Smollm3 => smollm3_config(&Meta { g, path, prefix: "smollm3" }),
        Arch::Minicpm => minicpm_config(&Meta { g, path, prefix: "minicpm" }),
        Arch::Qwen3Next => gguf_hybrid::config(arch, &Meta { g, path, prefix: "qwen3next" }),
        Arch::Qwen35 => gguf_hybrid::config(arch, &Meta { g, path, prefix: "qwen35" }),
        Arch::Qwen35Moe => gguf_hybrid::config(arch, &Meta { g, path, prefix: "qwen35moe" }),
        Arch::Gemma4 => gguf_gemma4::config(&Meta { g, path, prefix: "gemma4" }),
    }
}

/// Metadata lookups under an architecture's key prefix (`llama.`, `gemma3.`, …).
pub(super) struct Meta<'a> {
    pub(super) g: &'a Gguf,
    pub(super) path: &'a Path,
    prefix: &'a str,
}

impl Meta<'_> {
    pub(super) fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.prefix)
    }
    pub(super) fn u64(&self, k: &str) -> Option<u64> {
        self.g.get_u64(&self.key(k))
    }
    pub(super) fn f32(&self, k: &str) -> Option<f32> {
        self.g.get_f32(&self.key(k))
    }
    pub(super) fn need(&self, k: &str) -> Result<u64> {
        self.u64(k).ok_or_else(|| Error::config(self.path, format!("GGUF is missing {}", self.key(k))))
    }
    /// A size or count the config is built from: 1 to `max` (the file is untrusted; a zero
    /// would divide by zero below, a huge value would allocate without bound).
    pub(super) fn count(&self, k: &str, max: u64) -> Result<u64> {
        match self.need(k)? {
            n @ 1.. if n <= max => Ok(n),
            n => Err(Error::config(self.path, format!("{} is {n}, not between 1 and {max}", self.key(k)))),
        }
    }
    pub(super) fn vocab_size(&self) -> Result<u64> {
        self.g
            .get_str_array("tokenizer.ggml.tokens")
            .map(|t| t.len() as u64)
            .or_else(|| self.u64("vocab_size"))
            .ok_or_else(|| Error::config(self.path, "GGUF has no tokenizer.ggml.tokens"))
    }
    /// Six significant digits, as the f32 in the file was written from a short decimal.
    pub(super) fn rms_norm_eps(&self, default: f32) -> f64 {
        let eps = self.f32("attention.layer_norm_rms_epsilon").unwrap_or(default);
        format!("{eps:.5e}").parse::<f64>().unwrap_or(eps as f64)
    }
    /// `rope_scaling` for config.json; only linear scaling is carried over.
    fn rope_scaling(&self) -> Option<Value> {
        match (self.f32("rope.scaling.factor"), self.g.get_str(&self.key("rope.scaling.type"))) {
            (Some(factor), Some("linear")) => Some(json!({"type": "linear", "factor": factor})),
            _ => None,
        }
    }
    pub(super) fn token_id(&self, which: &str) -> Option<u64> {
        self.g.get_u64(&format!("tokenizer.ggml.{which}_token_id"))
    }
}

/// What every config shares: sizes, token ids, and the head size from `head_dim_key` (else
/// hidden / heads).
pub(super) fn sizes(m: &Meta, head_dim_key: &str, default_eps: f32) -> Result<Value> {
    let hidden = m.count("embedding_length", MAX_WIDTH)?;
    let heads = m.count("attention.head_count", MAX_HEADS)?;
    Ok(json!({
        "hidden_size": hidden,
        // A model whose every layer routes may store only its experts' width.
        "intermediate_size": m.u64("expert_feed_forward_length").map_or_else(|| m.need("feed_forward_length"), |e| Ok(m.u64("feed_forward_length").unwrap_or(e)))?,
        "num_hidden_layers": m.count("block_count", MAX_LAYERS)?,
        "num_attention_heads": heads,
        "num_key_value_heads": m.u64("attention.head_count_kv").unwrap_or(heads),
        "head_dim": m.u64(head_dim_key).unwrap_or(hidden / heads),
        "max_position_embeddings": m.u64("context_length"),
        "rms_norm_eps": m.rms_norm_eps(default_eps),
        "vocab_size": m.vocab_size()?,
        "bos_token_id": m.token_id("bos"),
        "eos_token_id": m.token_id("eos"),
        "pad_token_id": m.token_id("padding"),
    }))
}

/// `extra`'s keys added to `cfg`.
pub(super) fn with(mut cfg: Value, extra: Value) -> Value {
    if let (Some(c), Value::Object(e)) = (cfg.as_object_mut(), extra) {
        c.extend(e);
    }
    cfg
}

/// The config.json of a llama-architecture GGUF, with HF key names.
fn llama_config(m: &Meta) -> Result<Value> {
    let mut cfg = with(sizes(m, "rope.dimension_count", 1e-5)?, json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "rope_theta": m.f32("rope.freq_base").unwrap_or(10000.0),
        "hidden_act": "silu",
    }));
    if let Some(s) = m.rope_scaling() {
        cfg["rope_scaling"] = s;
    }
    Ok(cfg)
}

/// Gemma 2 and 3 scale queries by query_pre_attn_scalar^-½, which GGUF does not store:
/// llama.cpp uses head_dim, except in the 27B models (`big_layers` layers), which use
/// hidden / heads.
fn query_pre_attn_scalar(cfg: &Value, big_layers: u64) -> Value {
    let n = |k: &str| cfg[k].as_u64().unwrap_or(1);
    if n("num_hidden_layers") == big_layers { json!(n("hidden_size") / n("num_attention_heads")) } else { cfg["head_dim"].clone() }
}

/// The config.json of a gemma3 GGUF, as HF's `Gemma3ForCausalLM` (model_type `gemma3_text`)
/// writes it, with the fields mlx-lm's gemma3_text reads.
fn gemma3_config(m: &Meta) -> Result<Value> {
    let cfg = sizes(m, "attention.key_length", 1e-6)?;
    let layers = m.need("block_count")?;
    let layer_types: Vec<&str> = (0..layers)
        .map(|i| if (i + 1) % GEMMA3_SLIDING_PATTERN == 0 { "full_attention" } else { "sliding_attention" })
        .collect();
    let extra = json!({
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "query_pre_attn_scalar": query_pre_attn_scalar(&cfg, 62),
        "rope_theta": m.f32("rope.freq_base").unwrap_or(1_000_000.0),
        "rope_local_base_freq": 10000.0,
        "rope_scaling": m.rope_scaling(),
        "sliding_window": m.u64("attention.sliding_window").unwrap_or(512),
        "sliding_window_pattern": GEMMA3_SLIDING_PATTERN,
        "layer_types": layer_types,
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": false,
        "attn_logit_softcapping": null,
        "final_logit_softcapping": null,
    });
    Ok(with(cfg, extra))
}

/// Qwen2 / Qwen2.5 (llama's layout with q/k/v biases) and Qwen3 (no biases, per-head q/k
/// norms): NeoX RoPE, so llama.cpp does not permute their q/k rows; `model_type` and HF class.
fn qwen_config(m: &Meta, model_type: &str, class: &str) -> Result<Value> {
    Ok(with(sizes(m, "attention.key_length", 1e-6)?, json!({
        "architectures": [class],
        "model_type": model_type,
        "rope_theta": m.f32("rope.freq_base").unwrap_or(1_000_000.0),
        "rope_scaling": m.rope_scaling(),
        "hidden_act": "silu",
    })))
}

/// Qwen3-MoE: every layer routes (llama.cpp's qwen3moe has no dense layers), its top-k scores
/// renormalised, as Qwen3-MoE checkpoints configure it.
fn qwen3_moe_config(m: &Meta) -> Result<Value> {
    let experts = m.count("expert_count", 1 << 16)?;
    let mut cfg = qwen_config(m, "qwen3_moe", "Qwen3MoeForCausalLM")?;
    cfg["num_experts"] = json!(experts);
    cfg["num_experts_per_tok"] = json!(m.count("expert_used_count", experts)?);
    cfg["moe_intermediate_size"] = json!(m.count("expert_feed_forward_length", MAX_WIDTH)?);
    cfg["decoder_sparse_step"] = json!(1);
    cfg["mlp_only_layers"] = json!([]);
    cfg["norm_topk_prob"] = json!(true);
    Ok(cfg)
}

fn gemma_config(m: &Meta) -> Result<Value> {
    Ok(with(sizes(m, "attention.key_length", 1e-6)?, json!({
        "architectures": ["GemmaForCausalLM"],
        "model_type": "gemma",
        "rope_theta": m.f32("rope.freq_base").unwrap_or(10000.0),
        "hidden_act": "gelu",
    })))
}

/// The config.json of a gemma2 GGUF, as HF's `Gemma2ForCausalLM` writes it: llama.cpp's
/// converter keeps both soft-caps and the window (which mlx-lm does not use).
fn gemma2_config(m: &Meta) -> Result<Value> {
    let cfg = sizes(m, "attention.key_length", 1e-6)?;
    let extra = json!({
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "query_pre_attn_scalar": query_pre_attn_scalar(&cfg, 46),
        "rope_theta": m.f32("rope.freq_base").unwrap_or(10000.0),
        "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": m.f32("attn_logit_softcapping").unwrap_or(50.0),
        "final_logit_softcapping": m.f32("final_logit_softcapping").unwrap_or(30.0),
        "sliding_window": m.u64("attention.sliding_window"),
    });
    Ok(with(cfg, extra))
}

/// The config.json of an olmo2 GGUF, as HF's `Olmo2ForCausalLM` writes it.
fn olmo2_config(m: &Meta) -> Result<Value> {
    Ok(with(sizes(m, "attention.key_length", 1e-6)?, json!({
        "architectures": ["Olmo2ForCausalLM"],
        "model_type": "olmo2",
        "rope_theta": m.f32("rope.freq_base").unwrap_or(10000.0),
        "rope_scaling": m.rope_scaling(),
    })))
}

/// The config.json of a starcoder2 GGUF, as HF's `Starcoder2ForCausalLM` writes it: LayerNorm's
/// epsilon is `attention.layer_norm_epsilon` (HF's `norm_epsilon`).
fn starcoder2_config(m: &Meta) -> Result<Value> {
    let eps = m.f32("attention.layer_norm_epsilon").unwrap_or(1e-5);
    Ok(with(sizes(m, "attention.key_length", 1e-5)?, json!({
        "architectures": ["Starcoder2ForCausalLM"],
        "model_type": "starcoder2",
        "norm_epsilon": format!("{eps:.5e}").parse::<f64>().unwrap_or(eps as f64),
        "rope_theta": m.f32("rope.freq_base").unwrap_or(100_000.0),
        "use_bias": true,
    })))
}

/// The config.json of a granite GGUF, as HF's `GraniteForCausalLM` writes it: llama.cpp renames
/// its multipliers to `*_scale` (`logits_scaling` to `logit_scale`).
fn granite_config(m: &Meta) -> Result<Value> {
    let mut cfg = with(sizes(m, "rope.dimension_count", 1e-5)?, json!({
        "architectures": ["GraniteForCausalLM"],
        "model_type": "granite",
        "rope_theta": m.f32("rope.freq_base").unwrap_or(10000.0),
        "attention_multiplier": m.f32("attention.scale"),
        "embedding_multiplier": m.f32("embedding_scale"),
        "residual_multiplier": m.f32("residual_scale"),
        "logits_scaling": m.f32("logit_scale"),
    }));
    if let Some(s) = m.rope_scaling() {
        cfg["rope_scaling"] = s;
    }
    Ok(cfg)
}

/// The fraction of each head that `rope.dimension_count` rotates (llama.cpp stores the count).
pub(super) fn partial_rotary_factor(m: &Meta, head_dim: u64) -> Result<f64> {
    match m.u64("rope.dimension_count") {
        None => Ok(1.0),
        Some(n @ 1..) if n <= head_dim && n % 2 == 0 => Ok(n as f64 / head_dim as f64),
        Some(n) => Err(Error::config(m.path, format!("{} is {n}: not an even count of at most the head size {head_dim}", m.key("rope.dimension_count")))),
    }
}

/// Tensors that are not the model's weights, which the loaders skip: configuration (Phi-3's
/// and MiniCPM's LongRoPE factors, Gemma 4's partial-rotation factors), and Qwen3.5's multi-token-prediction layers after the model's `layers`
/// (mlx-lm drops them too).
pub(super) fn is_skipped(arch: Arch, layers: u64, name: &str) -> bool {
    match arch {
        Arch::Phi3 | Arch::Minicpm => matches!(name, "rope_factors_long.weight" | "rope_factors_short.weight"),
        Arch::Gemma4 => name == gguf_gemma4::ROPE_FREQS,
        Arch::Qwen35 | Arch::Qwen35Moe => gguf_hybrid::is_prediction_layer(layers, name),
        _ => false,
    }
}

/// Phi-3 / Phi-3.5 / Phi-4-mini: head size hidden / heads, RoPE over `rope.dimension_count` of
/// it, and LongRoPE's per-frequency factors (Phi-3.5's 128K context) as two tensors, which
/// llama.cpp's converter writes for "su"/"longrope" scaling.
fn phi3_config(m: &Meta) -> Result<Value> {
    let mut cfg = with(sizes(m, "attention.key_length", 1e-5)?, json!({
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "rope_theta": m.f32("rope.freq_base").unwrap_or(10000.0),
    }));
    let head_dim = cfg["hidden_size"].as_u64().unwrap_or(1) / cfg["num_attention_heads"].as_u64().unwrap_or(1);
    let partial = partial_rotary_factor(m, head_dim)?;
    cfg["partial_rotary_factor"] = json!(partial);
    let original = m.u64("rope.scaling.original_context_length").or(cfg["max_position_embeddings"].as_u64());
    cfg["original_max_position_embeddings"] = json!(original);
    if let Some((long, short)) = longrope_factors(m, (head_dim as f64 * partial) as usize / 2)? {
        cfg["rope_scaling"] = json!({"type": "longrope", "long_factor": long, "short_factor": short});
    }
    Ok(cfg)
}

/// LongRoPE's per-frequency factors (long, short), which llama.cpp's converter writes as two
/// tensors, one per rotated frequency (`n`): both or neither.
fn longrope_factors(m: &Meta, n: usize) -> Result<Option<(Vec<f32>, Vec<f32>)>> {
    let factors = |name: &str| -> Result<Option<Vec<f32>>> {
        let Some(t) = m.g.tensor(name) else { return Ok(None) };
        if t.dims.len() != 1 || t.dims[0] != n as u64 {
            return Err(Error::tensor(name, format!("has shape {:?}, not the {n} factors of the rotated dimensions", t.dims)));
        }
        Ok(Some(quants::dequantize(name, t.kind, m.g.tensor_data(t)?, n)?))
    };
    match (factors("rope_factors_long.weight")?, factors("rope_factors_short.weight")?) {
        (Some(long), Some(short)) => Ok(Some((long, short))),
        (None, None) => Ok(None),
        _ => Err(Error::config(m.path, "GGUF has one of rope_factors_long and rope_factors_short, not both")),
    }
}

/// GLM-4-0414: q/k/v biases (told by the tensors), RoPE over the first `rope.dimension_count`
/// of each head (half, by default) in interleaved pairs, as in mlx-lm; llama.cpp does not permute
/// the rows.
fn glm4_config(m: &Meta) -> Result<Value> {
    let mut cfg = with(sizes(m, "attention.key_length", 1e-5)?, json!({
        "architectures": ["Glm4ForCausalLM"],
        "model_type": "glm4",
        "rope_theta": m.f32("rope.freq_base").unwrap_or(10000.0),
    }));
    let head_dim = cfg["head_dim"].as_u64().unwrap_or(1);
    cfg["partial_rotary_factor"] = json!(partial_rotary_factor(m, head_dim)?);
    Ok(cfg)
}

/// SmolLM3: llama with no RoPE in every fourth layer. GGUF has no key for that: llama.cpp
/// hardcodes the interval (4, SmolLM3's), and neither the converter nor the runtime keeps
/// sliding windows.
fn smollm3_config(m: &Meta) -> Result<Value> {
    let mut cfg = llama_config(m)?;
    cfg["architectures"] = json!(["SmolLM3ForCausalLM"]);
    cfg["model_type"] = json!("smollm3");
    cfg["no_rope_layer_interval"] = json!(4);
    Ok(cfg)
}

/// MiniCPM (1 and 2): llama blocks with muP scaling, which llama.cpp stores as the products it
/// uses (`embedding_scale` = scale_emb, `residual_scale` = scale_depth / √layers, `logit_scale` =
/// hidden / dim_model_base); mlx-lm's config fields are recovered from them. Files from older
/// converters have none of the three: their runtime hardcoded every MiniCPM release's values
/// (scale_emb 12, scale_depth 1.4, dim_model_base 256), which are the defaults here.
///
/// LongRoPE (MiniCPM4, MiniCPM-2B-128k): the converter keeps the factors but not the trained
/// length they were fitted to, so the file runs as llama.cpp runs it within its context: the
/// short factors and no attention scaling (mlx-lm's rope with the short factors as its long ones
/// and the trained length equal to the context).
fn minicpm_config(m: &Meta) -> Result<Value> {
    let mut cfg = sizes(m, "attention.key_length", 1e-5)?;
    let rotated = cfg["hidden_size"].as_u64().unwrap_or(0) / cfg["num_attention_heads"].as_u64().unwrap_or(1) / 2;
    if let Some((_, short)) = longrope_factors(m, rotated as usize)? {
        let context = cfg["max_position_embeddings"].as_u64().ok_or_else(|| Error::config(m.path, format!("LongRoPE needs {}", m.key("context_length"))))?;
        cfg["rope_scaling"] = json!({"type": "longrope", "long_factor": short, "short_factor": short, "original_max_position_embeddings": context});
    }
    let layers = cfg["num_hidden_layers"].as_u64().unwrap_or(1) as f64;
    let hidden = cfg["hidden_size"].as_u64().unwrap_or(1) as f64;
    let positive = |k: &str, default: f64| -> Result<f64> {
        match m.f32(k) {
            Some(v) if v.is_finite() && v > 0.0 => Ok(v as f64),
            Some(v) => Err(Error::config(m.path, format!("{} is {v}, not a positive number", m.key(k)))),
            None => Ok(default),
        }
    };
    Ok(with(cfg, json!({
        "architectures": ["MiniCPMForCausalLM"],
        "model_type": "minicpm",
        "rope_theta": m.f32("rope.freq_base").unwrap_or(10000.0),
        "scale_emb": positive("embedding_scale", 12.0)?,
        "scale_depth": positive("residual_scale", 1.4 / layers.sqrt())? * layers.sqrt(),
        "dim_model_base": hidden / positive("logit_scale", hidden / 256.0)?,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::tests::GgufWriter;

    /// A phi3 header (hidden 64, 4 heads: head size 16), with `extra` metadata and tensors.
    fn phi3(extra: impl Fn(&mut GgufWriter)) -> Result<Value> {
        let mut w = GgufWriter::new();
        w.str("general.architecture", "phi3")
            .u32("phi3.embedding_length", 64)
            .u32("phi3.block_count", 1)
            .u32("phi3.feed_forward_length", 128)
            .u32("phi3.attention.head_count", 4)
            .u32("phi3.context_length", 4096)
            .strs("tokenizer.ggml.tokens", &["a", "b"]);
        extra(&mut w);
        let file = w.write();
        hf_config(Arch::Phi3, &Gguf::open(&file.0).unwrap())
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn phi3_longrope_factors_come_from_their_tensors() {
        let cfg = phi3(|w| {
            w.u32("phi3.rope.dimension_count", 8).u32("phi3.rope.scaling.original_context_length", 1024);
            w.tensor("rope_factors_long.weight", &[4], 0, &f32s(&[1.0, 1.25, 2.5, 4.0]));
            w.tensor("rope_factors_short.weight", &[4], 0, &f32s(&[1.0, 1.05, 1.1, 1.2]));
        })
        .unwrap();
        assert_eq!(cfg["partial_rotary_factor"], json!(0.5));
        assert_eq!(cfg["original_max_position_embeddings"], json!(1024));
        assert_eq!(cfg["rope_scaling"]["type"], json!("longrope"));
        assert_eq!(cfg["rope_scaling"]["long_factor"], json!([1.0, 1.25, 2.5, 4.0]));
        // Without factors: plain RoPE over the whole head, the context as the original one.
        let cfg = phi3(|_| {}).unwrap();
        assert_eq!((cfg["partial_rotary_factor"].clone(), cfg["rope_scaling"].clone()), (json!(1.0), Value::Null));
        assert_eq!(cfg["original_max_position_embeddings"], json!(4096));
    }

    #[test]
    fn phi3_rope_sizes_are_checked_against_the_head() {
        let err = |e: Result<Value>| e.unwrap_err().to_string();
        let odd = err(phi3(|w| {
            w.u32("phi3.rope.dimension_count", 7);
        }));
        assert!(odd.contains("phi3.rope.dimension_count is 7"), "{odd}");
        let wider = err(phi3(|w| {
            w.u32("phi3.rope.dimension_count", 32);
        }));
        assert!(wider.contains("at most the head size 16"), "{wider}");
        let short = err(phi3(|w| {
            w.u32("phi3.rope.dimension_count", 8);
            w.tensor("rope_factors_long.weight", &[3], 0, &f32s(&[1.0; 3]));
            w.tensor("rope_factors_short.weight", &[3], 0, &f32s(&[1.0; 3]));
        }));
        assert!(short.contains("rope_factors_long.weight") && short.contains("not the 4 factors"), "{short}");
        let one = err(phi3(|w| {
            w.tensor("rope_factors_long.weight", &[8], 0, &f32s(&[1.0; 8]));
        }));
        assert!(one.contains("not both"), "{one}");
    }

    #[test]
    fn minicpm_scales_are_recovered_and_checked() {
        let file = |scale: f32| {
            let mut w = GgufWriter::new();
            w.str("general.architecture", "minicpm")
                .u32("minicpm.embedding_length", 64)
                .u32("minicpm.block_count", 4)
                .u32("minicpm.feed_forward_length", 128)
                .u32("minicpm.attention.head_count", 4)
                .f32("minicpm.embedding_scale", scale)
                .f32("minicpm.residual_scale", 0.7)
                .f32("minicpm.logit_scale", 4.0)
                .strs("tokenizer.ggml.tokens", &["a", "b"]);
            w.write()
        };
        let f = file(12.0);
        let cfg = hf_config(Arch::Minicpm, &Gguf::open(&f.0).unwrap()).unwrap();
        assert_eq!(cfg["scale_emb"], json!(12.0));
        assert!((cfg["scale_depth"].as_f64().unwrap() - 1.4).abs() < 1e-6, "{}", cfg["scale_depth"]);
        assert_eq!(cfg["dim_model_base"], json!(16.0));
        // A file from an older converter, without the scales: every MiniCPM release's values.
        let mut w = GgufWriter::new();
        w.str("general.architecture", "minicpm")
            .u32("minicpm.embedding_length", 2304)
            .u32("minicpm.block_count", 40)
            .u32("minicpm.feed_forward_length", 5760)
            .u32("minicpm.attention.head_count", 36)
            .strs("tokenizer.ggml.tokens", &["a", "b"]);
        let old = w.write();
        let cfg = hf_config(Arch::Minicpm, &Gguf::open(&old.0).unwrap()).unwrap();
        assert_eq!(cfg["scale_emb"], json!(12.0));
        assert!((cfg["scale_depth"].as_f64().unwrap() - 1.4).abs() < 1e-12);
        assert_eq!(cfg["dim_model_base"], json!(256.0));
        let f = file(0.0);
        let e = hf_config(Arch::Minicpm, &Gguf::open(&f.0).unwrap()).unwrap_err().to_string();
        assert!(e.contains("minicpm.embedding_scale is 0, not a positive number"), "{e}");
    }
}
