//! Mixture-of-experts feed-forward (mlx-lm's `switch_layers.py` and Qwen3-MoE's sparse block):
//! a router picks each token's top-k experts, each expert is a SwiGLU MLP, and their outputs are
//! summed weighted by the router's scores. The experts' weights are stacked [experts, out, in]
//! and multiplied with `gather_mm` / `gather_qmm`, which pick each token's experts by index, so a
//! batch runs every token's experts in one product per projection.
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};

use super::config::{ModelConfig, QuantParams};
use super::layers::{Activation, Linear, Mlp};
use super::weights::Weights;
use crate::error::{Error, Result};

/// The sizes of a model's expert layers, checked before any of them is built.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertsConfig {
    pub num_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Each expert's hidden width.
    pub intermediate_size: usize,
    /// Whether the top-k scores are renormalised to sum to 1.
    pub norm_topk_prob: bool,
}

impl ExpertsConfig {
    /// `num_experts`, `num_experts_per_tok`, `moe_intermediate_size`, `norm_topk_prob` (Qwen's
    /// names), bounded so no product or allocation follows from an absurd number.
    pub fn from_config(cfg: &ModelConfig) -> Result<Self> {
        let norm_topk_prob = cfg.raw.get("norm_topk_prob").and_then(serde_json::Value::as_bool).unwrap_or(false);
        Self::read(cfg, "num_experts_per_tok", norm_topk_prob)
    }

    /// `num_experts`, `moe_intermediate_size` and the experts per token under `top_k_key` (each
    /// family's name for it), bounded.
    pub fn read(cfg: &ModelConfig, top_k_key: &str, norm_topk_prob: bool) -> Result<Self> {
        let need = |key: &str| cfg.usize_opt(key).ok_or_else(|| Error::config(&cfg.source, format!("{} needs a whole number {key}", cfg.model_type)));
        let (num_experts, top_k, intermediate_size) = (need("num_experts")?, need(top_k_key)?, need("moe_intermediate_size")?);
        if num_experts == 0 || num_experts > 1 << 16 || top_k == 0 || top_k > num_experts || intermediate_size == 0 {
            return Err(Error::config(
                &cfg.source,
                format!("experts: num_experts {num_experts} (1 to 65536), {top_k_key} {top_k} (1 to num_experts) and moe_intermediate_size {intermediate_size} (> 0)"),
            ));
        }
        Ok(ExpertsConfig { num_experts, top_k, intermediate_size, norm_topk_prob })
    }
}

/// One projection of every expert: W [experts, out, in].
enum SwitchLinear {
    Dense(Array),
    Quantized { weight: Array, scales: Array, biases: Array, params: QuantParams },
}

impl SwitchLinear {
    /// `<path>.weight` stacked ([experts, out, in], quantized with `.scales`/`.biases` as mlx-lm
    /// saves it), or, in a Hugging Face checkpoint, one `<each>.<e>.<name>.weight` per expert.
    fn load(w: &Weights, cfg: &ModelConfig, path: &str, each: Option<(&str, &str)>, experts: usize, out: usize, inp: usize) -> Result<Self> {
        if w.has(&format!("{path}.scales")) {
            let q = cfg.quantization.as_ref().and_then(|q| q.params_for(path)).ok_or_else(|| Error::tensor(format!("{path}.scales"), "quantized tensor but config.json does not quantize it"))?;
            let (gs, bits) = (q.group_size as usize, q.bits as usize);
            if inp % gs != 0 || (inp * bits) % 32 != 0 {
                return Err(Error::tensor(format!("{path}.weight"), format!("rows of {inp} cannot be quantized in groups of {gs} at {bits} bits")));
            }
            return Ok(SwitchLinear::Quantized {
                weight: w.array_shaped(&format!("{path}.weight"), &[experts, out, inp * bits / 32])?,
                scales: w.array_shaped(&format!("{path}.scales"), &[experts, out, inp / gs])?,
                biases: w.array_shaped(&format!("{path}.biases"), &[experts, out, inp / gs])?,
                params: q,
            });
        }
        match each {
            Some((prefix, name)) if !w.has(&format!("{path}.weight")) => {
                let each = (0..experts).map(|i| w.array_shaped(&format!("{prefix}.{i}.{name}.weight"), &[out, inp])).collect::<Result<Vec<_>>>()?;
                Ok(SwitchLinear::Dense(ops::stack(&each, 0)?))
            }
            _ => Ok(SwitchLinear::Dense(w.array_shaped(&format!("{path}.weight"), &[experts, out, inp])?)),
        }
    }

