//! The decoder-only transformer every supported architecture is an instance of: token embedding
//! (optionally scaled), a stack of attention + feed-forward blocks (pre-norm and/or post-norm,
//! residual updates optionally scaled), a final norm and the output projection (optionally
//! scaled or soft-capped). Architectures differ only in how they fill these parts.
use mlx_rs::{ops, Array};

use super::blocks::{softcap, FeedForward, Norm};
use super::config::ModelConfig;
use super::attention::{Attention, AttentionSpec};
use super::layers::{scalar, Activation, Embedding, Linear, Mlp, RmsNorm};
use super::weights::Weights;
use super::{LanguageModel, Logits, StepContext, Tokens};
use crate::cache::{CacheView, KvCache, LayerCache, RotatingKvCache, StepShape};
use crate::error::Result;

pub struct Block {
    /// `None`: attention sees the residual stream itself (OLMo 2 norms only after).
    pub input_norm: Option<Norm>,
    pub attn: Attention,
    /// Gemma, OLMo 2 and GLM-4 normalise the attention output before the residual add.
    pub post_attn_norm: Option<Norm>,
    pub pre_mlp_norm: Option<Norm>,
    pub mlp: FeedForward,
    /// Normalises the MLP output before the residual add.
    pub post_mlp_norm: Option<Norm>,
    /// Granite and MiniCPM scale both residual updates by this.
    pub residual_scale: Option<f32>,
    /// Sliding-window attention (rotating cache) instead of full attention.
    pub sliding: bool,
}

impl Block {
    /// Layer `i` of the common pre-norm layout: `input_layernorm` → attention,
    /// `post_attention_layernorm` → SwiGLU MLP (`fused_mlp`: one `gate_up_proj`).
    pub fn pre_norm(w: &Weights, cfg: &ModelConfig, i: usize, spec: AttentionSpec, fused_mlp: bool, sliding: bool) -> Result<Block> {
        let mlp = Mlp::load(w, cfg, &format!("model.layers.{i}.mlp"), Activation::Silu, fused_mlp)?.into();
        Self::pre_norm_with(w, cfg, i, spec, mlp, sliding)
    }

    /// The pre-norm layout around another feed-forward network (a mixture of experts).
    pub fn pre_norm_with(w: &Weights, cfg: &ModelConfig, i: usize, spec: AttentionSpec, mlp: FeedForward, sliding: bool) -> Result<Block> {
        let (p, d, eps) = (format!("model.layers.{i}"), cfg.hidden_size, cfg.rms_norm_eps);
        Ok(Block {
            input_norm: Some(RmsNorm::load(w, &format!("{p}.input_layernorm"), d, eps)?.into()),
            attn: Attention::load(w, cfg, &format!("{p}.self_attn"), spec)?,
            post_attn_norm: None,
            pre_mlp_norm: Some(RmsNorm::load(w, &format!("{p}.post_attention_layernorm"), d, eps)?.into()),
            mlp,
            post_mlp_norm: None,
            residual_scale: None,
            sliding,
        })
    }

    /// Layer `i` of Gemma 2 and 3: (1 + w) RMSNorm before and after both attention and the
    /// gelu-tanh GeGLU MLP.
    pub fn sandwich(w: &Weights, cfg: &ModelConfig, i: usize, spec: AttentionSpec, sliding: bool) -> Result<Block> {
        let p = format!("model.layers.{i}");
        let norm = |name: &str| -> Result<Option<Norm>> { Ok(Some(RmsNorm::load_offset(w, &format!("{p}.{name}"), cfg.hidden_size, cfg.rms_norm_eps)?.into())) };
        Ok(Block {
            input_norm: norm("input_layernorm")?,
            attn: Attention::load(w, cfg, &format!("{p}.self_attn"), spec)?,
            post_attn_norm: norm("post_attention_layernorm")?,
            pre_mlp_norm: norm("pre_feedforward_layernorm")?,
            mlp: Mlp::load(w, cfg, &format!("{p}.mlp"), Activation::GeluApprox, false)?.into(),
            post_mlp_norm: norm("post_feedforward_layernorm")?,
            residual_scale: None,
            sliding,
        })
    }

