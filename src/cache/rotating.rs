//! The rotating KV cache of sliding-window layers, with mlx-lm's RotatingKVCache semantics: at
//! most `max_size` positions (plus the chunk being written), `keep` leading positions never
//! evicted, single-token writes rotate in place, multi-token writes re-order into temporal order
//! and trim. Once it has wrapped it cannot be trimmed. It can be quantized as a plain cache can
//! (mlx-bun converts sliding layers too; mlx-lm does not): the same moves, on quantized parts.
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};

use super::quantized::{Kv, KvQuant};
use crate::error::Result;

const STEP: i32 = 256;

/// Cloning is a cheap snapshot, as for `KvCache`.
#[derive(Clone)]
pub struct RotatingKvCache {
    keys: Option<Kv>,
    values: Option<Kv>,
    offset: i32,
    max_size: i32,
    keep: i32,
    idx: i32,
    scheme: Option<KvQuant>,
}

impl RotatingKvCache {
    pub fn new(max_size: usize, keep: usize) -> Self {
        RotatingKvCache { keys: None, values: None, offset: 0, max_size: max_size as i32, keep: keep as i32, idx: 0, scheme: None }
    }

    pub fn offset(&self) -> usize {
        self.offset as usize
    }

    pub fn max_size(&self) -> usize {
        self.max_size as usize
    }

    pub fn keep(&self) -> usize {
        self.keep as usize
    }

    pub fn quantization(&self) -> Option<KvQuant> {
        self.scheme
    }

    /// Quantizes what it holds, and every position written from now on.
    pub fn quantize(&mut self, q: KvQuant) -> Result<()> {
        for kv in [&mut self.keys, &mut self.values].into_iter().flatten() {
            *kv = kv.quantized(q)?;
        }
        self.scheme = Some(q);
        Ok(())
    }

