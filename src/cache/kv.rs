//! The plain KV cache: keys and values grow in steps of 256 positions, as in mlx-lm's KVCache, so
//! a decode step writes into preallocated room instead of concatenating.
use mlx_rs::ops::indexing::{Ellipsis, IndexOp, TryIndexMutOp};
use mlx_rs::{ops, Array};

use crate::error::Result;

const STEP: i32 = 256;

/// Cloning is a cheap snapshot: MLX arrays are shared until written, and a write to a shared
/// buffer copies it, so the snapshot keeps its contents.
#[derive(Default, Clone)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
}

impl KvCache {
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Appends `keys`/`values` ([B, heads, L, dim]) and returns everything cached so far.
    pub fn update_and_fetch(&mut self, keys: Array, values: Array) -> Result<(Array, Array)> {
        let prev = self.offset as i32;
        let l = keys.shape()[2];
        let capacity = self.keys.as_ref().map_or(0, |k| k.shape()[2]);
        if self.keys.is_none() || prev + l > capacity {
            let grow = |cur: Option<&Array>, new: &Array| -> Result<Array> {
                let s = new.shape();
                let steps = (STEP + l - 1) / STEP;
                let room = ops::zeros_dtype(&[s[0], s[1], steps * STEP, s[3]], new.dtype())?;
                Ok(match cur {
                    None => room,
                    Some(c) => {
                        let c = if prev % STEP != 0 { c.index((Ellipsis, ..prev, ..)) } else { c.clone() };
                        ops::concatenate(&[c, room], 2)?
                    }
                })
            };
            self.keys = Some(grow(self.keys.as_ref(), &keys)?);
            self.values = Some(grow(self.values.as_ref(), &values)?);
        }
        let end = prev + l;
        let (k, v) = (self.keys.as_mut().unwrap(), self.values.as_mut().unwrap());
        k.try_index_mut((Ellipsis, prev..end, ..), &keys)?;
        v.try_index_mut((Ellipsis, prev..end, ..), &values)?;
        self.offset = end as usize;
        Ok((k.index((Ellipsis, ..end, ..)), v.index((Ellipsis, ..end, ..))))
    }

    /// A cache holding `keys`/`values` ([1, heads, L, dim]) as its L positions.
    pub fn from_contents(keys: Array, values: Array) -> Self {
        let offset = keys.shape()[2] as usize;
        KvCache { keys: Some(keys), values: Some(values), offset }
    }

    /// The keys and values of the positions cached so far, if any.
    pub fn contents(&self) -> Option<(Array, Array)> {
        let end = self.offset as i32;
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) if end > 0 => Some((k.index((Ellipsis, ..end, ..)), v.index((Ellipsis, ..end, ..)))),
            _ => None,
        }
    }

    /// Forgets the last `n` positions (at most all of them); returns how many.
    pub fn trim(&mut self, n: usize) -> usize {
        let n = n.min(self.offset);
        self.offset -= n;
        n
    }

    /// The arrays to evaluate after a prefill chunk.
    pub fn state(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_in_steps_and_returns_all_positions() {
        let mut c = KvCache::default();
        let kv = |l: i32, v: f32| ops::full::<f32>(&[1, 2, l, 4], Array::from_f32(v)).unwrap();
        let (k, _) = c.update_and_fetch(kv(3, 1.0), kv(3, 1.0)).unwrap();
        assert_eq!(k.shape(), &[1, 2, 3, 4]);
        assert_eq!(c.keys.as_ref().unwrap().shape()[2], 256);
        let (k, v) = c.update_and_fetch(kv(300, 2.0), kv(300, 3.0)).unwrap();
        assert_eq!(k.shape(), &[1, 2, 303, 4]);
        assert_eq!(c.offset(), 303);
        let k0: f32 = k.index((0, 0, 2, 0)).item_exact();
        let k1: f32 = k.index((0, 0, 302, 0)).item_exact();
        let v1: f32 = v.index((0, 1, 3, 3)).item_exact();
        assert_eq!((k0, k1, v1), (1.0, 2.0, 3.0));
    }
}
