//! `mlx-bun eval`: what an approximation (quantized weights or KV, a fast path) costs in
//! quality, measured on the serving path. Perplexity of a text, and KL against a saved teacher's
//! logits (the format-1 dump of mlx-bun's eval README, `dump`), written by mlx-lm
//! (scripts/mlx_lm_eval.py) or by our own engine.
pub mod dump;
pub mod forward;
pub mod metrics;
