//! `config.json` as the model code needs it, with mlx-lm's defaults, plus the quantization block.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};

#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// Where the config came from (a config.json or a GGUF file); used in error messages.
    pub source: PathBuf,
    pub model_type: String,
    pub architectures: Vec<String>,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    pub rope_theta: f32,
    pub rope_traditional: bool,
    pub rope_scaling: Option<RopeScaling>,
    pub max_position_embeddings: Option<usize>,
    /// `None` when config.json does not say; each architecture has its own default.
    pub tie_word_embeddings: Option<bool>,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    /// config.json's `eos_token_id`. The engine's copy of a loaded model's config also holds the
    /// tokenizer's (`tokenizer::model_eos_ids`): `generate()` stops at those by default.
    pub eos_token_ids: Vec<u32>,
    pub torch_dtype: Option<String>,
    pub quantization: Option<Quantization>,
    /// Per-layer KV-cache quantization from `kv_config.json` beside config.json, if present.
    pub kv_quant: Option<Vec<KvQuantSpec>>,
    /// Whether the folder carries a vision encoder beside the language model
    /// (`optiq_vision.safetensors`, mlx-bun's sidecar).
    pub has_vision_sidecar: bool,
    pub raw: Value,
}

/// One entry of `kv_config.json`: how layer `layer_idx`'s KV cache is quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvQuantSpec {
    pub layer_idx: usize,
    pub bits: i32,
    pub group_size: i32,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    Linear { factor: f32 },
    Llama3 { factor: f32, low_freq_factor: f32, high_freq_factor: f32, original_max_position_embeddings: f32 },
    /// Phi-3's "su" / "longrope" scaling (mlx-lm applies the long factors at every length).
    SuScaled { long_factor: Vec<f32>, max_position_embeddings: f32, original_max_position_embeddings: f32 },
}

/// MLX affine quantization: a default plus per-module overrides (`false` = not quantized).
#[derive(Debug, Clone, PartialEq)]
pub struct Quantization {
    pub group_size: i32,
    pub bits: i32,
    pub per_layer: BTreeMap<String, Option<QuantParams>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantParams {
    pub group_size: i32,
    pub bits: i32,
}

impl Quantization {
    /// Parameters for the module at `path` (e.g. `model.embed_tokens`), `None` if it stays dense.
    pub fn params_for(&self, path: &str) -> Option<QuantParams> {
        match self.per_layer.get(path) {
            Some(p) => *p,
            None => Some(QuantParams { group_size: self.group_size, bits: self.bits }),
        }
    }
}

impl ModelConfig {
    /// The model itself: its folder (for a config.json) or its GGUF file.
    pub fn model_path(&self) -> PathBuf {
        match self.source.parent() {
            Some(dir) if self.source.file_name().is_some_and(|n| n == "config.json") => dir.to_path_buf(),
            _ => self.source.clone(),
        }
    }

    /// An architecture-specific number from config.json, or `default`.
    pub fn f32_or(&self, key: &str, default: f32) -> f32 {
        self.raw.get(key).and_then(Value::as_f64).map_or(default, |v| v as f32)
    }

    /// A number the architecture cannot do without (e.g. Granite's multipliers).
    pub fn required_f64(&self, key: &str) -> Result<f64> {
        self.raw.get(key).and_then(Value::as_f64).ok_or_else(|| Error::config(&self.source, format!("{} needs a number {key}", self.model_type)))
    }

    pub fn usize_opt(&self, key: &str) -> Option<usize> {
        self.raw.get(key).and_then(Value::as_u64).map(|v| v as usize)
    }

    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        if !dir.exists() {
            return Err(Error::ModelNotFound(dir.to_path_buf()));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let raw: Value =
            serde_json::from_str(&text).map_err(|e| Error::config(&path, e.to_string()))?;
        let mut cfg = Self::from_value(raw, path)?;
        cfg.kv_quant = kv_quant(&dir.join("kv_config.json"), cfg.num_hidden_layers)?;
        cfg.has_vision_sidecar = dir.join("optiq_vision.safetensors").is_file();
        Ok(cfg)
    }