    fn forward(&self, x: &Array, cache: &mut CacheView, layer: usize, shape: &StepShape) -> Result<Array> {
        let r = self.attn.forward(&norm(&self.input_norm, x)?, cache, layer, shape, self.sliding)?;
        let h = self.residual(x, &self.post_attn_norm, r)?;
        let r = self.mlp.forward(&norm(&self.pre_mlp_norm, &h)?)?;
        self.residual(&h, &self.post_mlp_norm, r)
    }

    /// `x` plus the update `r`, normalised by `post` and scaled as the architecture says.
    fn residual(&self, x: &Array, post: &Option<Norm>, r: Array) -> Result<Array> {
        let mut r = norm(post, &r)?;
        if let Some(s) = self.residual_scale {
            r = ops::multiply(&r, &scalar(s, &r)?)?;
        }
        Ok(ops::add(x, &r)?)
    }
}

/// `x` normalised by `n`, or as is without one.
fn norm(n: &Option<Norm>, x: &Array) -> Result<Array> {
    match n {
        Some(n) => n.forward(x),
        None => Ok(x.clone()),
    }
}

/// What some architectures do around the output projection.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OutputScaling {
    None,
    /// MiniCPM divides the final hidden states by this before the projection.
    DivideHidden(f32),
    /// Granite divides the logits by this.
    DivideLogits(f32),
    /// Gemma 2 soft-caps the logits at ± this.
    Softcap(f32),
}

pub struct Decoder {
    pub config: ModelConfig,
    pub embed_tokens: Embedding,
    /// Embeddings are multiplied by this, in their dtype (Gemma's √hidden_size, Granite's and
    /// MiniCPM's multipliers).
    pub embed_scale: Option<f32>,
    pub layers: Vec<Block>,
    pub norm: Norm,
    /// `None` = tied to the embedding.
    pub lm_head: Option<Linear>,
    pub output_scaling: OutputScaling,
    /// Window of the sliding layers.
    pub sliding_window: usize,
    /// What identifies the weights (see `model::fingerprint`), set by `create_model`.
    pub fingerprint: String,
}

impl Decoder {
    /// `model.embed_tokens`, `layers`, `model.norm` (RMSNorm) and `lm_head` (absent when `tied`).
    pub fn assemble(w: &Weights, cfg: ModelConfig, layers: Vec<Block>, tied: bool, sliding_window: usize) -> Result<Decoder> {
        let norm = RmsNorm::load(w, "model.norm", cfg.hidden_size, cfg.rms_norm_eps)?.into();
        let lm_head = Self::lm_head(w, &cfg, tied)?;
        Self::new(w, cfg, layers, norm, lm_head, sliding_window)
    }

    /// `model.embed_tokens` and the given parts, embeddings and logits unscaled.
    pub fn new(w: &Weights, cfg: ModelConfig, layers: Vec<Block>, norm: Norm, lm_head: Option<Linear>, sliding_window: usize) -> Result<Decoder> {
        Ok(Decoder {
            embed_tokens: Embedding::load(w, &cfg, "model.embed_tokens", cfg.vocab_size, cfg.hidden_size)?,
            embed_scale: None,
            layers,
            norm,
            lm_head,
            output_scaling: OutputScaling::None,
            sliding_window,
            fingerprint: String::new(),
            config: cfg,
        })
    }

    /// `lm_head`, or `None` when the output projection is tied to the embedding.
    pub fn lm_head(w: &Weights, cfg: &ModelConfig, tied: bool) -> Result<Option<Linear>> {
        if tied {
            return Ok(None);
        }
        Ok(Some(Linear::load(w, cfg, "lm_head", cfg.vocab_size, cfg.hidden_size, false)?))
    }
}

impl Decoder {
    fn embed(&self, ids: &Array) -> Result<Array> {
        let h = self.embed_tokens.forward(ids)?;
        Ok(match self.embed_scale {
            Some(s) => ops::multiply(&h, &scalar(s, &h)?)?,
            None => h,
        })
    }
}

impl LanguageModel for Decoder {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn new_cache(&self) -> Vec<LayerCache> {
        self.layers
            .iter()
            .map(|b| {
                if b.sliding {
                    LayerCache::Rotating(RotatingKvCache::new(self.sliding_window, 0))
                } else {
                    LayerCache::Plain(KvCache::default())
                }
            })
            .collect()
    }

