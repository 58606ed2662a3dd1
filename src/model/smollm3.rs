//! SmolLM3 (mlx-lm's `smollm3.py`): Llama (with its `layer_types` sliding windows) where some
//! layers use no positional encoding at all (NoPE): `no_rope_layers[i]` is 1 for a layer with
//! RoPE, 0 for one without; by default every `no_rope_layer_interval`-th layer (4) has none.
use super::config::ModelConfig;
use super::decoder::Decoder;
use super::llama;
use super::weights::Weights;
use crate::error::{Error, Result};

pub fn load(w: &Weights, cfg: ModelConfig) -> Result<Decoder> {
    let rope = rope_layers(&cfg)?;
    llama::build(w, cfg, &rope)
}

/// Whether each layer rotates q and k.
fn rope_layers(cfg: &ModelConfig) -> Result<Vec<bool>> {
    let n = cfg.num_hidden_layers;
    let Some(list) = cfg.raw.get("no_rope_layers").filter(|v| !v.is_null()) else {
        let interval = cfg.usize_opt("no_rope_layer_interval").unwrap_or(4).max(1);
        return Ok((0..n).map(|i| (i + 1) % interval != 0).collect());
    };
    let flags: Option<Vec<bool>> = list.as_array().map(|a| a.iter().map(|v| v.as_u64().map(|x| x != 0)).collect()).flatten();
    match flags {
        Some(f) if f.len() == n => Ok(f),
        _ => Err(Error::config(&cfg.source, format!("no_rope_layers must list 0 or 1 for each of the {n} layers"))),
    }
}
