//! `fit`: will a model fit this machine at a context, how long a context is safe, and how fast it
//! should decode. mlx-bun's memory contract (its `fit.ts` and `kv-scheme.ts`), term for term:
//!
//! - usable = RAM × 0.75 (Metal's recommended working set on Apple's consumer chips), unless a
//!   budget is given;
//! - total(n) = weights + KV(n) + transient(n);
//! - KV(n): each full-attention layer holds n positions of K and V, each sliding layer at most
//!   its window, at 2 bytes an element (bf16) or, for an affine-quantized cache, bits/8 + 4/group
//!   (the packed values plus a bf16 scale and bias per group); recurrent (linear-attention)
//!   layers add a constant state instead (none of this engine's architectures has them, so that
//!   term is 0 here; it is kept so configs of such models are billed as mlx-bun bills them);
//! - transient(n): a prefill chunk's activations, 0.55 MB per chunk token (measured by mlx-bun
//!   on an M4 Pro), plus the attention scores MLX materialises when its fused attention kernel
//!   does not serve the head dim;
//! - the safe context: the largest n with total(n) ≤ usable, by bisection (total is monotone);
//! - decode speed: bandwidth ÷ the bytes one token reads (all weights but the experts a
//!   mixture-of-experts model skips, plus the KV cache) × mlx-bun's measured efficiency.
//!
//! Every number is a prediction from the config, the weights' size and the machine; nothing here
//! touches MLX. JavaScript numbers are f64, and so is the arithmetic here, so the CLI, the server
//! and `fit()` in JavaScript agree to the last bit.
pub mod machine;

#[cfg(test)]
mod tests;

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::hub::registry::{self, ModelRecord};
use crate::model::config::{self, ModelConfig, QUANT_BITS, QUANT_GROUP_SIZES};
use crate::model::open_config;
use crate::model::text::text_config;
pub use machine::{this_machine, BandwidthSource, Machine, MachineSpec, APPLE_SKUS};

/// Decode speed over the bandwidth ceiling, measured by mlx-bun (24.9 of 30.3 tok/s on an M4 Pro).
pub const DECODE_EFFICIENCY: f64 = 0.82;
/// The same for mixture-of-experts models, against the bytes of the experts actually read.
pub const MOE_DECODE_EFFICIENCY: f64 = 0.76;
/// Prefill activations per chunk token (mlx-bun measured ~1.1 GB at 2048).
pub const TRANSIENT_PER_TOKEN: f64 = 0.55e6;
/// The share of RAM usable as the GPU's working set.
pub const WIRED_FRACTION: f64 = 0.75;
/// Prompt tokens per prefill step (the engine's and mlx-lm's default).
pub const DEFAULT_CHUNK: f64 = 2048.0;
/// bf16: the element size of an unquantized KV cache, of attention scores and of conv state.
const BF16_BYTES: f64 = 2.0;
/// Head dims MLX's fused attention kernel serves for more than 8 queries (mlx-bun's list, from
/// MLX's Metal kernel); any other head dim runs a composed fallback that materialises the bf16
/// scores [heads, queries, keys] of one layer at a time.
const FUSED_SDPA_HEAD_DIMS: [f64; 5] = [64.0, 72.0, 80.0, 96.0, 128.0];
/// Up to this many queries (decode) the fused kernel serves every head dim.
const SDPA_FUSED_MAX_QUERIES: f64 = 8.0;
/// The context searched when a config gives no `maxPositionEmbeddings`: MLX indexes positions
/// with int32. (mlx-bun would compute NaN and report 0; a missing field is not a zero context.)
const CONTEXT_LIMIT: f64 = i32::MAX as f64;
/// The layer bound configs are read with; bounds the per-layer loops for configs from callers.
const MAX_LAYERS: f64 = config::MAX_LAYERS as f64;

/// What kind of mixing a layer does, from `layerTypes` (anything but the two named kinds is
/// full attention, as in mlx-bun).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    Full,
    Sliding,
    /// Linear attention (DeltaNet): a constant recurrent state instead of a KV cache.
    Linear,
}

/// Sizes of the recurrent state of linear-attention layers (mlx-bun's `linear*` fields).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Recurrent {
    pub num_value_heads: f64,
    pub num_key_heads: f64,
    pub key_head_dim: f64,
    pub value_head_dim: f64,
    pub conv_kernel_dim: f64,
}

