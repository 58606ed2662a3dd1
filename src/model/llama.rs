//! Llama (SmolLM2, Llama 3.x, Mistral-style): pre-norm blocks of GQA attention and a SwiGLU MLP.
use mlx_rs::Array;

use super::config::ModelConfig;
use super::layers::{Attention, Embedding, Linear, RmsNorm, SwiGlu};
use super::weights::Weights;
use super::LanguageModel;
use crate::cache::KvCache;
use crate::error::Result;

struct Block {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: SwiGlu,
}

impl Block {
    fn load(w: &Weights, cfg: &ModelConfig, path: &str) -> Result<Self> {
        let (d, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        Ok(Block {
            input_layernorm: RmsNorm::load(w, &format!("{path}.input_layernorm"), d, eps)?,
            self_attn: Attention::load(w, cfg, &format!("{path}.self_attn"))?,
            post_attention_layernorm: RmsNorm::load(w, &format!("{path}.post_attention_layernorm"), d, eps)?,
            mlp: SwiGlu::load(w, cfg, &format!("{path}.mlp"))?,
        })
    }

    fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        let h = x.add(self.self_attn.forward(&self.input_layernorm.forward(x)?, cache)?)?;
        Ok(h.add(self.mlp.forward(&self.post_attention_layernorm.forward(&h)?)?)?)
    }
}

pub struct Llama {
    config: ModelConfig,
    embed_tokens: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
}

impl Llama {
    pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Self> {
        let (d, v) = (cfg.hidden_size, cfg.vocab_size);
        Ok(Llama {
            embed_tokens: Embedding::load(w, &cfg, "model.embed_tokens", v, d)?,
            layers: (0..cfg.num_hidden_layers)
                .map(|i| Block::load(w, &cfg, &format!("model.layers.{i}")))
                .collect::<Result<_>>()?,
            norm: RmsNorm::load(w, "model.norm", d, cfg.rms_norm_eps)?,
            lm_head: if cfg.tie_word_embeddings { None } else { Some(Linear::load(w, &cfg, "lm_head", v, d, false)?) },
            config: cfg,
        })
    }
}

impl LanguageModel for Llama {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn new_cache(&self) -> Vec<KvCache> {
        (0..self.layers.len()).map(|_| KvCache::default()).collect()
    }

    fn hidden(&self, ids: &Array, caches: &mut [KvCache]) -> Result<Array> {
        let mut h = self.embed_tokens.forward(ids)?;
        for (layer, cache) in self.layers.iter().zip(caches) {
            h = layer.forward(&h, cache)?;
        }
        self.norm.forward(&h)
    }

    fn logits(&self, hidden: &Array) -> Result<Array> {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => self.embed_tokens.as_linear(hidden),
        }
    }
}
