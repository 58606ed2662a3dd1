//! Gemma 4 text models (mlx-lm's `gemma4_text.py`). Sandwich-normed blocks (plain RMSNorm before
//! and after attention and the GeGLU MLP) with q/k norms, weightless value norms and unscaled
//! scores; sliding layers and full ones with their own head size and RoPE (full layers rotate a
//! fraction of each head: "proportional" RoPE); logits soft-capped. What the family adds:
//! - per-layer inputs (E2B/E4B): a second embedding gives every layer a small vector per token,
//!   mixed with a projection of the embedded input and gated into the block's output;
//! - KV sharing (E2B/E4B): the last `num_kv_shared_layers` layers have no keys, values or cache
//!   of their own; each attends over those the last earlier layer of its kind attended over in
//!   the same step (and its MLP is twice as wide);
//! - keys as values (26B/31B): full layers project keys only and use them, unnormed, as values;
//! - a mixture of experts beside each dense MLP (26B-A4B), routed from the residual stream;
//! - a learned scalar per layer multiplying its output.
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};
use serde_json::Value;

use super::blocks::softcap;
use super::config::ModelConfig;
use super::experts::{ExpertsConfig, SwitchGlu};
use super::attention::{Attention, AttentionSpec, KvSource, NormKind, StepKv};
use super::layers::{scalar, Activation, Embedding, Linear, Mlp, RmsNorm};
use super::rope::Rope;
use super::weights::Weights;
use super::{LanguageModel, Logits, Sliding, StepContext, Tokens};
use crate::cache::file::LayerShape;
use crate::cache::{CacheView, KvCache, LayerCache, RotatingKvCache};
use crate::error::{Error, Result};

pub struct Gemma4 {
    config: ModelConfig,
    embed_tokens: Embedding,
    /// √hidden_size, multiplied in the embeddings' dtype.
    embed_scale: f32,
    per_layer: Option<PerLayerInputs>,
    layers: Vec<Layer>,
    norm: RmsNorm,
    /// `None` = tied to the embedding.
    lm_head: Option<Linear>,
    final_softcap: Option<f32>,
    window: usize,
    pub fingerprint: String,
}

/// The per-layer input vectors of each token: its row of a second embedding (every layer's slice
/// side by side), plus a normed projection of the embedded input, both scaled.
struct PerLayerInputs {
    embed: Embedding,
    /// Width of each layer's slice.
    width: i32,
    projection: Linear,
    norm: RmsNorm,
}

struct Layer {
    input_norm: RmsNorm,
    attn: Attention,
    post_attn_norm: RmsNorm,
    pre_ff_norm: RmsNorm,
    mlp: Mlp,
    moe: Option<Moe>,
    post_ff_norm: RmsNorm,
    gate: Option<PerLayerGate>,
    layer_scalar: Array,
    sliding: bool,
    /// The earlier layer whose keys and values this one attends over (KV sharing).
    kv_from: Option<usize>,
}

/// gelu(gate(h)) · the layer's input vector, projected back to the hidden size and normed.
struct PerLayerGate {
    gate: Linear,
    projection: Linear,
    norm: RmsNorm,
}

/// The experts beside the dense MLP, each output normed before the two are added.
struct Moe {
    router: Router,
    experts: SwitchGlu,
    pre_norm: RmsNorm,
    post_norm_dense: RmsNorm,
    post_norm_experts: RmsNorm,
}

/// RMSNorm (weight `scale` · hidden^-½), projection to expert scores, top-k, softmax over the
/// k, times each chosen expert's own scale.
struct Router {
    norm: RmsNorm,
    proj: Linear,
    per_expert_scale: Array,
    top_k: i32,
}

impl Router {
    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let scores = self.proj.forward(&self.norm.forward(x)?)?;
        let n = scores.shape()[scores.ndim() - 1];
        let inds = ops::argpartition_axis(&scores, n - self.top_k, -1)?.index((.., .., n - self.top_k..));
        let weights = ops::softmax_axis(&scores.take_along_axis(&inds, -1)?, -1, false)?;
        Ok((inds.clone(), ops::multiply(&weights, &self.per_expert_scale.take(&inds)?)?))
    }
}

fn bad(cfg: &ModelConfig, msg: String) -> Error {
    Error::config(&cfg.source, msg)
}

