//! Qwen3-Next and Qwen3.5 (mlx-lm's `qwen3_next.py`, `qwen3_5.py`, `qwen3_5_moe.py`): hybrids
//! whose layers are mostly gated DeltaNet linear attention (`gated_delta.rs`: a recurrent state
//! instead of a KV cache), with every `full_attention_interval`-th layer full attention.
//! Full-attention layers have per-head q/k norms, RoPE over a fraction of each head, and a q
//! projection twice as wide whose second half gates each head's output. Feed-forward: a SwiGLU
//! MLP, or experts plus a shared expert (Qwen3-Next, Qwen3.5-MoE).
//!
//! The two families differ in how the linear layers' input projections are stored (Qwen3-Next
//! fuses them per key head), where the RoPE settings live (`rope_parameters` in Qwen3.5), which
//! layers have experts, and whether the top-k scores are renormalised by default.
use mlx_rs::{ops, Array};
use serde_json::Value;

use super::attention::{Attention, AttentionSpec, NormKind};
use super::blocks::FeedForward;
use super::config::ModelConfig;
use super::experts::{ExpertsConfig, SparseMoe};
use super::gated_delta::{is_hf_layout, DeltaSizes, GatedDeltaNet};
use super::layers::{Activation, Embedding, Linear, Mlp, RmsNorm};
use super::rope::Rope;
use super::weights::Weights;
use super::{LanguageModel, Logits, StepContext, Tokens};
use crate::cache::file::LayerShape;
use crate::cache::{CacheView, KvCache, LayerCache, RecurrentCache};
use crate::error::{Error, Result};

pub struct Qwen3Next {
    config: ModelConfig,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    /// `None` = tied to the embedding.
    lm_head: Option<Linear>,
    pub fingerprint: String,
}

enum Mixer {
    Linear(GatedDeltaNet),
    Full(Attention),
}

struct Layer {
    input_norm: RmsNorm,
    mixer: Mixer,
    post_attn_norm: RmsNorm,
    mlp: FeedForward,
}

fn bad(cfg: &ModelConfig, msg: String) -> Error {
    Error::config(&cfg.source, msg)
}

/// Which layers are linear attention: all but every `full_attention_interval`-th (default 4).
pub fn linear_layers(cfg: &ModelConfig) -> Result<Vec<bool>> {
    let every = cfg.usize_opt("full_attention_interval").unwrap_or(4);
    if every == 0 {
        return Err(bad(cfg, "full_attention_interval must be > 0".into()));
    }
    Ok((0..cfg.num_hidden_layers).map(|i| (i + 1) % every != 0).collect())
}

fn is_qwen3_5(cfg: &ModelConfig) -> bool {
    cfg.model_type.starts_with("qwen3_5")
}

