//! The decoder-only transformer every supported architecture is an instance of: token embedding,
//! a stack of attention + MLP blocks (pre-norm, optionally with Gemma's post-norms), a final norm
//! and the output projection. Architectures differ only in how they fill these parts.
use mlx_rs::transforms::eval;
use mlx_rs::{ops, Array, Dtype};

use super::config::ModelConfig;
use super::layers::{Activation, Attention, AttentionSpec, Embedding, Linear, Mlp, RmsNorm};
use super::weights::Weights;
use super::LanguageModel;
use crate::cache::{BatchKvCache, KvCache, LayerCache, Mask, RotatingKvCache, StackedStep};
use crate::error::Result;

pub struct Block {
    pub input_norm: RmsNorm,
    pub attn: Attention,
    /// Gemma normalises the attention output before the residual add.
    pub post_attn_norm: Option<RmsNorm>,
    pub pre_mlp_norm: RmsNorm,
    pub mlp: Mlp,
    /// Gemma normalises the MLP output before the residual add.
    pub post_mlp_norm: Option<RmsNorm>,
    /// Sliding-window attention (rotating cache) instead of full attention.
    pub sliding: bool,
}

impl Block {
    /// Layer `i` of the common pre-norm layout: `input_layernorm` → attention,
    /// `post_attention_layernorm` → SwiGLU MLP (`fused_mlp`: one `gate_up_proj`).
    pub fn pre_norm(w: &Weights, cfg: &ModelConfig, i: usize, spec: AttentionSpec, fused_mlp: bool, sliding: bool) -> Result<Block> {
        let (p, d, eps) = (format!("model.layers.{i}"), cfg.hidden_size, cfg.rms_norm_eps);
        Ok(Block {
            input_norm: RmsNorm::load(w, &format!("{p}.input_layernorm"), d, eps)?,
            attn: Attention::load(w, cfg, &format!("{p}.self_attn"), spec)?,
            post_attn_norm: None,
            pre_mlp_norm: RmsNorm::load(w, &format!("{p}.post_attention_layernorm"), d, eps)?,
            mlp: Mlp::load(w, cfg, &format!("{p}.mlp"), Activation::Silu, fused_mlp)?,
            post_mlp_norm: None,
            sliding,
        })
    }

    fn forward(&self, x: &Array, mask: &Mask, cache: &mut LayerCache) -> Result<Array> {
        let r = self.attn.forward(&self.input_norm.forward(x)?, mask, cache)?;
        self.finish(x, r)
    }

    /// Independent sequences in one batch (see `Attention::forward_rows`).
    fn forward_rows(&self, x: &Array, masks: &[Mask], caches: &mut [&mut LayerCache]) -> Result<Array> {
        let r = self.attn.forward_rows(&self.input_norm.forward(x)?, masks, caches)?;
        self.finish(x, r)
    }

    fn forward_stacked(&self, x: &Array, cache: &mut BatchKvCache, layer: usize, step: &StackedStep) -> Result<Array> {
        let r = self.attn.forward_stacked(&self.input_norm.forward(x)?, cache, layer, step)?;
        self.finish(x, r)
    }

    /// The residual adds and the MLP around an attention output `r`.
    fn finish(&self, x: &Array, mut r: Array) -> Result<Array> {
        if let Some(n) = &self.post_attn_norm {
            r = n.forward(&r)?;
        }
        let h = ops::add(x, &r)?;
        let mut r = self.mlp.forward(&self.pre_mlp_norm.forward(&h)?)?;
        if let Some(n) = &self.post_mlp_norm {
            r = n.forward(&r)?;
        }
        Ok(ops::add(&h, &r)?)
    }
}

pub struct Decoder {
    pub config: ModelConfig,
    pub embed_tokens: Embedding,
    /// Gemma multiplies embeddings by √hidden_size, rounded to bf16.
    pub embed_scale: Option<f32>,
    pub layers: Vec<Block>,
    pub norm: RmsNorm,
    /// `None` = tied to the embedding.
    pub lm_head: Option<Linear>,
    /// Window of the sliding layers.
    pub sliding_window: usize,
}