/// Every `sliding_window_pattern`-th layer (default 5) is global, unless `layer_types` lists
/// each layer; the others slide over `sliding_window` positions (default 512).
pub fn sliding(cfg: &ModelConfig) -> Result<Sliding> {
    let n = cfg.num_hidden_layers;
    let window = cfg.usize_opt("sliding_window").unwrap_or(512);
    let layers = match cfg.raw.get("layer_types").filter(|v| !v.is_null()) {
        Some(Value::Array(kinds)) if kinds.len() == n => kinds
            .iter()
            .map(|k| match k.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(bad(cfg, format!("layer_types: {k} is not \"sliding_attention\" or \"full_attention\""))),
            })
            .collect::<Result<_>>()?,
        Some(_) => return Err(bad(cfg, format!("layer_types must list the {n} layers"))),
        None => {
            let pattern = cfg.usize_opt("sliding_window_pattern").unwrap_or(5).max(1);
            (0..n).map(|i| (i + 1) % pattern != 0).collect()
        }
    };
    Ok(Sliding { layers, window })
}

/// mlx-lm's `rope_parameters` for a Gemma 4 config without them (gemma4_text.ModelArgs).
pub fn default_rope_parameters() -> Value {
    serde_json::json!({
        "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0, "rope_type": "proportional"},
        "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10_000.0, "rope_type": "default"},
    })
}