/// The sizes `fit` reads: mlx-bun's `TextConfig` fields of the same names.
#[derive(Clone, Debug, PartialEq)]
pub struct Text {
    pub num_hidden_layers: usize,
    /// Per layer; missing entries are full attention.
    pub layer_types: Vec<LayerKind>,
    pub num_attention_heads: f64,
    pub num_key_value_heads: f64,
    pub head_dim: f64,
    /// K/V heads and head dim of the full-attention layers.
    pub num_global_key_value_heads: f64,
    pub global_head_dim: f64,
    pub sliding_window: f64,
    pub max_position_embeddings: Option<f64>,
    pub enable_moe_block: bool,
    pub num_experts: f64,
    pub top_k_experts: f64,
    pub recurrent: Recurrent,
}

fn bad(field: &str, why: impl std::fmt::Display) -> Error {
    Error::option("config", format!("text.{field} {why}"))
}

/// A count or a size: a non-negative integer JavaScript holds exactly.
fn count(field: &str, v: &Value) -> Result<f64> {
    v.as_f64()
        .filter(|n| *n >= 0.0 && n.fract() == 0.0 && *n <= 9_007_199_254_740_991.0)
        .ok_or_else(|| bad(field, format!("must be a non-negative integer, got {v}")))
}

impl Text {
    /// The geometry of a model this engine has read (`loadModelConfig(dir).text`).
    pub fn of(config: &ModelConfig) -> Result<Text> {
        Text::from_json(&text_config(config))
    }

    /// Reads `loadModelConfig().text`, or a hand-made object with its names. Required:
    /// `numHiddenLayers`, `numAttentionHeads`, `numKeyValueHeads`, `headDim`; the rest default
    /// as `loadModelConfig` defaults them.
    pub fn from_json(text: &Value) -> Result<Text> {
        let obj = text.as_object().ok_or_else(|| Error::option("config", "must be loadModelConfig()'s result (an object with `text`)"))?;
        let field = |k: &str| obj.get(k).filter(|v| !v.is_null());
        let required = |k: &str| field(k).ok_or_else(|| bad(k, "is required")).and_then(|v| count(k, v));
        let or = |k: &str, default: f64| field(k).map_or(Ok(default), |v| count(k, v));
        let layers = required("numHiddenLayers")?;
        if layers > MAX_LAYERS {
            return Err(bad("numHiddenLayers", format!("is {layers}: more layers than any model has")));
        }
        let layer_types = match field("layerTypes") {
            None => Vec::new(),
            Some(Value::Array(types)) if types.len() as f64 <= MAX_LAYERS => types
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(LayerKind::Sliding),
                    Some("linear_attention") => Ok(LayerKind::Linear),
                    Some(_) => Ok(LayerKind::Full),
                    None => Err(bad("layerTypes", format!("must hold strings, got {t}"))),
                })
                .collect::<Result<_>>()?,
            Some(v) => return Err(bad("layerTypes", format!("must be a list of layer kinds, got {v}"))),
        };
        let enable_moe_block = match field("enableMoeBlock") {
            None => false,
            Some(v) => v.as_bool().ok_or_else(|| bad("enableMoeBlock", format!("must be a boolean, got {v}")))?,
        };
        let (kv_heads, head_dim) = (required("numKeyValueHeads")?, required("headDim")?);
        let t = Text {
            num_hidden_layers: layers as usize,
            layer_types,
            num_attention_heads: required("numAttentionHeads")?,
            num_key_value_heads: kv_heads,
            head_dim,
            num_global_key_value_heads: or("numGlobalKeyValueHeads", kv_heads)?,
            global_head_dim: or("globalHeadDim", head_dim)?,
            sliding_window: or("slidingWindow", 0.0)?,
            max_position_embeddings: field("maxPositionEmbeddings").map(|v| count("maxPositionEmbeddings", v)).transpose()?,
            enable_moe_block,
            num_experts: or("numExperts", 0.0)?,
            top_k_experts: or("topKExperts", 0.0)?,
            recurrent: Recurrent {
                num_value_heads: or("linearNumValueHeads", 0.0)?,
                num_key_heads: or("linearNumKeyHeads", 0.0)?,
                key_head_dim: or("linearKeyHeadDim", 0.0)?,
                value_head_dim: or("linearValueHeadDim", 0.0)?,
                conv_kernel_dim: or("linearConvKernelDim", 0.0)?,
            },
        };
        if t.enable_moe_block && t.top_k_experts > t.num_experts {
            return Err(bad("topKExperts", format!("is {}, more than numExperts ({})", t.top_k_experts, t.num_experts)));
        }
        Ok(t)
    }

    fn kind(&self, layer: usize) -> LayerKind {
        self.layer_types.get(layer).copied().unwrap_or(LayerKind::Full)
    }

    fn is_moe(&self) -> bool {
        self.enable_moe_block && self.num_experts > 0.0
    }
}