    fn stackable(&self) -> bool {
        !self.layers.iter().any(|b| b.sliding)
    }

    fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    fn forward(&self, tokens: &Tokens, mut cache: CacheView, ctx: &StepContext) -> Result<Option<Array>> {
        let mut h = self.embed(&tokens.ids)?;
        let full = self.layers.iter().position(|b| !b.sliding);
        let window = self.layers.iter().position(|b| b.sliding).map(|j| (j, self.sliding_window));
        let shape = cache.begin(&tokens.counts, tokens.ids.shape()[1], full, window)?;
        let last = self.layers.len() - 1;
        for (j, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h, &mut cache, j, &shape)?;
            ctx.after_layer(&h, j, last)?;
        }
        let Some(h) = ctx.finish(h, &mut cache, &shape)? else {
            return Ok(None);
        };
        let mut h = self.norm.forward(&h)?;
        if ctx.logits == Logits::LastHidden {
            return Ok(Some(h));
        }
        if let OutputScaling::DivideHidden(s) = self.output_scaling {
            h = ops::divide(&h, &scalar(s, &h)?)?;
        }
        let logits = match &self.lm_head {
            Some(head) => head.forward(&h)?,
            None => self.embed_tokens.as_linear(&h)?,
        };
        Ok(Some(match self.output_scaling {
            OutputScaling::DivideLogits(s) => ops::divide(&logits, &scalar(s, &logits)?)?,
            OutputScaling::Softcap(cap) => softcap(&logits, cap)?,
            OutputScaling::None | OutputScaling::DivideHidden(_) => logits,
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use mlx_rs::Dtype;

    use super::*;
    use crate::error::Error;
    use crate::gguf;
    use crate::model::{create_model, gguf_weights};

    fn states(caches: &[LayerCache]) -> Vec<Vec<f32>> {
        caches
            .iter()
            .flat_map(|c| c.state())
            .map(|a| {
                let a = a.as_dtype(Dtype::Float32).unwrap();
                a.eval().unwrap();
                a.as_slice::<f32>().to_vec()
            })
            .collect()
    }

    /// Prefilling layer by layer leaves the caches bit for bit as one graph does, and a failed
    /// check stops it right after the layer it follows. Set MLX_BUN_TEST_GGUF to
    /// SmolLM2-135M-Instruct.Q4_1.gguf (real weights) and run with `--ignored`.
    #[test]
    #[ignore = "needs MLX_BUN_TEST_GGUF=path/to/SmolLM2-135M-Instruct.Q4_1.gguf"]
    fn prefill_by_layers_equals_one_graph_and_stops_between_layers() {
        let g = gguf::tests::test_file("MLX_BUN_TEST_GGUF");
        let (w, cfg) = gguf_weights::load(&g).unwrap();
        let model = create_model(w, cfg).unwrap();
        let ids = Array::from_slice(&[1u32, 502, 9, 1234, 77, 4000, 12, 8], &[1, 8]);

        let tokens = Tokens::uniform(ids);
        let mut whole = model.new_cache();
        model.forward(&tokens, CacheView::Rows(&mut [&mut whole]), &StepContext::LAST).unwrap().unwrap().eval().unwrap();
        let mut layered = model.new_cache();
        let ok = || Ok(());
        model.forward(&tokens, CacheView::Rows(&mut [&mut layered]), &StepContext { logits: Logits::None, check: Some(&ok) }).unwrap();
        assert_eq!(states(&layered), states(&whole));

        let asked = Cell::new(0);
        let mut stopped = model.new_cache();
        let stop = || {
            asked.set(asked.get() + 1);
            Err(Error::Cancelled("requested"))
        };
        let ctx = StepContext { logits: Logits::None, check: Some(&stop) };
        let err = model.forward(&tokens, CacheView::Rows(&mut [&mut stopped]), &ctx).unwrap_err();
        assert!(matches!(err, Error::Cancelled("requested")), "{err}");
        assert_eq!(asked.get(), 1);
        let offsets: Vec<usize> = stopped.iter().map(|c| c.offset()).collect();
        assert_eq!(offsets[0], 8);
        assert!(offsets[1..].iter().all(|&o| o == 0), "{offsets:?}");
    }
}
