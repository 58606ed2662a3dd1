//! The KV caches of several sequences of one model stacked into one array per layer, so that a
//! batched step appends every row's keys and values with one write, as mlx-lm's BatchKVCache
//! does. Rows are left padded: row i holds its positions in the
//! last `lens[i]` of the `width` columns in use, and attends over those only.
use std::collections::{HashMap, HashSet};

use mlx_rs::ops::indexing::{Ellipsis, IndexOp, TryIndexMutOp};
use mlx_rs::{ops, Array};

use super::{KvCache, LayerCache, Mask};
use crate::error::{Error, Result};

/// Columns are added 256 at a time, as in mlx-lm's caches.
const STEP: i32 = 256;

/// One row's keys and values per layer ([1, heads, len, dim]); `None` while it has no position.
type RowKv = Vec<Option<(Array, Array)>>;

#[derive(Default)]
pub struct BatchKvCache {
    ids: Vec<u64>,
    lens: Vec<i32>,
    width: i32,
    n_layers: usize,
    /// Keys and values per layer, [rows, heads, capacity, dim]; empty while no row has a position.
    layers: Vec<(Array, Array)>,
    /// Rows that sat out a step, their caches taken out until they step again.
    parked: HashMap<u64, Vec<LayerCache>>,
    /// Stacked rows whose generation has ended, dropped at the next rearrangement.
    gone: HashSet<u64>,
    /// After a step whose rows fed different numbers of tokens: the first column it wrote and
    /// each row's padding there. Those columns hold no position of the row; the stack is
    /// compacted before anything else reads or extends it.
    ragged: Option<(i32, Vec<i32>)>,
}

/// What every layer of one stacked step shares.
pub struct StackedStep {
    /// The RoPE offset of each row's first input column ([rows] int32): its position count, less
    /// the padding in front of its tokens.
    pub offsets: Array,
    pub attention: StackedAttention,
    /// The width before the step: its tokens take the columns from here.
    pub before: i32,
    counts: Vec<i32>,
    columns: i32,
}

pub enum StackedAttention {
    /// Every row in one call, with this mask: one token for rows of one length, whose attention is
    /// then each row's own computation.
    Batched(Mask),
    /// Row by row, each over its own columns, as it attends alone. A padded batch attending in one
    /// call is not bit-identical to its rows alone on every CPU: the BLAS kernels split the
    /// padded reduction differently (exact up to 320 columns on an AMD EPYC's OpenBLAS kernels;
    /// off by 5e-5 from 16 columns on an Intel Sapphire Rapids' AVX-512 ones).
    Rows(Vec<RowSpan>),
}

/// Row `i`'s part of a row-by-row step: its first column, and the padding in front of its new
/// tokens (their columns come after `StackedStep::before + pad`).
pub struct RowSpan {
    pub start: i32,
    pub pad: i32,
}

impl BatchKvCache {
    /// Positions held for row `id`, stacked or parked.
    pub fn len_of(&self, id: u64) -> Option<usize> {
        match self.ids.iter().position(|&r| r == id) {
            Some(i) => Some(self.lens[i] as usize),
            None => self.parked.get(&id).map(|c| c.first().map_or(0, LayerCache::offset)),
        }
    }

    /// Sets the rows of the next step, in this order: a row joining brings its own caches
    /// (`Some`); `None` for a row already here, stacked or parked. Rows left out are parked with
    /// their caches, or dropped if their generation has ended.
    pub fn arrange(&mut self, rows: Vec<(u64, Option<Vec<LayerCache>>)>) -> Result<()> {
        let same = rows.iter().all(|(_, c)| c.is_none()) && rows.iter().map(|(id, _)| *id).eq(self.ids.iter().copied());
        if same && self.ragged.is_none() {
            return Ok(());
        }
        if let Some((_, Some(c))) = rows.iter().find(|(_, c)| c.is_some()) {
            self.n_layers = c.len();
        }
        let mut stacked: HashMap<u64, RowKv> = (0..self.ids.len()).map(|i| Ok((self.ids[i], self.row(i)?))).collect::<Result<_>>()?;
        let mut next = Vec::with_capacity(rows.len());
        for (id, caches) in rows {
            let kv = match (caches, stacked.remove(&id)) {
                (Some(c), _) => row_kv(&c)?,
                (None, Some(kv)) => kv,
                (None, None) => {
                    let parked = self.parked.remove(&id).ok_or_else(|| Error::Mlx(format!("batch row {id} has no cache")))?;
                    row_kv(&parked)?
                }
            };
            next.push((id, kv));
        }
        for (id, kv) in stacked {
            if !self.gone.remove(&id) {
                let caches: Vec<LayerCache> = kv.into_iter().map(own_row).collect::<Result<_>>()?;
                // Copied now, as `take_ended` does: a lazy copy would keep this whole stack alive
                // for as long as the row stays parked, or its caches stay in the prefix cache.
                mlx_rs::transforms::eval(caches.iter().flat_map(LayerCache::state))?;
                self.parked.insert(id, caches);
            }
        }
        self.rebuild(next)
    }