/// How the KV cache is stored (mlx-bun's `FitKvScheme`): bf16 by default; `kv_bits` quantizes
/// every attention layer; `per_layer` (kv_config.json's entries) quantizes the layers it lists.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvScheme {
    /// (bits, group size) for every attention layer.
    pub uniform: Option<(f64, f64)>,
    /// (layer, bits, group size) for the layers listed; the others stay bf16.
    pub per_layer: Vec<(usize, f64, f64)>,
}

/// Bytes per stored element of an affine-quantized KV cache: the packed bits plus a bf16 scale
/// and bias per group.
pub fn kv_quant_bytes_per_element(bits: f64, group_size: f64) -> f64 {
    bits / 8.0 + 4.0 / group_size
}

fn quant(option: &'static str, bits: &Value, group: Option<&Value>) -> Result<(f64, f64)> {
    let int = |v: &Value, allowed: &[i32], what: &str| {
        v.as_f64()
            .filter(|n| allowed.iter().any(|&a| a as f64 == *n))
            .ok_or_else(|| Error::option(option, format!("{what} must be one of {allowed:?}, got {v}")))
    };
    let bits = int(bits, &QUANT_BITS, "bits")?;
    let group = group.map_or(Ok(64.0), |g| int(g, &QUANT_GROUP_SIZES, "group size"))?;
    Ok((bits, group))
}

impl KvScheme {
    /// `{ kvBits, kvGroupSize, kvConfig: [{ layerIdx, bits, groupSize }] }` for a model of
    /// `layers` layers. Giving both `kvBits` and `kvConfig`, or a group size without bits, is an
    /// error: one of them would be ignored.
    pub fn from_json(v: &Value, layers: usize) -> Result<KvScheme> {
        let obj = v.as_object().ok_or_else(|| Error::option("kvScheme", format!("must be an object, got {v}")))?;
        let field = |k: &str| obj.get(k).filter(|v| !v.is_null());
        let mut scheme = KvScheme::default();
        match (field("kvBits"), field("kvGroupSize"), field("kvConfig")) {
            (Some(_), _, Some(_)) => return Err(Error::option("kvScheme", "give kvBits or kvConfig, not both")),
            (None, Some(_), _) => return Err(Error::option("kvGroupSize", "needs kvBits")),
            (Some(bits), group, None) => scheme.uniform = Some(quant("kvBits", bits, group)?),
            (None, None, Some(Value::Array(entries))) => {
                for e in entries {
                    let get = |k: &str| e.get(k).filter(|v| !v.is_null()).ok_or_else(|| Error::option("kvConfig", format!("each entry needs {k}, got {e}")));
                    let layer = get("layerIdx")?.as_f64().filter(|l| l.fract() == 0.0 && *l >= 0.0 && *l < layers as f64);
                    let layer = layer.ok_or_else(|| Error::option("kvConfig", format!("layerIdx must be a layer of the model's {layers}, got {e}")))?;
                    let (bits, group) = quant("kvConfig", get("bits")?, Some(get("groupSize")?))?;
                    if scheme.per_layer.iter().any(|l| l.0 == layer as usize) {
                        return Err(Error::option("kvConfig", format!("layer {layer} is listed twice")));
                    }
                    scheme.per_layer.push((layer as usize, bits, group));
                }
            }
            (None, None, Some(other)) => return Err(Error::option("kvConfig", format!("must be a list of {{layerIdx, bits, groupSize}}, got {other}"))),
            (None, None, None) => {}
        }
        Ok(scheme)
    }

    /// Uniform `bits` (group 64), as `--kv-bits` and `?kvBits=` give it.
    pub fn bits(bits: Option<u32>) -> Result<KvScheme> {
        Ok(KvScheme { uniform: bits.map(|b| quant("kvBits", &Value::from(b), None)).transpose()?, per_layer: Vec::new() })
    }

