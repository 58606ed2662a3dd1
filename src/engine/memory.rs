//! Memory admission (mlx-bun's `memoryBudgetBytes`). On a Mac, running out of GPU memory cannot
//! be caught, so an engine with a budget admits a session only if its whole context (prompt and
//! `maxTokens`) fits, by `fit()`'s formulas, beside what is resident: the model's weights, the
//! contexts reserved by the sessions running, and the prefix cache. Prefix-cache entries are
//! reclaimed first, oldest first; a session that still does not fit waits for running ones to
//! end; one that could not fit even alone is refused with `INSUFFICIENT_MEMORY`.
use crate::cache::KvQuantOptions;
use crate::error::{Error, Result};
use crate::fit::{kv_bytes_at, sdpa_fallback_bytes, KvScheme, ModelFit, Text, TRANSIENT_PER_TOKEN};
use crate::model::config::ModelConfig;

pub struct MemoryBudget {
    budget: f64,
    weights: f64,
    text: Text,
}

/// Whether a session may start now.
#[derive(Debug)]
pub enum Verdict {
    Admit,
    /// Not beside what runs now; alone it would.
    Wait,
    Refuse(Error),
}

impl MemoryBudget {
    /// The budget of an engine over the model whose config this is (its weights' bytes on disk).
    pub fn of(budget: u64, config: &ModelConfig) -> Result<MemoryBudget> {
        let m = ModelFit::of(config, &config.model_path())?;
        Ok(MemoryBudget { budget: budget as f64, weights: m.weights_bytes, text: m.text })
    }

    /// Bytes a session of `tokens` positions needs: its KV cache as quantized, and one
    /// prefill chunk's transient buffers (what `fit` bills).
    pub fn need(&self, tokens: usize, kv: &KvQuantOptions, chunk: usize) -> f64 {
        let scheme = KvScheme {
            uniform: kv.config.is_empty().then_some(kv.bits).flatten().map(|b| (b as f64, kv.group_size as f64)),
            per_layer: kv.config.iter().map(|(l, q)| (*l, q.bits as f64, q.group_size as f64)).collect(),
        };
        let (n, chunk) = (tokens as f64, chunk as f64);
        kv_bytes_at(&self.text, n, &scheme) + chunk.min(n) * TRANSIENT_PER_TOKEN + sdpa_fallback_bytes(&self.text, chunk, n)
    }

    /// Whether `need` must wait for some of `reserved` to be freed (the prefix cache can all be
    /// reclaimed).
    pub fn waits(&self, need: f64, reserved: f64) -> bool {
        self.weights + need <= self.budget && self.weights + reserved + need > self.budget
    }

    /// Whether `need` fits beside `reserved` bytes of running sessions and `cached` bytes of the
    /// prefix cache; `reclaim` drops the oldest prefix-cache entry and says whether there was one.
    pub fn admit(&self, need: f64, reserved: f64, mut cached: impl FnMut() -> f64, mut reclaim: impl FnMut() -> bool) -> Verdict {
        if self.weights + need > self.budget {
            return Verdict::Refuse(Error::InsufficientMemory(format!(
                "a context of this request needs {:.0} MB beside the model's {:.0} MB of weights; the engine's memoryBudgetBytes is {:.0} MB",
                need / 1e6,
                self.weights / 1e6,
                self.budget / 1e6
            )));
        }
        while self.weights + reserved + cached() + need > self.budget {
            if !reclaim() {
                return Verdict::Wait;
            }
        }
        Verdict::Admit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn budget(bytes: f64) -> MemoryBudget {
        let text = Text::from_json(&serde_json::json!({
            "numHiddenLayers": 2, "numAttentionHeads": 4, "numKeyValueHeads": 2, "headDim": 64, "maxPositionEmbeddings": 4096
        }))
        .unwrap();
        MemoryBudget { budget: bytes, weights: 1e6, text }
    }

    #[test]
    fn reclaims_the_prefix_cache_then_waits_then_refuses() {
        let b = budget(60e6);
        let kv = KvQuantOptions::default();
        let need = b.need(100, &kv, 2048);
        // 2 layers × 2 (k, v) × 2 heads × 64 dims × 2 bytes per position, plus 0.55 MB per token
        // (head dim 64 has MLX's fused attention: no scores are materialised).
        assert_eq!(need, 100.0 * 1024.0 + 100.0 * 0.55e6);
        assert!(matches!(b.admit(need, 0.0, || 0.0, || false), Verdict::Admit));
        let cached = Cell::new(5e6);
        let reclaimed = Cell::new(0);
        let verdict = b.admit(need, 0.0, || cached.get(), || {
            reclaimed.set(reclaimed.get() + 1);
            cached.set(cached.get() - 1e6);
            true
        });
        assert!(matches!(verdict, Verdict::Admit));
        assert_eq!(reclaimed.get(), 2, "entries reclaimed until it fits, no more");
        assert!(matches!(b.admit(need, 5e6, || 0.0, || false), Verdict::Wait));
        assert!(matches!(b.admit(b.need(1000, &kv, 2048), 0.0, || 0.0, || false), Verdict::Refuse(Error::InsufficientMemory(_))));
        // A 4-bit cache needs less.
        let q4 = KvQuantOptions { bits: Some(4), ..Default::default() };
        assert!(b.need(100, &q4, 2048) < need);
    }
}
