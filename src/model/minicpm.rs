//! MiniCPM (mlx-lm's `minicpm.py`): Llama blocks (no biases, head_dim = hidden / heads) with
//! muP-style scaling: embeddings times `scale_emb`, each residual update times
//! `scale_depth / √layers`, and the final hidden states divided by `hidden / dim_model_base`
//! before the output projection.
use super::config::ModelConfig;
use super::decoder::{Block, Decoder, OutputScaling};
use super::attention::AttentionSpec;
use super::rope::Rope;
use super::weights::Weights;
use crate::error::Result;

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let hd = cfg.hidden_size / cfg.num_attention_heads;
    let scale_emb = cfg.required_f64("scale_emb")? as f32;
    // Python floats in mlx-lm, computed in double precision.
    let residual = (cfg.required_f64("scale_depth")? / (cfg.num_hidden_layers as f64).sqrt()) as f32;
    let head_divisor = (cfg.hidden_size as f64 / cfg.required_f64("dim_model_base")?) as f32;
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let spec = AttentionSpec::plain(hd, Rope::new(&cfg, hd, None)?);
            Ok(Block { residual_scale: Some(residual), ..Block::pre_norm(w, &cfg, i, spec, false, false)? })
        })
        .collect::<Result<_>>()?;
    // mlx-lm copies the embedding into a missing lm_head (its `sanitize`), and the division
    // applies either way. (A config with tie_word_embeddings true does not load in mlx-lm.)
    let tied = !w.has("lm_head.weight");
    Ok(Decoder {
        embed_scale: Some(scale_emb),
        output_scaling: OutputScaling::DivideHidden(head_divisor),
        ..Decoder::assemble(w, cfg, layers, tied, 0)?
    })
}