    fn element_bytes(&self, layer: usize) -> f64 {
        if !self.per_layer.is_empty() {
            return self.per_layer.iter().find(|e| e.0 == layer).map_or(BF16_BYTES, |e| kv_quant_bytes_per_element(e.1, e.2));
        }
        self.uniform.map_or(BF16_BYTES, |(bits, group)| kv_quant_bytes_per_element(bits, group))
    }
}

/// KV bytes per position of the full and of the sliding layers, and the recurrent state.
struct KvGeometry {
    full_per_token: f64,
    sliding_per_token: f64,
    recurrent_bytes: f64,
    window: f64,
}

fn kv_geometry(t: &Text, kv: &KvScheme) -> KvGeometry {
    let (mut full, mut sliding, mut linear) = (0.0, 0.0, 0.0);
    for layer in 0..t.num_hidden_layers {
        match t.kind(layer) {
            LayerKind::Linear => linear += 1.0,
            LayerKind::Sliding => sliding += 2.0 * t.num_key_value_heads * t.head_dim * kv.element_bytes(layer),
            LayerKind::Full => full += 2.0 * t.num_global_key_value_heads * t.global_head_dim * kv.element_bytes(layer),
        }
    }
    // An f32 state [value heads, value dim, key dim] plus a bf16 convolution window of
    // (kernel − 1) steps per layer; never quantized.
    let r = &t.recurrent;
    let conv_dim = 2.0 * r.num_key_heads * r.key_head_dim + r.num_value_heads * r.value_head_dim;
    let per_layer = r.num_value_heads * r.value_head_dim * r.key_head_dim * 4.0 + (r.conv_kernel_dim - 1.0).max(0.0) * conv_dim * BF16_BYTES;
    KvGeometry { full_per_token: full, sliding_per_token: sliding, recurrent_bytes: linear * per_layer, window: t.sliding_window }
}

/// Bytes of the KV cache (and recurrent state) holding `tokens` positions.
pub fn kv_bytes_at(t: &Text, tokens: f64, kv: &KvScheme) -> f64 {
    let g = kv_geometry(t, kv);
    g.full_per_token * tokens + g.sliding_per_token * tokens.min(g.window) + g.recurrent_bytes
}

/// Peak bytes of the attention scores MLX's fallback materialises in one prefill chunk of
/// `chunk` queries against `ctx` keys (the last chunk sees the most keys; one layer's scores are
/// live at a time). 0 when every attention layer's head dim has the fused kernel.
pub fn sdpa_fallback_bytes(t: &Text, chunk: f64, ctx: f64) -> f64 {
    let queries = chunk.min(ctx);
    if t.num_attention_heads <= 0.0 || queries <= SDPA_FUSED_MAX_QUERIES {
        return 0.0;
    }
    let layers = if t.num_hidden_layers > 0 { t.num_hidden_layers } else { t.layer_types.len() };
    let mut peak: f64 = 0.0;
    for layer in 0..layers {
        let kind = t.kind(layer);
        if kind == LayerKind::Linear {
            continue;
        }
        let sliding = kind == LayerKind::Sliding && t.sliding_window > 0.0;
        let head_dim = if sliding { t.head_dim } else { t.global_head_dim };
        if FUSED_SDPA_HEAD_DIMS.contains(&head_dim) {
            continue;
        }
        let keys = if sliding { ctx.min(t.sliding_window + queries) } else { ctx };
        peak = peak.max(t.num_attention_heads * queries * keys * BF16_BYTES);
    }
    peak
}

/// One question to `fit`: the model's geometry and weight bytes, the context, the machine.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    pub text: &'a Text,
    pub weights_bytes: f64,
    /// Context tokens to bill.
    pub ctx: f64,
    pub machine: Machine,
    /// Prompt tokens per prefill step.
    pub chunk: f64,
    /// Bytes of the `.experts.` tensors (part of `weights_bytes`): a mixture-of-experts model
    /// reads only top-k of them per token, but holds all of them.
    pub experts_bytes: f64,
    /// A budget that replaces RAM × 0.75 outright.
    pub usable_bytes: Option<f64>,
    pub kv: &'a KvScheme,
}

/// A number as JavaScript writes it in JSON: integral values without a fraction (`8192`, not
/// serde's `8192.0`), so the CLI's and the server's JSON read as mlx-bun's.
pub fn json_number(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() <= 9_007_199_254_740_991.0 {
        Value::from(v as i64)
    } else {
        Value::from(v)
    }
}