    /// Takes row `id` out of the batch, with its caches.
    pub fn take(&mut self, id: u64) -> Result<Vec<LayerCache>> {
        if self.ids.contains(&id) {
            let rest = self.ids.iter().filter(|&&r| r != id).map(|&r| (r, None)).collect();
            self.arrange(rest)?;
        }
        self.parked.remove(&id).ok_or_else(|| Error::Mlx(format!("batch row {id} has no cache")))
    }

    /// The first `n` positions of row `id`, as caches of its own (copied; a parked row's are
    /// snapshots, trimmed).
    pub fn row_prefix(&mut self, id: u64, n: usize) -> Result<Option<Vec<LayerCache>>> {
        self.compact()?;
        let Some(i) = self.ids.iter().position(|&r| r == id) else {
            let Some(parked) = self.parked.get(&id) else { return Ok(None) };
            let mut caches = parked.clone();
            for c in &mut caches {
                let extra = c.offset().saturating_sub(n);
                c.trim(extra);
            }
            return Ok(Some(caches));
        };
        let (len, w, r, n) = (self.lens[i], self.width, i as i32, n as i32);
        if n > len || self.layers.is_empty() {
            return Ok(None);
        }
        let cols = |t: &Array| t.index((r..r + 1, .., w - len..w - len + n, ..));
        let caches = self.layers.iter().map(|(k, v)| own_row(Some((cols(k), cols(v))))).collect::<Result<Vec<_>>>()?;
        mlx_rs::transforms::eval(caches.iter().flat_map(LayerCache::state))?;
        Ok(Some(caches))
    }

    /// Row `id`'s generation has ended and keeps its positions (for the prefix cache): its caches
    /// leave the batch, copied out of the stack if stacked (the stack itself is rearranged
    /// later, as for `forget`).
    pub fn take_ended(&mut self, id: u64) -> Result<Vec<LayerCache>> {
        let Some(i) = self.ids.iter().position(|&r| r == id) else {
            return self.parked.remove(&id).ok_or_else(|| Error::Mlx(format!("batch row {id} has no cache")));
        };
        self.gone.insert(id);
        let caches = self.row(i)?.into_iter().map(own_row).collect::<Result<Vec<_>>>()?;
        // Evaluated now, so that no lazy copy holds the stack's arrays (which would make the next
        // step's in-place writes copy them).
        mlx_rs::transforms::eval(caches.iter().flat_map(LayerCache::state))?;
        Ok(caches)
    }

    /// Row `id`'s generation has ended: its caches go now if parked, else at the next arrangement.
    pub fn forget(&mut self, id: u64) {
        if self.parked.remove(&id).is_none() && self.ids.contains(&id) {
            self.gone.insert(id);
        }
    }

    /// The rows stacked now.
    pub fn rows(&self) -> usize {
        self.ids.len()
    }

    /// Starts a step feeding `counts[i]` new tokens to row `i`, right-aligned in `columns`.
    pub fn begin_step(&mut self, counts: &[i32], columns: i32) -> Result<StackedStep> {
        self.compact()?;
        let n = self.lens.len() as i32;
        let w = self.width;
        let offsets: Vec<i32> = self.lens.iter().zip(counts).map(|(&len, &c)| len - (columns - c)).collect();
        let starts: Vec<i32> = self.lens.iter().map(|&l| w - l).collect();
        let attention = if columns == 1 && starts.iter().all(|&s| s == 0) {
            StackedAttention::Batched(Mask::None)
        } else {
            StackedAttention::Rows(starts.iter().zip(counts).map(|(&start, &c)| RowSpan { start, pad: columns - c }).collect())
        };
        Ok(StackedStep { offsets: Array::from_slice(&offsets, &[n]), attention, before: w, counts: counts.to_vec(), columns })
    }

