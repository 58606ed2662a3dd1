//! Qwen3-MoE (mlx-lm's `qwen3_moe.py`): Qwen3's attention, and in every `decoder_sparse_step`-th
//! layer not listed in `mlp_only_layers` a sparse mixture of experts (`experts.rs`) instead of
//! the dense SwiGLU MLP.
use super::blocks::FeedForward;
use super::config::ModelConfig;
use super::decoder::{Block, Decoder};
use super::experts::{ExpertsConfig, SparseMoe};
use super::layers::{Activation, Mlp};
use super::qwen3::attention;
use super::weights::Weights;
use crate::error::{Error, Result};

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let experts = ExpertsConfig::from_config(&cfg)?;
    let step = cfg.usize_opt("decoder_sparse_step").unwrap_or(1);
    if step == 0 {
        return Err(Error::config(&cfg.source, "decoder_sparse_step must be > 0"));
    }
    let dense: Vec<u64> = match cfg.raw.get("mlp_only_layers") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(v) => serde_json::from_value(v.clone()).map_err(|_| Error::config(&cfg.source, "mlp_only_layers must be a list of layer indices"))?,
    };
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let path = format!("model.layers.{i}.mlp");
            let mlp = if !dense.contains(&(i as u64)) && (i + 1) % step == 0 {
                FeedForward::Experts(Box::new(SparseMoe::load(w, &cfg, &path, &experts)?))
            } else {
                Mlp::load(w, &cfg, &path, Activation::Silu, false)?.into()
            };
            Block::pre_norm_with(w, &cfg, i, attention(&cfg)?, mlp, false)
        })
        .collect::<Result<_>>()?;
    let tied = cfg.tie_word_embeddings.unwrap_or(false);
    Decoder::assemble(w, cfg, layers, tied, 0)
}