pub(crate) fn as_js_number<S: serde::Serializer>(v: &f64, s: S) -> std::result::Result<S::Ok, S::Error> {
    json_number(*v).serialize(s)
}

/// mlx-bun's `FitReport`: bytes, the verdict at `contextTokens`, and the predictions.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FitReport {
    pub fits: bool,
    #[serde(serialize_with = "as_js_number")]
    pub context_tokens: f64,
    #[serde(serialize_with = "as_js_number")]
    pub weights_bytes: f64,
    #[serde(serialize_with = "as_js_number")]
    pub kv_bytes: f64,
    #[serde(serialize_with = "as_js_number")]
    pub transient_bytes: f64,
    #[serde(serialize_with = "as_js_number")]
    pub total_bytes: f64,
    #[serde(serialize_with = "as_js_number")]
    pub usable_bytes: f64,
    #[serde(serialize_with = "as_js_number")]
    pub max_safe_context: f64,
    pub predicted_decode_tps: f64,
}

fn check(option: &'static str, v: f64, min: f64, integer: bool) -> Result<f64> {
    if !v.is_finite() || v < min || (integer && (v.fract() != 0.0 || v > 9_007_199_254_740_991.0)) {
        let what = if integer { "an integer" } else { "a finite number" };
        return Err(Error::option(option, format!("must be {what} >= {min}, got {v}")));
    }
    Ok(v)
}