    /// Appends `keys`/`values` ([rows, heads, L, dim]) at `layer`; returns the columns in use.
    pub fn update_and_fetch(&mut self, layer: usize, keys: Array, values: Array) -> Result<(Array, Array)> {
        let l = keys.shape()[2];
        let room = |like: &Array, n: i32| -> Result<Array> {
            let s = like.shape();
            Ok(ops::zeros_dtype(&[s[0], s[1], n, s[3]], like.dtype())?)
        };
        let w = self.width;
        if self.layers.len() == layer {
            let cap = ((w + l) / STEP + 1) * STEP;
            self.layers.push((room(&keys, cap)?, room(&values, cap)?));
        }
        let (k, v) = &mut self.layers[layer];
        if w + l > k.shape()[2] {
            let more = ((w + l - k.shape()[2]) / STEP + 1) * STEP;
            *k = ops::concatenate(&[k.clone(), room(k, more)?], 2)?;
            *v = ops::concatenate(&[v.clone(), room(v, more)?], 2)?;
        }
        k.try_index_mut((Ellipsis, w..w + l, ..), &keys)?;
        v.try_index_mut((Ellipsis, w..w + l, ..), &values)?;
        Ok((k.index((Ellipsis, ..w + l, ..)), v.index((Ellipsis, ..w + l, ..))))
    }

    /// Every layer has appended this step's tokens.
    pub fn end_step(&mut self, step: &StackedStep) {
        self.width += step.columns;
        self.lens.iter_mut().zip(&step.counts).for_each(|(l, &c)| *l += c);
        let pads: Vec<i32> = step.counts.iter().map(|&c| step.columns - c).collect();
        if pads.iter().any(|&p| p > 0) {
            self.ragged = Some((step.before, pads));
        }
    }

    /// The arrays a step writes.
    pub fn state(&self) -> Vec<&Array> {
        self.layers.iter().flat_map(|(k, v)| [k, v]).collect()
    }

    /// Removes the padding a ragged step left (see `ragged`).
    fn compact(&mut self) -> Result<()> {
        if self.ragged.is_none() {
            return Ok(());
        }
        let rows = (0..self.ids.len()).map(|i| Ok((self.ids[i], self.row(i)?))).collect::<Result<Vec<_>>>()?;
        self.rebuild(rows)
    }

    /// Row `i`'s positions, per layer (views of the stack, unless padding must be cut out).
    fn row(&self, i: usize) -> Result<RowKv> {
        let (len, w, r) = (self.lens[i], self.width, i as i32);
        if self.layers.is_empty() || len == 0 {
            return Ok(vec![None; self.n_layers]);
        }
        let cols = |t: &Array| -> Result<Array> {
            Ok(match &self.ragged {
                Some((gap, pads)) if pads[i] > 0 => {
                    let start = w - len - pads[i];
                    ops::concatenate(&[t.index((r..r + 1, .., start..*gap, ..)), t.index((r..r + 1, .., gap + pads[i]..w, ..))], 2)?
                }
                _ => t.index((r..r + 1, .., w - len..w, ..)),
            })
        };
        self.layers.iter().map(|(k, v)| Ok(Some((cols(k)?, cols(v)?)))).collect()
    }