    pub fn from_value(raw: Value, source: PathBuf) -> Result<Self> {
        let raw = language_model(raw);
        let f = Fields { raw: &raw, source: &source };
        let model_type = f.str("model_type")?;
        let hidden_size = f.usize("hidden_size")?;
        let num_attention_heads = f.usize("num_attention_heads")?;
        if num_attention_heads == 0 || hidden_size == 0 {
            return Err(Error::config(&source, "hidden_size and num_attention_heads must be > 0"));
        }
        let num_key_value_heads = f.opt_usize("num_key_value_heads")?.unwrap_or(num_attention_heads);
        if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            return Err(Error::config(
                &source,
                format!("num_attention_heads {num_attention_heads} is not a multiple of num_key_value_heads {num_key_value_heads}"),
            ));
        }
        let head_dim = f.opt_usize("head_dim")?.unwrap_or(hidden_size / num_attention_heads);
        // Sizes that the model code divides by, iterates over or makes caches of: zero is never
        // a model, and reaching the code with it would divide by zero or build empty caches.
        for (key, value) in [("num_hidden_layers", f.usize("num_hidden_layers")?), ("intermediate_size", f.usize("intermediate_size")?), ("vocab_size", f.usize("vocab_size")?), ("head_dim", head_dim)] {
            if value == 0 {
                return Err(Error::config(&source, format!("{key} must be > 0")));
            }
        }
        if f.usize("num_hidden_layers")? > MAX_LAYERS {
            return Err(Error::config(&source, format!("num_hidden_layers must be at most {MAX_LAYERS}")));
        }
        for key in ["sliding_window", "sliding_window_pattern"] {
            if f.opt_usize(key)? == Some(0) {
                return Err(Error::config(&source, format!("{key} must be > 0")));
            }
        }
        let cfg = ModelConfig {
            architectures: raw
                .get("architectures")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
                .unwrap_or_default(),
            hidden_size,
            num_hidden_layers: f.usize("num_hidden_layers")?,
            intermediate_size: f.usize("intermediate_size")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: f.opt_f32("rms_norm_eps")?.unwrap_or(1e-6),
            vocab_size: f.usize("vocab_size")?,
            rope_theta: f.opt_f32("rope_theta")?.unwrap_or(10000.0),
            rope_traditional: raw.get("rope_traditional").and_then(Value::as_bool).unwrap_or(false),
            rope_scaling: rope_scaling(&raw, &source)?,
            max_position_embeddings: f.opt_usize("max_position_embeddings")?,
            tie_word_embeddings: raw.get("tie_word_embeddings").and_then(Value::as_bool),
            attention_bias: raw.get("attention_bias").and_then(Value::as_bool).unwrap_or(false),
            mlp_bias: raw.get("mlp_bias").and_then(Value::as_bool).unwrap_or(false),
            eos_token_ids: token_ids(raw.get("eos_token_id")),
            torch_dtype: raw.get("torch_dtype").and_then(Value::as_str).map(str::to_owned),
            quantization: quantization(&raw, &source)?,
            kv_quant: None,
            has_vision_sidecar: false,
            model_type,
            source,
            raw,
        };
        Ok(cfg)
    }
}