impl Request<'_> {
    fn validate(&self) -> Result<()> {
        check("weightsBytes", self.weights_bytes, 0.0, false)?;
        check("ctx", self.ctx, 0.0, true)?;
        check("chunk", self.chunk, 1.0, true)?;
        check("expertsBytes", self.experts_bytes, 0.0, false)?;
        if self.experts_bytes > self.weights_bytes {
            return Err(Error::option("expertsBytes", format!("{} is more than weightsBytes ({}): the experts are part of the weights", self.experts_bytes, self.weights_bytes)));
        }
        if let Some(u) = self.usable_bytes {
            check("usableBytes", u, 0.0, false)?;
        }
        check("machine.ramBytes", self.machine.ram_bytes, 0.0, false)?;
        if !(self.machine.bandwidth_gbs.is_finite() && self.machine.bandwidth_gbs > 0.0) {
            return Err(Error::option("machine.bandwidthGBs", format!("must be a finite number > 0, got {}", self.machine.bandwidth_gbs)));
        }
        Ok(())
    }

    fn transient_at(&self, n: f64) -> f64 {
        self.chunk.min(n) * TRANSIENT_PER_TOKEN + sdpa_fallback_bytes(self.text, self.chunk, n)
    }

    fn total_at(&self, n: f64) -> f64 {
        self.weights_bytes + kv_bytes_at(self.text, n, self.kv) + self.transient_at(n)
    }

    /// The largest context whose total fits `usable`: the model's whole context if that fits, 0
    /// if not even an empty one does, else the bisection (total is monotone in n: KV grows
    /// linearly, sliding layers saturate at their window, the scores grow with both).
    fn max_safe_context(&self, usable: f64) -> f64 {
        let top = self.text.max_position_embeddings.unwrap_or(CONTEXT_LIMIT);
        if self.total_at(top) <= usable {
            return top;
        }
        if self.total_at(0.0) > usable {
            return 0.0;
        }
        // total(lo) ≤ usable < total(hi)
        let (mut lo, mut hi) = (0.0_f64, top);
        while hi - lo > 1.0 {
            let mid = ((lo + hi) / 2.0).floor();
            if self.total_at(mid) <= usable {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// mlx-bun's `fit()`: will the model fit at `ctx`, the longest safe context, the decode speed.
pub fn fit(r: &Request) -> Result<FitReport> {
    r.validate()?;
    let usable = r.usable_bytes.unwrap_or(r.machine.ram_bytes * WIRED_FRACTION);
    let kv = kv_bytes_at(r.text, r.ctx, r.kv);
    let transient = r.transient_at(r.ctx);
    let total = r.weights_bytes + kv + transient;
    // Decode reads every weight and the whole cache once per token, except the experts a
    // mixture-of-experts model does not route to.
    let t = r.text;
    let skipped = if t.is_moe() { r.experts_bytes * (1.0 - t.top_k_experts / t.num_experts) } else { 0.0 };
    let efficiency = if t.is_moe() { MOE_DECODE_EFFICIENCY } else { DECODE_EFFICIENCY };
    let predicted = r.machine.bandwidth_gbs * 1e9 / (r.weights_bytes - skipped + kv) * efficiency;
    Ok(FitReport {
        fits: total <= usable,
        context_tokens: r.ctx,
        weights_bytes: r.weights_bytes,
        kv_bytes: kv,
        transient_bytes: transient,
        total_bytes: total,
        usable_bytes: usable,
        max_safe_context: r.max_safe_context(usable),
        predicted_decode_tps: predicted,
    })
}

/// One row of mlx-bun's `skuMatrix`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkuRow {
    pub sku: &'static str,
    #[serde(rename = "ramGB")]
    pub ram_gb: u32,
    pub fits: bool,
    #[serde(serialize_with = "as_js_number")]
    pub max_context: f64,
    pub decode_tps: f64,
}

/// `fit` on every Apple chip and RAM size of `APPLE_SKUS` (default chunk, RAM × 0.75 usable).
pub fn sku_matrix(text: &Text, weights_bytes: f64, ctx: f64, experts_bytes: f64, kv: &KvScheme) -> Result<Vec<SkuRow>> {
    let mut rows = Vec::new();
    for sku in APPLE_SKUS {
        for &ram_gb in sku.ram_options {
            let machine = Machine { ram_bytes: f64::from(ram_gb) * (1u64 << 30) as f64, bandwidth_gbs: sku.bandwidth_gbs };
            let r = fit(&Request { text, weights_bytes, ctx, machine, chunk: DEFAULT_CHUNK, experts_bytes, usable_bytes: None, kv })?;
            rows.push(SkuRow { sku: sku.chip, ram_gb, fits: r.fits, max_context: r.max_safe_context, decode_tps: r.predicted_decode_tps });
        }
    }
    Ok(rows)
}

/// A model on disk as `fit` sees it: its geometry and the registry's byte counts (every
/// safetensors file but the vision sidecar, or a GGUF file's size; the `.experts.` tensors).
#[derive(Clone, Debug)]
pub struct ModelFit {
    pub text: Text,
    pub weights_bytes: f64,
    pub experts_bytes: f64,
}

impl ModelFit {
    pub fn from_record(m: &ModelRecord) -> Result<ModelFit> {
        let config = open_config(Path::new(&m.path))?;
        Ok(ModelFit { text: Text::of(&config)?, weights_bytes: m.size_bytes as f64, experts_bytes: m.experts_bytes as f64 })
    }

    /// The model folder or `.gguf` file at `path`, whose config is already read.
    pub fn of(config: &ModelConfig, path: &Path) -> Result<ModelFit> {
        let m = registry::record(path).ok_or_else(|| Error::ModelNotFound(path.to_path_buf()))?;
        Ok(ModelFit { text: Text::of(config)?, weights_bytes: m.size_bytes as f64, experts_bytes: m.experts_bytes as f64 })
    }

    /// `fit` for this model on `machine` at `ctx` (default chunk, RAM × 0.75 usable).
    pub fn report(&self, ctx: f64, machine: Machine, kv: &KvScheme) -> Result<FitReport> {
        fit(&Request { text: &self.text, weights_bytes: self.weights_bytes, ctx, machine, chunk: DEFAULT_CHUNK, experts_bytes: self.experts_bytes, usable_bytes: None, kv })
    }

    /// The longest context that fits `budget` bytes (mlx-bun's `loadContext` refuses a model
    /// for which it is 0).
    pub fn max_safe_context(&self, budget: f64) -> Result<f64> {
        let machine = Machine { ram_bytes: budget, bandwidth_gbs: 1.0 };
        let kv = KvScheme::default();
        let r = Request { text: &self.text, weights_bytes: self.weights_bytes, ctx: 0.0, machine, chunk: DEFAULT_CHUNK, experts_bytes: self.experts_bytes, usable_bytes: Some(budget), kv: &kv };
        Ok(fit(&r)?.max_safe_context)
    }

    pub fn sku_matrix(&self, ctx: f64, kv: &KvScheme) -> Result<Vec<SkuRow>> {
        sku_matrix(&self.text, self.weights_bytes, ctx, self.experts_bytes, kv)
    }
}
