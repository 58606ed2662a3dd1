//! Log-probabilities of the chosen token and its top alternatives, read back after a step.
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array, Dtype};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    pub id: u32,
    pub logprob: f32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// Most likely alternatives, most likely first.
    #[serde(default)]
    pub top: Vec<TopLogprob>,
}

/// Lazy arrays for one step's logprobs, evaluated together with the token.
pub struct PendingLogprobs {
    chosen: Array,
    top: Option<(Array, Array)>,
}

impl PendingLogprobs {
    /// `logprobs` [1, V], `token` [1].
    pub fn new(logprobs: &Array, token: &Array, top: u32) -> Result<Self> {
        let chosen = logprobs.take_along_axis(&token.as_dtype(Dtype::Int32)?.reshape(&[1, 1])?, -1)?;
        let top = if top > 0 {
            let k = top as i32;
            let idx = ops::argpartition_axis(&ops::negative(logprobs)?, k - 1, -1)?.index((.., ..k));
            let vals = logprobs.take_along_axis(&idx, -1)?;
            Some((idx, vals))
        } else {
            None
        };
        Ok(PendingLogprobs { chosen, top })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut v = vec![&self.chosen];
        if let Some((i, l)) = &self.top {
            v.push(i);
            v.push(l);
        }
        v
    }

    pub fn read(&self) -> Result<TokenLogprobs> {
        mlx_rs::transforms::eval(self.arrays())?;
        let logprob = self.chosen.as_dtype(Dtype::Float32)?.try_item_exact::<f32>().map_err(|e| Error::Mlx(e.to_string()))?;
        let mut top = Vec::new();
        if let Some((idx, vals)) = &self.top {
            let idx = idx.as_dtype(Dtype::Uint32)?;
            let vals = vals.as_dtype(Dtype::Float32)?;
            top = idx
                .as_slice::<u32>()
                .iter()
                .zip(vals.as_slice::<f32>())
                .map(|(&id, &logprob)| TopLogprob { id, logprob })
                .collect();
            top.sort_by(|a, b| b.logprob.total_cmp(&a.logprob).then(a.id.cmp(&b.id)));
        }
        Ok(TokenLogprobs { logprob, top })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_chosen_and_sorted_top() {
        let lp = Array::from_slice(&[-3.0f32, -0.5, -2.0, -1.0], &[1, 4]);
        let p = PendingLogprobs::new(&lp, &Array::from_slice(&[2u32], &[1]), 3).unwrap();
        let r = p.read().unwrap();
        assert_eq!(r.logprob, -2.0);
        assert_eq!(r.top.iter().map(|t| t.id).collect::<Vec<_>>(), [1, 3, 2]);
        assert_eq!(r.top[0].logprob, -0.5);
    }
}