/// A multimodal checkpoint's language model as mlx-lm runs it: `gemma4` (Gemma 4 E2B/E4B, 26B,
/// 31B as published, towers for images and audio beside the text model) holds the text model's
/// config in `text_config`, whose vocabulary is the top level's (mlx-lm's `gemma4.ModelArgs`);
/// `qwen3_5` / `qwen3_5_moe` hold all of it there (mlx-lm's `qwen3_5.TextModelArgs`).
/// The text config becomes the top level; the wrapper's type, quantization block and token ids
/// stay, so the weights' names and quantized layers are found as the file has them.
fn language_model(raw: Value) -> Value {
    let (Some(kind @ ("gemma4" | "qwen3_5" | "qwen3_5_moe")), Some(Value::Object(text))) = (raw.get("model_type").and_then(Value::as_str), raw.get("text_config")) else {
        return raw;
    };
    let mut merged = text.clone();
    if kind == "gemma4" {
        merged.insert("vocab_size".into(), raw.get("vocab_size").cloned().unwrap_or(Value::from(262_144)));
        merged.entry("num_attention_heads").or_insert(Value::from(8));
        merged.entry("num_key_value_heads").or_insert(Value::from(1));
    } else {
        // mlx-lm's qwen3_5.TextModelArgs defaults, for keys the text config leaves out.
        for (key, default) in [("vocab_size", 151_936), ("hidden_size", 4096), ("intermediate_size", 14_336), ("num_hidden_layers", 32), ("num_attention_heads", 32), ("num_key_value_heads", 8)] {
            merged.entry(key).or_insert(Value::from(default));
        }
        merged.entry("rms_norm_eps").or_insert(Value::from(1e-6));
    }
    for key in ["model_type", "architectures", "quantization", "quantization_config", "eos_token_id", "bos_token_id", "pad_token_id", "torch_dtype", "text_config"] {
        if let Some(v) = raw.get(key) {
            merged.insert(key.into(), v.clone());
        }
    }
    Value::Object(merged)
}

/// Reads `kv_config.json` (a list of `{layer_idx, bits, group_size}`), checking every number
/// against what MLX's quantized KV cache takes and the model's layer count.
fn kv_quant(path: &Path, layers: usize) -> Result<Option<Vec<KvQuantSpec>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    let specs: Vec<KvQuantSpec> = serde_json::from_str(&text).map_err(|e| Error::config(path, format!("not a list of {{layer_idx, bits, group_size}}: {e}")))?;
    for s in &specs {
        if s.layer_idx >= layers {
            return Err(Error::config(path, format!("layer_idx {} is not a layer (the model has {layers})", s.layer_idx)));
        }
        check_quant(path, &format!("layer {}", s.layer_idx), s.group_size, s.bits)?;
    }
    Ok(Some(specs))
}

/// Reads `eos_token_id`-style fields: an integer or a list of integers.
pub fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(|v| v.as_u64().map(|n| n as u32)).collect(),
        _ => Vec::new(),
    }
}

struct Fields<'a> {
    raw: &'a Value,
    source: &'a Path,
}

impl Fields<'_> {
    fn missing(&self, key: &str) -> Error {
        Error::config(self.source, format!("missing required field '{key}'"))
    }
    fn wrong(&self, key: &str, want: &str) -> Error {
        Error::config(self.source, format!("field '{key}' must be {want}"))
    }
    fn str(&self, key: &str) -> Result<String> {
        match self.raw.get(key) {
            None | Some(Value::Null) => Err(self.missing(key)),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(self.wrong(key, "a string")),
        }
    }
    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.raw.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| self.wrong(key, "a non-negative integer")),
        }
    }
    fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| self.missing(key))
    }
    fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.raw.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_f64().map(|n| Some(n as f32)).ok_or_else(|| self.wrong(key, "a number")),
        }
    }
}

fn rope_scaling(raw: &Value, source: &Path) -> Result<Option<RopeScaling>> {
    let Some(s) = raw.get("rope_scaling").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = s.get("rope_type").or_else(|| s.get("type")).and_then(Value::as_str).unwrap_or("default");
    let num = |k: &str, default: Option<f32>| -> Result<f32> {
        s.get(k)
            .and_then(Value::as_f64)
            .map(|v| v as f32)
            .or(default)
            .ok_or_else(|| Error::config(source, format!("rope_scaling.{k} is required for rope_type '{kind}'")))
    };
    match kind {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear { factor: num("factor", None)? })),
        "llama3" => Ok(Some(RopeScaling::Llama3 {
            factor: num("factor", None)?,
            low_freq_factor: num("low_freq_factor", Some(1.0))?,
            high_freq_factor: num("high_freq_factor", Some(4.0))?,
            original_max_position_embeddings: num("original_max_position_embeddings", Some(8192.0))?,
        })),
        "su" | "longrope" => {
            let long_factor = s
                .get("long_factor")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|v| v.as_f64().map(|v| v as f32)).collect())
                .ok_or_else(|| Error::config(source, "rope_scaling.long_factor must be a list of numbers"))?;
            let top = |k: &str, d: f32| raw.get(k).and_then(Value::as_f64).map_or(d, |v| v as f32);
            // mlx-lm's Phi-3 reads the trained length from the top level; every other model
            // (rope_utils: MiniCPM, Llama) from rope_scaling, where it is required.
            let original = match raw.get("model_type").and_then(Value::as_str) {
                Some("phi3") => top("original_max_position_embeddings", 4096.0),
                _ => num("original_max_position_embeddings", None)?,
            };
            Ok(Some(RopeScaling::SuScaled {
                long_factor,
                max_position_embeddings: top("max_position_embeddings", 131072.0),
                original_max_position_embeddings: original,
            }))
        }
        other => Err(Error::config(source, format!("unsupported rope_scaling type '{other}'"))),
    }
}