/// The RoPE of one kind of layer from `rope_parameters` (`default_rope_parameters` without the
/// block); a kind the block does not list gets a default RoPE of base 1e4, as in mlx-lm.
fn rope(cfg: &ModelConfig, sliding: bool, head_dim: usize) -> Result<Rope> {
    let kind = if sliding { "sliding_attention" } else { "full_attention" };
    let defaults = default_rope_parameters();
    let all = cfg.raw.get("rope_parameters").filter(|p| !p.is_null()).unwrap_or(&defaults);
    let get = |k: &str| all.get(kind).and_then(|p| p.get(k)).filter(|v| !v.is_null());
    let num = |k: &str, default: f64| get(k).and_then(Value::as_f64).unwrap_or(default);
    let rope_type = get("type").or_else(|| get("rope_type")).and_then(Value::as_str).unwrap_or("default");
    let (theta, partial, factor) = (num("rope_theta", 10_000.0), num("partial_rotary_factor", 1.0), num("factor", 1.0));
    match rope_type {
        "default" => Ok(Rope::plain(head_dim, theta as f32, cfg.rope_traditional)),
        "proportional" => {
            let rotated = (head_dim as f64 * partial) as usize;
            if !(0.0..=1.0).contains(&partial) || rotated % 2 != 0 || head_dim % 2 != 0 {
                return Err(bad(cfg, format!("{kind}: partial_rotary_factor {partial} of head_dim {head_dim} is not an even number of features")));
            }
            Rope::proportional(head_dim, rotated, theta as f32, factor as f32, cfg.rope_traditional)
        }
        other => Err(bad(cfg, format!("{kind}: rope_type {other:?} is not implemented for gemma4_text (\"default\", \"proportional\")"))),
    }
}

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Gemma4> {
    let (n, d, eps) = (cfg.num_hidden_layers, cfg.hidden_size, cfg.rms_norm_eps);
    let (root, lm_head) = w.text_roots();
    let Sliding { layers: kinds, window } = sliding(&cfg)?;
    // Defaults below are mlx-lm's (gemma4_text.ModelArgs), for keys a config leaves out.
    let shared = cfg.usize_opt("num_kv_shared_layers").unwrap_or(20);
    if shared >= n && shared > 0 {
        return Err(bad(&cfg, format!("num_kv_shared_layers {shared} leaves none of the {n} layers with keys of its own")));
    }
    let first_shared = n - shared;
    // Each shared layer attends over the last earlier layer of its kind.
    let kv_from = |i: usize| -> Result<Option<usize>> {
        if i < first_shared {
            return Ok(None);
        }
        let from = (0..first_shared).rev().find(|&j| kinds[j] == kinds[i]);
        from.map(Some).ok_or_else(|| bad(&cfg, format!("layer {i} shares keys and values, but no earlier layer is of its kind")))
    };
    let global_head_dim = match cfg.raw.get("global_head_dim") {
        None => 512,
        Some(g) => g.as_u64().filter(|&g| g > 0).map_or(cfg.head_dim, |g| g as usize),
    };
    let k_eq_v = cfg.raw.get("attention_k_eq_v").and_then(Value::as_bool).unwrap_or(false);
    let global_kv_heads = cfg.usize_opt("num_global_key_value_heads");
    let double_wide = cfg.raw.get("use_double_wide_mlp").and_then(Value::as_bool).unwrap_or(true);
    let per_layer_width = cfg.usize_opt("hidden_size_per_layer_input").unwrap_or(256);
    let moe = cfg.raw.get("enable_moe_block").and_then(Value::as_bool).unwrap_or(false);
    // Gemma 4's router renormalises by its softmax over the top k.
    let moe_sizes = if moe { Some(ExpertsConfig::read(&cfg, "top_k_experts", false)?) } else { None };
    // Sizes from the config multiply into tensor shapes only through checked products.
    let times = |a: usize, b: usize, what: &str| a.checked_mul(b).ok_or_else(|| bad(&cfg, format!("{what} overflows: {a} × {b}")));
    let norm = |path: String, dim: usize| RmsNorm::load(w, &path, dim, eps);

    let mut layers = Vec::with_capacity(n);
    for (i, &sliding) in kinds.iter().enumerate() {
        let p = format!("{root}.layers.{i}");
        let kv_from = kv_from(i)?;
        let head_dim = if sliding { cfg.head_dim } else { global_head_dim };
        let keys_as_values = k_eq_v && !sliding;
        let kv_heads = match global_kv_heads {
            Some(g) if keys_as_values => g,
            _ => cfg.num_key_value_heads,
        };
        if kv_heads == 0 || cfg.num_attention_heads % kv_heads != 0 {
            return Err(bad(&cfg, format!("layer {i}: {} query heads cannot share {kv_heads} KV heads", cfg.num_attention_heads)));
        }
        let kv = match (kv_from, keys_as_values) {
            (Some(_), _) => KvSource::Borrowed,
            (None, true) => KvSource::KeysAsValues,
            (None, false) => KvSource::Projected,
        };
        let spec = AttentionSpec {
            qk_norm: Some(NormKind::Plain),
            scale: 1.0,
            heads: Some((cfg.num_attention_heads, kv_heads)),
            kv,
            v_norm: kv != KvSource::Borrowed,
            ..AttentionSpec::plain(head_dim, rope(&cfg, sliding, head_dim)?)
        };
        let wide = if double_wide && kv_from.is_some() { 2 } else { 1 };
        let moe = match &moe_sizes {
            &Some(ExpertsConfig { num_experts: e, top_k: k, intermediate_size: h, .. }) => Some(Moe {
                router: Router {
                    norm: router_norm(w, &format!("{p}.router"), d, eps)?,
                    proj: Linear::load(w, &cfg, &format!("{p}.router.proj"), e, d, false)?,
                    per_expert_scale: w.array_shaped(&format!("{p}.router.per_expert_scale"), &[e])?,
                    top_k: k as i32,
                },
                experts: experts(w, &cfg, &format!("{p}.experts"), e, h)?,
                pre_norm: norm(format!("{p}.pre_feedforward_layernorm_2"), d)?,
                post_norm_dense: norm(format!("{p}.post_feedforward_layernorm_1"), d)?,
                post_norm_experts: norm(format!("{p}.post_feedforward_layernorm_2"), d)?,
            }),
            None => None,
        };
        let gate = if per_layer_width > 0 {
            Some(PerLayerGate {
                gate: Linear::load(w, &cfg, &format!("{p}.per_layer_input_gate"), per_layer_width, d, false)?,
                projection: Linear::load(w, &cfg, &format!("{p}.per_layer_projection"), d, per_layer_width, false)?,
                norm: norm(format!("{p}.post_per_layer_input_norm"), d)?,
            })
        } else {
            None
        };
        layers.push(Layer {
            input_norm: norm(format!("{p}.input_layernorm"), d)?,
            attn: Attention::load(w, &cfg, &format!("{p}.self_attn"), spec)?,
            post_attn_norm: norm(format!("{p}.post_attention_layernorm"), d)?,
            pre_ff_norm: norm(format!("{p}.pre_feedforward_layernorm"), d)?,
            mlp: Mlp::load_sized(w, &cfg, &format!("{p}.mlp"), Activation::GeluApprox, false, times(wide, cfg.intermediate_size, "intermediate_size")?)?,
            moe,
            post_ff_norm: norm(format!("{p}.post_feedforward_layernorm"), d)?,
            gate,
            layer_scalar: w.array_shaped(&format!("{p}.layer_scalar"), &[1])?,
            sliding,
            kv_from,
        });
    }

    let per_layer = if per_layer_width > 0 {
        let all = times(n, per_layer_width, "hidden_size_per_layer_input of every layer")?;
        let vocab = cfg.usize_opt("vocab_size_per_layer_input").unwrap_or(262_144);
        if vocab < cfg.vocab_size {
            // Token ids index this table as they come: a smaller one would be read past its end.
            return Err(bad(&cfg, format!("vocab_size_per_layer_input {vocab} is smaller than vocab_size {}", cfg.vocab_size)));
        }
        Some(PerLayerInputs {
            embed: Embedding::load(w, &cfg, &format!("{root}.embed_tokens_per_layer"), vocab, all)?,
            width: per_layer_width as i32,
            projection: Linear::load(w, &cfg, &format!("{root}.per_layer_model_projection"), all, d, false)?,
            norm: norm(format!("{root}.per_layer_projection_norm"), per_layer_width)?,
        })
    } else {
        None
    };
    let tied = cfg.tie_word_embeddings.unwrap_or(true);
    let final_softcap = match cfg.raw.get("final_logit_softcapping") {
        None => Some(30.0),
        Some(Value::Null) => None,
        Some(v) => match v.as_f64().filter(|&c| c > 0.0) {
            Some(c) => Some(c as f32),
            None => return Err(bad(&cfg, format!("final_logit_softcapping {v} is not a positive number"))),
        },
    };
    Ok(Gemma4 {
        embed_tokens: Embedding::load(w, &cfg, &format!("{root}.embed_tokens"), cfg.vocab_size, d)?,
        embed_scale: (d as f32).sqrt(),
        per_layer,
        layers,
        norm: norm(format!("{root}.norm"), d)?,
        lm_head: if tied { None } else { Some(Linear::load(w, &cfg, lm_head, cfg.vocab_size, d, false)?) },
        final_softcap,
        window,
        fingerprint: String::new(),
        config: cfg,
    })
}