impl Decoder {
    /// `model.embed_tokens`, `layers`, `model.norm` and `lm_head` (absent when `tied`).
    pub fn assemble(w: &Weights, cfg: ModelConfig, layers: Vec<Block>, tied: bool, sliding_window: usize) -> Result<Decoder> {
        Ok(Decoder {
            embed_tokens: Embedding::load(w, &cfg, "model.embed_tokens", cfg.vocab_size, cfg.hidden_size)?,
            embed_scale: None,
            layers,
            norm: RmsNorm::load(w, "model.norm", cfg.hidden_size, cfg.rms_norm_eps)?,
            lm_head: Self::lm_head(w, &cfg, tied)?,
            sliding_window,
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
    /// The layers, before the final norm; `after` sees each layer's output.
    fn forward(&self, ids: &Array, caches: &mut [LayerCache], after: &mut dyn FnMut(usize, &Array) -> Result<()>) -> Result<Array> {
        let mut h = self.embed(ids)?;
        let n = ids.shape()[1] as usize;
        // Masks come from the caches' state before this step, one per attention kind.
        let full = self.layers.iter().position(|b| !b.sliding);
        let sliding = self.layers.iter().position(|b| b.sliding);
        let full_mask = full.map(|i| caches[i].make_mask(n, None)).transpose()?;
        let sliding_mask = sliding.map(|i| caches[i].make_mask(n, Some(self.sliding_window))).transpose()?;
        for (j, (layer, cache)) in self.layers.iter().zip(caches.iter_mut()).enumerate() {
            let mask = if layer.sliding { sliding_mask.as_ref() } else { full_mask.as_ref() };
            h = layer.forward(&h, mask.expect("a mask exists for every kind of layer present"), cache)?;
            after(j, &h)?;
        }
        Ok(h)
    }

    /// The same over independent rows, each on its own caches.
    fn forward_rows(&self, ids: &Array, rows: &mut [&mut [LayerCache]], after: &mut dyn FnMut(usize, &Array) -> Result<()>) -> Result<Array> {
        let mut h = self.embed(ids)?;
        let n = ids.shape()[1] as usize;
        for (j, layer) in self.layers.iter().enumerate() {
            let window = layer.sliding.then_some(self.sliding_window);
            let masks = rows.iter().map(|c| c[j].make_mask(n, window)).collect::<Result<Vec<_>>>()?;
            let mut caches: Vec<&mut LayerCache> = rows.iter_mut().map(|c| &mut c[j]).collect();
            h = layer.forward_rows(&h, &masks, &mut caches)?;
            after(j, &h)?;
        }
        Ok(h)
    }

    /// A prefill's step between layers: evaluate the layer, then ask `check`. The last layer's
    /// output feeds nothing a prefill keeps, so it is left to the caches' evaluation.
    fn between_layers<'a>(&self, check: &'a dyn Fn() -> Result<()>) -> impl FnMut(usize, &Array) -> Result<()> + 'a {
        let last = self.layers.len() - 1;
        move |j, h| {
            if j < last {
                h.eval()?;
                check()?;
            }
            Ok(())
        }
    }

    fn embed(&self, ids: &Array) -> Result<Array> {
        let h = self.embed_tokens.forward(ids)?;
        Ok(match self.embed_scale {
            Some(s) => ops::multiply(&h, &Array::from_f32(s).as_dtype(Dtype::Bfloat16)?.as_dtype(h.dtype())?)?,
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

    fn hidden(&self, ids: &Array, caches: &mut [LayerCache]) -> Result<Array> {
        let h = self.forward(ids, caches, &mut |_, _| Ok(()))?;
        self.norm.forward(&h)
    }

    fn hidden_rows(&self, ids: &Array, rows: &mut [&mut [LayerCache]]) -> Result<Array> {
        let h = self.forward_rows(ids, rows, &mut |_, _| Ok(()))?;
        self.norm.forward(&h)
    }

    fn prefill(&self, ids: &Array, caches: &mut [LayerCache], check: &dyn Fn() -> Result<()>) -> Result<()> {
        self.forward(ids, caches, &mut self.between_layers(check))?;
        Ok(eval(caches.iter().flat_map(|c| c.state()))?)
    }

    fn prefill_rows(&self, ids: &Array, rows: &mut [&mut [LayerCache]], check: &dyn Fn() -> Result<()>) -> Result<()> {
        self.forward_rows(ids, rows, &mut self.between_layers(check))?;
        Ok(eval(rows.iter().flat_map(|r| r.iter().flat_map(|c| c.state())))?)
    }

    fn stackable(&self) -> bool {
        !self.layers.iter().any(|b| b.sliding)
    }

    fn hidden_stacked(&self, ids: &Array, cache: &mut BatchKvCache) -> Result<Array> {
        let mut h = self.embed(ids)?;
        let step = cache.begin_step()?;
        for (j, layer) in self.layers.iter().enumerate() {
            h = layer.forward_stacked(&h, cache, j, &step)?;
        }
        cache.end_step();
        self.norm.forward(&h)
    }

    fn logits(&self, hidden: &Array) -> Result<Array> {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => self.embed_tokens.as_linear(hidden),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::error::Error;
    use crate::model::{create_model, gguf, gguf_weights};

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
        let Some(g) = gguf::test_file("MLX_BUN_TEST_GGUF") else { return };
        let (w, cfg) = gguf_weights::load(&g).unwrap();
        let model = create_model(w, cfg).unwrap();
        let ids = Array::from_slice(&[1u32, 502, 9, 1234, 77, 4000, 12, 8], &[1, 8]);

        let mut whole = model.new_cache();
        model.hidden(&ids, &mut whole).unwrap();
        let mut layered = model.new_cache();
        model.prefill(&ids, &mut layered, &|| Ok(())).unwrap();
        assert_eq!(states(&layered), states(&whole));

        let asked = Cell::new(0);
        let mut stopped = model.new_cache();
        let stop = || {
            asked.set(asked.get() + 1);
            Err(Error::Cancelled("requested"))
        };
        let err = model.prefill(&ids, &mut stopped, &stop).unwrap_err();
        assert!(matches!(err, Error::Cancelled("requested")), "{err}");
        assert_eq!(asked.get(), 1);
        let offsets: Vec<usize> = stopped.iter().map(|c| c.offset()).collect();
        assert_eq!(offsets[0], 8);
        assert!(offsets[1..].iter().all(|&o| o == 0), "{offsets:?}");
    }
}
