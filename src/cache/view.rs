//! The caches one forward step appends to, and what every layer of that step shares. A step
//! feeds each row some new tokens (`counts[i]`, at least one), right-aligned in an input of the
//! longest row's length: a decode step feeds one token per row, a prefill chunk n, a
//! verification 1 + k. Rows either sit on caches of their own, or in one stacked batch cache.
use mlx_rs::Array;

use super::{BatchKvCache, LayerCache, Mask, StackedStep};
use crate::error::{Error, Result};

pub enum CacheView<'a, 'c> {
    /// Independent rows, row `i` on the layer caches `rows[i]` (one row: a plain sequence).
    Rows(&'a mut [&'c mut [LayerCache]]),
    /// Rows stacked in one batch cache, in its row order.
    Stacked(&'a mut BatchKvCache),
}

/// What the layers of one step share, computed from the caches before the step (as mlx-lm does).
pub enum StepShape {
    Rows(RowsStep),
    Stacked(StackedStep),
}

pub struct RowsStep {
    /// Each row's new tokens; row `i`'s are the last `counts[i]` columns of the input.
    pub counts: Vec<i32>,
    /// Each row's position before the step.
    pub offsets: Vec<i32>,
    /// Per row, the mask of full-attention layers and of sliding-window ones (`None` where the
    /// model has no layer of that kind).
    pub masks: Vec<(Option<Mask>, Option<Mask>)>,
}

impl RowsStep {
    /// Row `i`'s mask for a layer of this kind.
    pub fn mask(&self, i: usize, sliding: bool) -> &Mask {
        let (full, window) = &self.masks[i];
        let m = if sliding { window } else { full };
        m.as_ref().expect("a mask exists for every kind of layer present")
    }

    /// The RoPE offset of each row's first input column ([B] int32): its position before the
    /// step, less the padding in front of its tokens.
    pub fn rope_offsets(&self, width: i32) -> Array {
        let o: Vec<i32> = self.offsets.iter().zip(&self.counts).map(|(&o, &n)| o - (width - n)).collect();
        Array::from_slice(&o, &[o.len() as i32])
    }
}

impl CacheView<'_, '_> {
    /// Starts a step feeding `counts[i]` tokens to row `i` (`width`: the longest). `full` and
    /// `window`: a full-attention layer's index and a sliding one's, with its window, if present.
    pub fn begin(&mut self, counts: &[i32], width: i32, full: Option<usize>, window: Option<(usize, usize)>) -> Result<StepShape> {
        let rows = match self {
            CacheView::Rows(rows) => rows.len(),
            CacheView::Stacked(stack) => stack.rows(),
        };
        if counts.len() != rows || counts.iter().any(|&n| n < 1 || n > width) || counts.iter().all(|&n| n < width) {
            return Err(Error::Internal(format!("a step of {rows} rows cannot feed {counts:?} tokens in {width} columns")));
        }
        match self {
            CacheView::Stacked(stack) => Ok(StepShape::Stacked(stack.begin_step(counts, width)?)),
            CacheView::Rows(rows) => {
                let masks = rows
                    .iter()
                    .zip(counts)
                    .map(|(c, &n)| {
                        let n = n as usize;
                        let full = full.map(|j| c[j].make_mask(n, None)).transpose()?;
                        let window = window.map(|(j, w)| c[j].make_mask(n, Some(w))).transpose()?;
                        Ok((full, window))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let offsets = rows.iter().map(|c| c.first().map_or(0, |c| c.offset() as i32)).collect();
                Ok(StepShape::Rows(RowsStep { counts: counts.to_vec(), offsets, masks }))
            }
        }
    }

    /// Every layer has appended this step's tokens.
    pub fn end(&mut self, shape: &StepShape) {
        if let (CacheView::Stacked(stack), StepShape::Stacked(step)) = (self, shape) {
            stack.end_step(step);
        }
    }

    /// The arrays to evaluate once a step's caches are all that is wanted of it (a prefill).
    pub fn state(&self) -> Vec<&Array> {
        match self {
            CacheView::Rows(rows) => rows.iter().flat_map(|r| r.iter().flat_map(LayerCache::state)).collect(),
            CacheView::Stacked(stack) => stack.state(),
        }
    }
}