/// The experts of a layer: `<path>.switch_glu.*` as mlx-lm saves them, or fused as published.
fn experts(w: &Weights, cfg: &ModelConfig, path: &str, e: usize, h: usize) -> Result<SwitchGlu> {
    match SwitchGlu::load_fused(w, cfg, path, e, h, Activation::GeluApprox)? {
        Some(fused) => Ok(fused),
        None => SwitchGlu::load(w, cfg, &format!("{path}.switch_glu"), None, e, h, Activation::GeluApprox),
    }
}

/// The router's norm: its weight is `scale` · hidden^-½ (a Python float, in the weight's dtype).
fn router_norm(w: &Weights, path: &str, d: usize, eps: f32) -> Result<RmsNorm> {
    let scale = w.array_shaped(&format!("{path}.scale"), &[d])?;
    let weight = ops::multiply(&scale, &scalar((d as f32).powf(-0.5), &scale)?)?;
    weight.eval()?;
    Ok(RmsNorm::from_weight(weight, eps))
}

impl Layer {
    /// One block; `borrowed`: the keys and values of the layer this one shares them with.
    fn forward(&self, x: &Array, cache: &mut CacheView, j: usize, shape: &crate::cache::StepShape, borrowed: Option<&StepKv>, input: Option<Array>) -> Result<(Array, Option<StepKv>)> {
        let (r, kv) = self.attn.forward_kv(&self.input_norm.forward(x)?, cache, j, shape, self.sliding, borrowed)?;
        let h = ops::add(x, &self.post_attn_norm.forward(&r)?)?;
        let dense = self.mlp.forward(&self.pre_ff_norm.forward(&h)?)?;
        let ff = match &self.moe {
            None => dense,
            Some(moe) => {
                let (inds, weights) = moe.router.route(&h)?;
                let y = moe.experts.forward(&moe.pre_norm.forward(&h)?, &inds)?;
                let y = ops::sum_axis(&ops::multiply(&ops::expand_dims(&weights, -1)?, &y)?, -2, false)?;
                ops::add(&moe.post_norm_dense.forward(&dense)?, &moe.post_norm_experts.forward(&y)?)?
            }
        };
        let mut h = ops::add(&h, &self.post_ff_norm.forward(&ff)?)?;
        if let (Some(g), Some(input)) = (&self.gate, input) {
            let gated = Activation::GeluApprox.gated(&g.gate.forward(&h)?, &input)?;
            h = ops::add(&h, &g.norm.forward(&g.projection.forward(&gated)?)?)?;
        }
        Ok((ops::multiply(&h, &self.layer_scalar)?, kv))
    }
}