    /// The first `rows` outputs of every expert, and the rest (quantized rows are independent).
    fn split_rows(self, rows: i32) -> (Self, Self) {
        let split = |a: &Array| (a.index((.., ..rows, ..)), a.index((.., rows.., ..)));
        match self {
            SwitchLinear::Dense(w) => {
                let (a, b) = split(&w);
                (SwitchLinear::Dense(a), SwitchLinear::Dense(b))
            }
            SwitchLinear::Quantized { weight, scales, biases, params } => {
                let ((w0, w1), (s0, s1), (b0, b1)) = (split(&weight), split(&scales), split(&biases));
                (
                    SwitchLinear::Quantized { weight: w0, scales: s0, biases: b0, params },
                    SwitchLinear::Quantized { weight: w1, scales: s1, biases: b1, params },
                )
            }
        }
    }

    /// `x · W[idx]ᵀ` for each index: x [..., 1, in] with idx [...] → [..., 1, out].
    fn forward(&self, x: &Array, idx: &Array, sorted: bool) -> Result<Array> {
        Ok(match self {
            SwitchLinear::Dense(w) => ops::gather_mm(x, w.swap_axes(-1, -2)?, None, idx, sorted)?,
            SwitchLinear::Quantized { weight, scales, biases, params } => {
                ops::gather_qmm(x, weight, scales, biases, None, idx, true, params.group_size, params.bits, sorted)?
            }
        })
    }
}

/// Every expert's gated MLP (mlx-lm's `SwitchGLU`), run for each token's chosen experts.
pub struct SwitchGlu {
    gate_proj: SwitchLinear,
    up_proj: SwitchLinear,
    down_proj: SwitchLinear,
    activation: Activation,
}

impl SwitchGlu {
    /// `<path>.{gate,up,down}_proj` stacked over `experts` (gate and up also as one
    /// `gate_up_proj`, gate rows first, as llama.cpp stores Gemma 4's), or a Hugging Face
    /// checkpoint's `<each>.<e>.<name>` per expert; `hidden`: each expert's width.
    pub fn load(w: &Weights, cfg: &ModelConfig, path: &str, each: Option<&str>, experts: usize, hidden: usize, activation: Activation) -> Result<Self> {
        let d = cfg.hidden_size;
        let proj = |name: &str, out: usize, inp: usize| SwitchLinear::load(w, cfg, &format!("{path}.{name}"), each.map(|e| (e, name)), experts, out, inp);
        let (gate_proj, up_proj) = if each.is_none() && w.has(&format!("{path}.gate_up_proj.weight")) {
            let both = hidden.checked_mul(2).ok_or_else(|| Error::config(&cfg.source, format!("expert width {hidden} overflows")))?;
            proj("gate_up_proj", both, d)?.split_rows(hidden as i32)
        } else {
            (proj("gate_proj", hidden, d)?, proj("up_proj", hidden, d)?)
        };
        Ok(SwitchGlu { gate_proj, up_proj, down_proj: proj("down_proj", d, hidden)?, activation })
    }

    /// The experts as Gemma 4 and Qwen3.5-MoE are published, if `<path>` holds them so: one
    /// `gate_up_proj` [experts, 2 · hidden, d] (gate rows first) and one `down_proj`.
    pub fn load_fused(w: &Weights, cfg: &ModelConfig, path: &str, experts: usize, hidden: usize, activation: Activation) -> Result<Option<Self>> {
        let fused = format!("{path}.gate_up_proj");
        if !w.has(&fused) {
            return Ok(None);
        }
        let d = cfg.hidden_size;
        let both = hidden.checked_mul(2).ok_or_else(|| Error::config(&cfg.source, format!("moe_intermediate_size {hidden} overflows")))?;
        let gate_up = w.array_shaped(&fused, &[experts, both, d])?;
        let h = hidden as i32;
        let (gate, up) = (gate_up.index((.., ..h, ..)), gate_up.index((.., h.., ..)));
        let down = w.array_shaped(&format!("{path}.down_proj"), &[experts, d, hidden])?;
        Ok(Some(SwitchGlu { gate_proj: SwitchLinear::Dense(gate), up_proj: SwitchLinear::Dense(up), down_proj: SwitchLinear::Dense(down), activation }))
    }