/// RoPE over `partial_rotary_factor` of each head: Qwen3-Next's top-level settings, or
/// Qwen3.5's `rope_parameters` (default type, θ 1e5, a quarter of the head; its multimodal
/// sections rotate text positions exactly as plain RoPE does).
fn rope(cfg: &ModelConfig) -> Result<Rope> {
    let hd = cfg.head_dim;
    let rotated = |partial: f64| -> Result<usize> {
        let n = (hd as f64 * partial) as usize;
        if !(0.0..=1.0).contains(&partial) || n % 2 != 0 {
            return Err(bad(cfg, format!("partial_rotary_factor {partial} of head_dim {hd} is not an even number of features")));
        }
        Ok(n)
    };
    if !is_qwen3_5(cfg) {
        let partial = cfg.raw.get("partial_rotary_factor").and_then(Value::as_f64).ok_or_else(|| bad(cfg, "qwen3_next needs partial_rotary_factor".into()))?;
        return Rope::new(cfg, rotated(partial)?, None);
    }
    let params = cfg.raw.get("rope_parameters").filter(|p| !p.is_null());
    let get = |k: &str| params.and_then(|p| p.get(k)).filter(|v| !v.is_null());
    let kind = get("type").or_else(|| get("rope_type")).and_then(Value::as_str).unwrap_or("default");
    if kind != "default" {
        return Err(bad(cfg, format!("rope_parameters: type {kind:?} is not implemented for {} (\"default\")", cfg.model_type)));
    }
    let theta = get("rope_theta").and_then(Value::as_f64).unwrap_or(100_000.0);
    let partial = get("partial_rotary_factor").and_then(Value::as_f64).unwrap_or(0.25);
    Ok(Rope::plain(rotated(partial)?, theta as f32, false))
}

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Qwen3Next> {
    let (n, d, eps) = (cfg.num_hidden_layers, cfg.hidden_size, cfg.rms_norm_eps);
    let (root, lm_head) = w.text_roots();
    let linear = linear_layers(&cfg)?;
    let sizes = DeltaSizes::read(&cfg)?;
    let qwen3_5 = is_qwen3_5(&cfg);
    let num_experts = cfg.usize_opt("num_experts").unwrap_or(0);
    let experts = if num_experts > 0 { Some(ExpertsConfig::read(&cfg, "num_experts_per_tok", cfg.raw.get("norm_topk_prob").and_then(Value::as_bool).unwrap_or(qwen3_5))?) } else { None };
    let shared_width = match experts {
        Some(_) => cfg.usize_opt("shared_expert_intermediate_size").filter(|&h| h > 0).ok_or_else(|| bad(&cfg, "experts need shared_expert_intermediate_size > 0".into()))?,
        None => 0,
    };
    let step = cfg.usize_opt("decoder_sparse_step").unwrap_or(1).max(1);
    let dense_only: Vec<usize> = match cfg.raw.get("mlp_only_layers") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => serde_json::from_value(v.clone()).map_err(|_| bad(&cfg, "mlp_only_layers must be a list of layer indices".into()))?,
    };
    // Qwen3.5 gives every layer experts when it has them; Qwen3-Next every `decoder_sparse_step`-th
    // layer not listed in `mlp_only_layers`.
    let has_experts = |i: usize| experts.is_some() && (qwen3_5 || (!dense_only.contains(&i) && (i + 1) % step == 0));
    // A Hugging Face checkpoint stores (1 + w) RMSNorm weights, which mlx-lm's sanitize converts:
    // Qwen3.5's is recognised by its convolutions' layout, Qwen3-Next's by its unstacked experts.
    let hf = match (qwen3_5, (0..n).find(|&i| has_experts(i))) {
        (true, _) => linear.iter().position(|&l| l).is_some_and(|i| is_hf_layout(w, &format!("{root}.layers.{i}.linear_attn.conv1d.weight"))),
        (false, Some(i)) => w.has(&format!("{root}.layers.{i}.mlp.experts.0.up_proj.weight")),
        (false, None) => false,
    };
    let norm = |path: String, dim: usize| if hf { RmsNorm::load_offset(w, &path, dim, eps) } else { RmsNorm::load(w, &path, dim, eps) };
    let bias = cfg.raw.get("attention_bias").and_then(Value::as_bool).unwrap_or(false);

    let mut layers = Vec::with_capacity(n);
    for (i, &is_linear) in linear.iter().enumerate() {
        let p = format!("{root}.layers.{i}");
        let mixer = if is_linear {
            Mixer::Linear(GatedDeltaNet::load(w, &cfg, &format!("{p}.linear_attn"), sizes)?)
        } else {
            let spec = AttentionSpec {
                qkv_bias: bias,
                o_bias: bias,
                qk_norm: Some(if hf { NormKind::Offset } else { NormKind::Plain }),
                output_gate: true,
                ..AttentionSpec::plain(cfg.head_dim, rope(&cfg)?)
            };
            Mixer::Full(Attention::load(w, &cfg, &format!("{p}.self_attn"), spec)?)
        };
        let mlp = match &experts {
            Some(e) if has_experts(i) => FeedForward::Experts(Box::new(SparseMoe::load_with_shared(w, &cfg, &format!("{p}.mlp"), e, shared_width)?)),
            _ => Mlp::load(w, &cfg, &format!("{p}.mlp"), Activation::Silu, false)?.into(),
        };
        layers.push(Layer { input_norm: norm(format!("{p}.input_layernorm"), d)?, mixer, post_attn_norm: norm(format!("{p}.post_attention_layernorm"), d)?, mlp });
    }
    let tied = cfg.tie_word_embeddings.unwrap_or(false);
    Ok(Qwen3Next {
        embed_tokens: Embedding::load(w, &cfg, &format!("{root}.embed_tokens"), cfg.vocab_size, d)?,
        layers,
        norm: norm(format!("{root}.norm"), d)?,
        lm_head: if tied { None } else { Some(Linear::load(w, &cfg, lm_head, cfg.vocab_size, d, false)?) },
        fingerprint: String::new(),
        config: cfg,
    })
}

impl LanguageModel for Qwen3Next {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn new_cache(&self) -> Vec<LayerCache> {
        self.layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::Linear(_) => LayerCache::Recurrent(RecurrentCache::default()),
                Mixer::Full(_) => LayerCache::Plain(KvCache::default()),
            })
            .collect()
    }

    fn cache_shapes(&self) -> Vec<LayerShape> {
        self.layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::Linear(g) => g.cache_shape(),
                Mixer::Full(a) => a.cache_shape(),
            })
            .collect()
    }

    /// Recurrent states do not stack: each row runs its linear layers over its own.
    fn stackable(&self) -> bool {
        false
    }

    fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    fn forward(&self, tokens: &Tokens, mut cache: CacheView, ctx: &StepContext) -> Result<Option<Array>> {
        let mut h = self.embed_tokens.forward(&tokens.ids)?;
        let full = self.layers.iter().position(|l| matches!(l.mixer, Mixer::Full(_)));
        let shape = cache.begin(&tokens.counts, tokens.ids.shape()[1], full, None)?;
        let last = self.layers.len() - 1;
        for (j, layer) in self.layers.iter().enumerate() {
            let x = layer.input_norm.forward(&h)?;
            let r = match &layer.mixer {
                Mixer::Linear(g) => g.forward(&x, &mut cache, j, &shape)?,
                Mixer::Full(a) => a.forward(&x, &mut cache, j, &shape, false)?,
            };
            let h1 = ops::add(&h, &r)?;
            h = ops::add(&h1, &layer.mlp.forward(&layer.post_attn_norm.forward(&h1)?)?)?;
            ctx.after_layer(&h, j, last)?;
        }
        let Some(h) = ctx.finish(h, &mut cache, &shape)? else {
            return Ok(None);
        };
        let h = self.norm.forward(&h)?;
        if ctx.logits == Logits::LastHidden {
            return Ok(Some(h));
        }
        match &self.lm_head {
            Some(head) => head.forward(&h),
            None => self.embed_tokens.as_linear(&h),
        }
        .map(Some)
    }
}