    /// Stacks `rows` anew, each left padded to the longest, with room for the next column.
    fn rebuild(&mut self, rows: Vec<(u64, RowKv)>) -> Result<()> {
        self.ragged = None;
        let len = |kv: &RowKv| kv.iter().flatten().next().map_or(0, |(k, _)| k.shape()[2]);
        self.lens = rows.iter().map(|(_, kv)| len(kv)).collect();
        self.ids = rows.iter().map(|(id, _)| *id).collect();
        self.width = self.lens.iter().copied().max().unwrap_or(0);
        self.layers.clear();
        if self.width == 0 {
            return Ok(());
        }
        let cap = (self.width / STEP + 1) * STEP;
        for j in 0..self.n_layers {
            let stack = |pick: fn(&(Array, Array)) -> &Array| -> Result<Array> {
                let like = rows.iter().find_map(|(_, kv)| kv[j].as_ref()).map(pick).expect("width > 0");
                let (h, d) = (like.shape()[1], like.shape()[3]);
                let zeros = |n: i32| ops::zeros_dtype(&[1, h, n, d], like.dtype());
                let padded = rows
                    .iter()
                    .zip(&self.lens)
                    .map(|((_, kv), &len)| {
                        let mut parts = Vec::with_capacity(3);
                        if len < self.width {
                            parts.push(zeros(self.width - len)?);
                        }
                        parts.extend(kv[j].as_ref().map(|kv| pick(kv).clone()));
                        parts.push(zeros(cap - self.width)?);
                        Ok(ops::concatenate(&parts, 2)?)
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(ops::concatenate(&padded, 0)?)
            };
            self.layers.push((stack(|kv| &kv.0)?, stack(|kv| &kv.1)?));
        }
        Ok(())
    }
}

/// A stacked row's layer as a cache of its own: copied out, so that it does not keep the stack
/// alive.
fn own_row(kv: Option<(Array, Array)>) -> Result<LayerCache> {
    Ok(LayerCache::Plain(match kv {
        Some((k, v)) => KvCache::from_contents(k.contiguous()?, v.contiguous()?),
        None => KvCache::default(),
    }))
}

/// A generation's own caches as a stacked row; only plain caches stack.
fn row_kv(caches: &[LayerCache]) -> Result<RowKv> {
    caches
        .iter()
        .map(|c| match c {
            LayerCache::Plain(c) if c.quantization().is_none() => Ok(c.contents().map(|(k, v)| (k.plain().expect("plain").clone(), v.plain().expect("plain").clone()))),
            LayerCache::Plain(_) => Err(Error::Internal("quantized caches do not stack".into())),
            LayerCache::Rotating(_) => Err(Error::Mlx("sliding-window caches do not stack".into())),
            LayerCache::Recurrent(_) => Err(Error::Mlx("recurrent caches do not stack".into())),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own(len: i32, value: f32) -> Vec<LayerCache> {
        let kv = || ops::full::<f32>(&[1, 2, len, 4], Array::from_f32(value)).unwrap();
        vec![LayerCache::Plain(KvCache::from_contents(kv(), kv()))]
    }

    #[test]
    fn rows_join_step_sit_out_and_leave_with_their_positions() {
        let mut b = BatchKvCache::default();
        b.arrange(vec![(1, Some(own(3, 1.0))), (2, Some(own(5, 2.0)))]).unwrap();
        let step = b.begin_step(&[1, 1], 1).unwrap();
        let StackedAttention::Rows(spans) = &step.attention else { panic!("rows of different lengths attend row by row") };
        assert_eq!(spans.iter().map(|s| (s.start, s.pad)).collect::<Vec<_>>(), [(2, 0), (0, 0)]);
        let new = ops::full::<f32>(&[2, 2, 1, 4], Array::from_f32(9.0)).unwrap();
        let (k, _) = b.update_and_fetch(0, new.clone(), new).unwrap();
        b.end_step(&step);
        assert_eq!(k.shape(), &[2, 2, 6, 4]);
        assert_eq!((b.len_of(1), b.len_of(2)), (Some(4), Some(6)));
        // Row 1 sits out the next step: parked with its four positions, padding dropped.
        b.arrange(vec![(2, None)]).unwrap();
        let parked = b.take(1).unwrap();
        let LayerCache::Plain(c) = &parked[0] else { panic!() };
        let (k, _) = c.contents().unwrap();
        let k = k.plain().unwrap();
        let got: Vec<f32> = (0..4).map(|i| k.index((0, 0, i, 0)).item_exact()).collect();
        assert_eq!(got, [1.0, 1.0, 1.0, 9.0]);
        // The first positions of a stacked row, copied out; an ended row's caches, copied out.
        let head = b.row_prefix(2, 2).unwrap().unwrap();
        let LayerCache::Plain(c) = &head[0] else { panic!() };
        assert_eq!(c.offset(), 2);
        let ended = b.take_ended(2).unwrap();
        let LayerCache::Plain(c) = &ended[0] else { panic!() };
        let (k, _) = c.contents().unwrap();
        let k = k.plain().unwrap();
        let got: Vec<f32> = (0..6).map(|i| k.index((0, 0, i, 0)).item_exact()).collect();
        assert_eq!(got, [2.0, 2.0, 2.0, 2.0, 2.0, 9.0]);
        // A forgotten stacked row is dropped at the next arrangement, not parked.
        b.forget(2);
        b.arrange(vec![(3, Some(own(2, 3.0)))]).unwrap();
        assert_eq!((b.len_of(2), b.len_of(3)), (None, Some(2)));
    }
}