impl Gemma4 {
    /// Each layer's input vectors, [B, L, layers, width], for embedded (and scaled) inputs `h`.
    fn per_layer_inputs(&self, p: &PerLayerInputs, ids: &Array, h: &Array) -> Result<Array> {
        let (b, l, n) = (h.shape()[0], h.shape()[1], self.layers.len() as i32);
        let own = p.embed.forward(ids)?;
        let own = ops::multiply(&own, &scalar((p.width as f32).sqrt(), &own)?)?.reshape(&[b, l, n, p.width])?;
        let proj = p.projection.forward(h)?;
        let proj = ops::multiply(&proj, &scalar((h.shape()[2] as f32).powf(-0.5), &proj)?)?.reshape(&[b, l, n, p.width])?;
        let sum = ops::add(&p.norm.forward(&proj)?, &own)?;
        Ok(ops::multiply(&sum, &scalar(0.5f32.sqrt(), &sum)?)?)
    }
}

impl LanguageModel for Gemma4 {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Caches for the layers with keys of their own only (the shared ones come last).
    fn new_cache(&self) -> Vec<LayerCache> {
        self.layers
            .iter()
            .filter(|l| l.kv_from.is_none())
            .map(|l| if l.sliding { LayerCache::Rotating(RotatingKvCache::new(self.window, 0)) } else { LayerCache::Plain(KvCache::default()) })
            .collect()
    }

    fn cache_shapes(&self) -> Vec<LayerShape> {
        self.layers.iter().filter(|l| l.kv_from.is_none()).map(|l| l.attn.cache_shape()).collect()
    }

    fn stackable(&self) -> bool {
        !self.layers.iter().any(|l| l.sliding)
    }

    fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    fn forward(&self, tokens: &Tokens, mut cache: CacheView, ctx: &StepContext) -> Result<Option<Array>> {
        let h = self.embed_tokens.forward(&tokens.ids)?;
        let mut h = ops::multiply(&h, &scalar(self.embed_scale, &h)?)?;
        let inputs = match &self.per_layer {
            Some(p) => Some(self.per_layer_inputs(p, &tokens.ids, &h)?),
            None => None,
        };
        let full = self.layers.iter().position(|l| !l.sliding);
        let window = self.layers.iter().position(|l| l.sliding).map(|j| (j, self.window));
        let shape = cache.begin(&tokens.counts, tokens.ids.shape()[1], full, window)?;
        // A step that only fills the caches (a prefill chunk) ends with the last layer that has
        // one: the layers sharing its keys and values add nothing a cache keeps (as in mlx-lm,
        // whose prefill evaluates only the caches' graph).
        let last = match ctx.logits {
            Logits::None => self.layers.iter().rposition(|l| l.kv_from.is_none()).unwrap_or(0),
            _ => self.layers.len() - 1,
        };
        let mut kvs: Vec<Option<StepKv>> = Vec::with_capacity(last + 1);
        for (j, layer) in self.layers[..=last].iter().enumerate() {
            let borrowed = layer.kv_from.and_then(|from| kvs[from].as_ref());
            let input = inputs.as_ref().map(|p| p.index((.., .., j as i32, ..)));
            let (out, kv) = layer.forward(&h, &mut cache, j, &shape, borrowed, input)?;
            h = out;
            kvs.push(kv);
            ctx.after_layer(&h, j, last)?;
        }
        let Some(h) = ctx.finish(h, &mut cache, &shape)? else {
            return Ok(None);
        };
        let h = self.norm.forward(&h)?;
        if ctx.logits == Logits::LastHidden {
            return Ok(Some(h));
        }
        let logits = match &self.lm_head {
            Some(head) => head.forward(&h)?,
            None => self.embed_tokens.as_linear(&h)?,
        };
        Ok(Some(match self.final_softcap {
            Some(cap) => softcap(&logits, cap)?,
            None => logits,
        }))
    }
}