/// Far more layers than any published model has (the deepest have ~126): a config that claims
/// more is damaged, and is refused before per-layer lists are sized by it.
pub const MAX_LAYERS: usize = 1 << 12;

/// The bit widths MLX's affine quantization takes (weights and KV caches).
pub const QUANT_BITS: [i32; 6] = [2, 3, 4, 5, 6, 8];
/// The group sizes MLX's affine quantization takes.
pub const QUANT_GROUP_SIZES: [i32; 3] = [32, 64, 128];

/// MLX's affine quantization takes these bit widths and group sizes only; any other value would
/// reach the weight shapes' arithmetic (a group size of 0 divides by zero).
fn check_quant(source: &Path, at: &str, group_size: i32, bits: i32) -> Result<()> {
    if !QUANT_BITS.contains(&bits) {
        return Err(Error::config(source, format!("{at}.bits is {bits}, not one of 2, 3, 4, 5, 6, 8")));
    }
    if !QUANT_GROUP_SIZES.contains(&group_size) {
        return Err(Error::config(source, format!("{at}.group_size is {group_size}, not one of 32, 64, 128")));
    }
    Ok(())
}

fn quantization(raw: &Value, source: &Path) -> Result<Option<Quantization>> {
    let Some(q) = raw.get("quantization").or_else(|| raw.get("quantization_config")).filter(|v| !v.is_null())
    else {
        return Ok(None);
    };
    #[derive(Deserialize)]
    struct Params {
        group_size: i32,
        bits: i32,
    }
    let obj = q.as_object().ok_or_else(|| Error::config(source, "quantization must be an object"))?;
    let get = |k: &str| obj.get(k).and_then(Value::as_i64).map(|v| v as i32);
    let (Some(group_size), Some(bits)) = (get("group_size"), get("bits")) else {
        return Err(Error::config(source, "quantization needs group_size and bits"));
    };
    check_quant(source, "quantization", group_size, bits)?;
    if let Some(mode) = obj.get("mode").and_then(Value::as_str) {
        if mode != "affine" {
            return Err(Error::config(source, format!("quantization mode '{mode}' is not supported (only affine)")));
        }
    }
    let mut per_layer = BTreeMap::new();
    for (k, v) in obj {
        match v {
            Value::Bool(false) => {
                per_layer.insert(k.clone(), None);
            }
            Value::Object(_) => {
                let p: Params = serde_json::from_value(v.clone())
                    .map_err(|e| Error::config(source, format!("quantization.{k}: {e}")))?;
                check_quant(source, &format!("quantization.{k}"), p.group_size, p.bits)?;
                per_layer.insert(k.clone(), Some(QuantParams { group_size: p.group_size, bits: p.bits }));
            }
            _ => {}
        }
    }
    Ok(Some(Quantization { group_size, bits, per_layer }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smol() -> Value {
        json!({
            "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 576,
            "num_hidden_layers": 30, "intermediate_size": 1536, "num_attention_heads": 9,
            "num_key_value_heads": 3, "rms_norm_eps": 1e-5, "vocab_size": 49152,
            "rope_theta": 100000.0, "tie_word_embeddings": true, "eos_token_id": 2
        })
    }

    #[test]
    fn parses_smollm2_config_with_defaults() {
        let c = ModelConfig::from_value(smol(), "config.json".into()).unwrap();
        assert_eq!(c.head_dim, 64);
        assert_eq!(c.num_key_value_heads, 3);
        assert_eq!(c.eos_token_ids, vec![2]);
        assert_eq!(c.tie_word_embeddings, Some(true));
        assert_eq!(c.rope_scaling, None);
        assert!(c.quantization.is_none());
    }

    #[test]
    fn sizes_the_model_divides_by_must_be_positive() {
        let set = |k: &str, v: Value| {
            let mut c = smol();
            c[k] = v;
            ModelConfig::from_value(c, "x/config.json".into())
        };
        for key in ["num_hidden_layers", "intermediate_size", "vocab_size", "head_dim", "sliding_window", "sliding_window_pattern", "hidden_size", "num_attention_heads"] {
            let e = set(key, json!(0)).unwrap_err();
            assert_eq!(e.code(), "INVALID_CONFIG", "{key}");
            assert!(e.to_string().contains(key), "{key}: {e}");
        }
        for (q, named) in [
            (json!({"group_size": 0, "bits": 4}), "quantization.group_size is 0"),
            (json!({"group_size": 64, "bits": 7}), "quantization.bits is 7"),
            (json!({"group_size": 64, "bits": 4, "lm_head": {"group_size": 0, "bits": 4}}), "quantization.lm_head.group_size is 0"),
        ] {
            let e = set("quantization", q).unwrap_err();
            assert_eq!(e.code(), "INVALID_CONFIG");
            assert!(e.to_string().contains(named), "{e}");
        }
        assert!(set("sliding_window", json!(4096)).is_ok());
        let e = set("num_hidden_layers", json!(1u64 << 40)).unwrap_err();
        assert!(e.to_string().contains("num_hidden_layers must be at most 4096"), "{e}");
    }

    #[test]
    fn missing_field_is_named() {
        let mut v = smol();
        v.as_object_mut().unwrap().remove("hidden_size");
        let e = ModelConfig::from_value(v, "x/config.json".into()).unwrap_err();
        assert_eq!(e.code(), "INVALID_CONFIG");
        assert!(e.to_string().contains("'hidden_size'"), "{e}");
    }

    #[test]
    fn wrong_type_and_bad_head_split_are_rejected() {
        let mut v = smol();
        v["num_hidden_layers"] = json!("thirty");
        assert!(ModelConfig::from_value(v, "c".into()).unwrap_err().to_string().contains("num_hidden_layers"));
        let mut v = smol();
        v["num_key_value_heads"] = json!(4);
        assert!(ModelConfig::from_value(v, "c".into()).unwrap_err().to_string().contains("multiple"));
    }

    #[test]
    fn quantization_default_and_overrides() {
        let mut v = smol();
        v["quantization"] = json!({"group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8}, "lm_head": false});
        let q = ModelConfig::from_value(v, "c".into()).unwrap().quantization.unwrap();
        assert_eq!(q.params_for("model.layers.0.mlp.up_proj"), Some(QuantParams { group_size: 32, bits: 4 }));
        assert_eq!(q.params_for("model.embed_tokens"), Some(QuantParams { group_size: 32, bits: 8 }));
        assert_eq!(q.params_for("lm_head"), None);
    }

    #[test]
    fn llama3_rope_scaling_and_eos_lists() {
        let mut v = smol();
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 32.0, "original_max_position_embeddings": 8192});
        v["eos_token_id"] = json!([128001, 128008, 128009]);
        let c = ModelConfig::from_value(v, "c".into()).unwrap();
        assert_eq!(c.eos_token_ids, vec![128001, 128008, 128009]);
        assert!(matches!(c.rope_scaling, Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, .. }) if factor == 32.0 && low_freq_factor == 1.0 && high_freq_factor == 4.0));
        let mut v = smol();
        v["rope_scaling"] = json!({"type": "yarn", "factor": 4.0});
        assert!(ModelConfig::from_value(v, "c".into()).unwrap_err().to_string().contains("yarn"));
    }
}