    /// x [B, L, D] through experts `inds` [B, L, k] → [B, L, k, D]. From 64 (token, expert) pairs
    /// on, the pairs are sorted by expert first, as mlx-lm does, so that each expert's weights
    /// are read once per step.
    pub fn forward(&self, x: &Array, inds: &Array) -> Result<Array> {
        let x = ops::expand_dims_axes(x, &[-2, -3])?;
        let sort = inds.size() >= 64;
        let (x, idx, inverse) = if sort {
            let k = inds.shape()[inds.ndim() - 1];
            let flat = inds.flatten(None, None)?;
            let order = ops::argsort_axis(&flat, -1)?;
            let inverse = ops::argsort_axis(&order, -1)?;
            let rows = ops::floor_divide(&order, Array::from_int(k).as_dtype(order.dtype())?)?;
            (x.flatten(0, -3)?.take_axis(&rows, 0)?, flat.take_axis(&order, 0)?, Some(inverse))
        } else {
            (x, inds.clone(), None)
        };
        let up = self.up_proj.forward(&x, &idx, sort)?;
        let gate = self.gate_proj.forward(&x, &idx, sort)?;
        let mut y = self.down_proj.forward(&self.activation.gated(&gate, &up)?, &idx, sort)?;
        if let Some(inverse) = inverse {
            let mut shape = inds.shape().to_vec();
            shape.extend_from_slice(&y.shape()[1..]);
            y = y.take_axis(&inverse, 0)?.reshape(&shape)?;
        }
        Ok(y.squeeze_axes(&[-2])?)
    }
}

/// Each token's top-k experts (SwiGLU MLPs) weighted by the router's scores, plus, in
/// Qwen3-Next and Qwen3.5-MoE, a shared expert every token goes through, scaled by a sigmoid gate.
pub struct SparseMoe {
    router: Linear,
    experts: SwitchGlu,
    top_k: i32,
    norm_topk_prob: bool,
    shared: Option<(Mlp, Linear)>,
}

impl SparseMoe {
    /// `<path>.gate` (the router) and the experts of `<path>.switch_mlp` (mlx-lm), or
    /// `<path>.experts` (per expert, or fused as Qwen3.5-MoE is published).
    pub fn load(w: &Weights, cfg: &ModelConfig, path: &str, e: &ExpertsConfig) -> Result<Self> {
        let each = format!("{path}.experts");
        let experts = match SwitchGlu::load_fused(w, cfg, &each, e.num_experts, e.intermediate_size, Activation::Silu)? {
            Some(fused) => fused,
            None => SwitchGlu::load(w, cfg, &format!("{path}.switch_mlp"), Some(&each), e.num_experts, e.intermediate_size, Activation::Silu)?,
        };
        Ok(SparseMoe {
            router: Linear::load(w, cfg, &format!("{path}.gate"), e.num_experts, cfg.hidden_size, false)?,
            experts,
            top_k: e.top_k as i32,
            norm_topk_prob: e.norm_topk_prob,
            shared: None,
        })
    }

    /// `load`, with the shared expert `<path>.shared_expert` (SwiGLU of width `hidden`) and its
    /// gate `<path>.shared_expert_gate`.
    pub fn load_with_shared(w: &Weights, cfg: &ModelConfig, path: &str, e: &ExpertsConfig, hidden: usize) -> Result<Self> {
        let mlp = Mlp::load_sized(w, cfg, &format!("{path}.shared_expert"), Activation::Silu, false, hidden)?;
        let gate = Linear::load(w, cfg, &format!("{path}.shared_expert_gate"), 1, cfg.hidden_size, false)?;
        Ok(SparseMoe { shared: Some((mlp, gate)), ..Self::load(w, cfg, path, e)? })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let gates = ops::softmax_axis(self.router.forward(x)?, -1, true)?;
        let experts = gates.shape()[gates.ndim() - 1];
        let inds = ops::argpartition_axis(&gates, experts - self.top_k, -1)?.index((.., .., experts - self.top_k..));
        let mut scores = gates.take_along_axis(&inds, -1)?;
        if self.norm_topk_prob {
            scores = ops::divide(&scores, ops::sum_axis(&scores, -1, true)?)?;
        }
        let y = self.experts.forward(x, &inds)?;
        let weighted = ops::multiply(&y, ops::expand_dims(&scores, -1)?)?;
        let y = ops::sum_axis(&weighted, -2, false)?.as_dtype(y.dtype())?;
        match &self.shared {
            Some((mlp, gate)) => Ok(ops::add(&y, &ops::multiply(&ops::sigmoid(&gate.forward(x)?)?, &mlp.forward(x)?)?)?),
            None => Ok(y),
        }
    }
}