    /// The positions held, in temporal order (what a saved cache keeps), if any.
    pub fn ordered(&self) -> Result<Option<(Kv, Kv)>> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) if self.offset > 0 => Ok(Some((self.temporal_order(k)?, self.temporal_order(v)?))),
            _ => Ok(None),
        }
    }

    /// A cache that has seen `offset` positions and holds the last of them, `keys`/`values`
    /// ([1, heads, L, dim], L ≤ offset), in temporal order: the state a multi-token write leaves.
    pub fn from_ordered(max_size: usize, keep: usize, keys: Array, values: Array, offset: usize) -> Self {
        let idx = keys.shape()[2];
        let (keys, values) = (Some(Kv::Plain(keys)), Some(Kv::Plain(values)));
        RotatingKvCache { keys, values, offset: offset as i32, max_size: max_size as i32, keep: keep as i32, idx, scheme: None }
    }

    /// Whether `trim` can still remove positions (not once the window has wrapped).
    pub fn is_trimmable(&self) -> bool {
        self.offset < self.max_size
    }

    /// Forgets the last `n` positions, while not wrapped (see `is_trimmable`); returns how many.
    pub fn trim(&mut self, n: usize) -> usize {
        if !self.is_trimmable() {
            return 0;
        }
        let n = (n as i32).min(self.offset);
        self.offset -= n;
        self.idx -= n;
        n as usize
    }

    pub fn state(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).flat_map(Kv::parts).collect()
    }

    pub fn update_and_fetch(&mut self, keys: Array, values: Array) -> Result<(Kv, Kv)> {
        let (keys, values) = (Kv::new(keys, self.scheme)?, Kv::new(values, self.scheme)?);
        if keys.len() == 1 {
            self.update_in_place(keys, values)
        } else {
            self.update_concat(keys, values)
        }
    }

    fn drop_oldest(&self, trim: i32, v: &Kv, append: Option<&Kv>) -> Result<Kv> {
        let mut parts = if trim > 0 { vec![v.cols(0..self.keep), v.cols(trim + self.keep..v.len())] } else { vec![v.clone()] };
        parts.extend(append.cloned());
        Kv::concat(&parts)
    }

    /// The cache in temporal order, unused room sliced off.
    fn temporal_order(&self, v: &Kv) -> Result<Kv> {
        let len = v.len();
        Ok(if self.idx == len {
            v.clone()
        } else if self.idx < self.offset {
            Kv::concat(&[v.cols(0..self.keep), v.cols(self.idx..len), v.cols(self.keep..self.idx)])?
        } else {
            v.cols(0..self.idx)
        })
    }

    fn update_concat(&mut self, keys: Kv, values: Kv) -> Result<(Kv, Kv)> {
        let n = keys.len();
        match (self.keys.take(), self.values.take()) {
            (Some(k), Some(v)) => {
                let k = self.temporal_order(&k)?;
                let v = self.temporal_order(&v)?;
                self.idx = k.len();
                // Keep max_size - 1 old positions so every new token sees a full window.
                let trim = self.idx - self.max_size + 1;
                self.keys = Some(self.drop_oldest(trim, &k, Some(&keys))?);
                self.values = Some(self.drop_oldest(trim, &v, Some(&values))?);
            }
            _ => {
                self.keys = Some(keys);
                self.values = Some(values);
            }
        }
        self.offset += n;
        let k = self.keys.clone().expect("set above");
        self.idx = k.len();
        Ok((k, self.values.clone().expect("set above")))
    }

    fn update_in_place(&mut self, keys: Kv, values: Kv) -> Result<(Kv, Kv)> {
        let prev = self.offset;
        let grow = match &self.keys {
            None => true,
            Some(k) => prev >= k.len() && k.len() < self.max_size,
        };
        if grow {
            let size = STEP.min(self.max_size - prev);
            let (nk, nv) = (keys.room(size)?, values.room(size)?);
            let (k, v) = match (self.keys.take(), self.values.take()) {
                (Some(k), Some(v)) => (Kv::concat(&[k, nk])?, Kv::concat(&[v, nv])?),
                _ => (nk, nv),
            };
            self.keys = Some(k);
            self.values = Some(v);
            self.idx = prev;
        }
        let len = self.keys.as_ref().expect("allocated above").len();
        let trim = len - self.max_size;
        if trim > 0 {
            let k = self.drop_oldest(trim, self.keys.as_ref().unwrap(), None)?;
            let v = self.drop_oldest(trim, self.values.as_ref().unwrap(), None)?;
            self.keys = Some(k);
            self.values = Some(v);
            self.idx = self.max_size;
        }
        if self.idx == self.max_size {
            self.idx = self.keep;
        }
        let (start, end) = (self.idx, self.idx + 1);
        self.keys.as_mut().unwrap().write(start..end, &keys)?;
        self.values.as_mut().unwrap().write(start..end, &values)?;
        self.offset += 1;
        self.idx += 1;
        let (k, v) = (self.keys.as_ref().unwrap(), self.values.as_ref().unwrap());
        if self.offset < k.len() {
            Ok((k.cols(0..self.offset), v.cols(0..self.offset)))
        } else {
            Ok((k.clone(), v.clone()))
        }
    }

    /// The attention mask for `n` new positions with a window of `window` (default: max_size),
    /// computed before the update, as mlx-lm does.
    pub fn make_mask(&self, n: usize, window: Option<usize>) -> Result<super::Mask> {
        let n = n as i32;
        let window = window.map_or(self.max_size, |w| w as i32);
        if n > 1 {
            let offset = (self.max_size - 1).min(self.offset);
            if offset + n > window {
                return Ok(super::Mask::Array(super::causal_mask(n, offset, Some(window))?));
            }
            return Ok(super::Mask::Causal);
        }
        if self.offset >= window && self.max_size > window {
            // A window smaller than the cache: mask the slots older than the window.
            let idx = if self.idx >= self.max_size { 0 } else { self.idx };
            let size = if self.offset < self.max_size { self.offset + 1 } else { self.max_size };
            let slots = ops::arange::<_, i32>(0, size, 1)?;
            let mask = slots.ge(Array::from_int(size - window))?;
            let shift = (idx + 1) % size;
            let rolled = ops::concatenate(&[mask.index((size - shift)..), mask.index(..(size - shift))], 0)?;
            return Ok(super::Mask::Array(rolled));
        }
        Ok(super::Mask::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(pos: std::ops::Range<i32>) -> Array {
        let vals: Vec<f32> = pos.map(|p| p as f32).collect();
        let n = vals.len() as i32;
        Array::from_slice(&vals, &[1, 1, n, 1])
    }

    fn positions(a: &Kv) -> Vec<f32> {
        let a = a.plain().unwrap();
        a.eval().unwrap();
        a.as_slice::<f32>().to_vec()
    }

    #[test]
    fn decode_rotates_within_max_size() {
        let mut c = RotatingKvCache::new(4, 0);
        c.update_and_fetch(kv(0..3), kv(0..3)).unwrap();
        let mut last = Vec::new();
        for p in 3..9 {
            let (k, _) = c.update_and_fetch(kv(p..p + 1), kv(p..p + 1)).unwrap();
            last = positions(&k);
        }
        // Slots hold the last 4 positions, rotated: 8 was written at slot (8 % 4).
        assert_eq!(last, [8.0, 5.0, 6.0, 7.0]);
        assert_eq!(c.offset(), 9);
        assert!(!c.is_trimmable());
    }

    #[test]
    fn prefill_chunk_keeps_window_minus_one_history() {
        let mut c = RotatingKvCache::new(4, 0);
        c.update_and_fetch(kv(0..5), kv(0..5)).unwrap();
        let (k, _) = c.update_and_fetch(kv(5..8), kv(5..8)).unwrap();
        // max_size - 1 = 3 old positions in temporal order, then the 3 new ones.
        assert_eq!(positions(&k), [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    }

    #[test]
    fn masks_follow_mlx_lm() {
        let mut c = RotatingKvCache::new(4, 0);
        assert!(matches!(c.make_mask(3, Some(4)).unwrap(), crate::cache::Mask::Causal));
        assert!(matches!(c.make_mask(5, Some(4)).unwrap(), crate::cache::Mask::Array(_)));
        c.update_and_fetch(kv(0..3), kv(0..3)).unwrap();
        assert!(matches!(c.make_mask(1, Some(4)).unwrap(), crate::cache::Mask::None));
    }
}
