//! The KV cache of full-attention layers: keys and values grow in steps of 256 positions, as in
//! mlx-lm's KVCache, so a decode step writes into preallocated room instead of concatenating.
//! Once quantized (`quantize`) it is mlx-lm's QuantizedKVCache: the same growth, each new
//! position quantized as it is written.
use mlx_rs::Array;

use super::quantized::{Kv, KvQuant};
use crate::error::Result;

const STEP: i32 = 256;

/// Cloning is a cheap snapshot: MLX arrays are shared until written, and a write to a shared
/// buffer copies it, so the snapshot keeps its contents.
#[derive(Default, Clone)]
pub struct KvCache {
    keys: Option<Kv>,
    values: Option<Kv>,
    offset: usize,
    scheme: Option<KvQuant>,
}

impl KvCache {
    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn quantization(&self) -> Option<KvQuant> {
        self.scheme
    }

    /// Appends `keys`/`values` ([B, heads, L, dim]) and returns everything cached so far.
    pub fn update_and_fetch(&mut self, keys: Array, values: Array) -> Result<(Kv, Kv)> {
        let (keys, values) = (Kv::new(keys, self.scheme)?, Kv::new(values, self.scheme)?);
        let prev = self.offset as i32;
        let l = keys.len();
        let capacity = self.keys.as_ref().map_or(0, Kv::len);
        if self.keys.is_none() || prev + l > capacity {
            let grow = |cur: Option<&Kv>, new: &Kv| -> Result<Kv> {
                let room = new.room((STEP + l - 1) / STEP * STEP)?;
                Ok(match cur {
                    None => room,
                    Some(c) => {
                        let c = if prev % STEP != 0 { c.cols(0..prev) } else { c.clone() };
                        Kv::concat(&[c, room])?
                    }
                })
            };
            self.keys = Some(grow(self.keys.as_ref(), &keys)?);
            self.values = Some(grow(self.values.as_ref(), &values)?);
        }
        let end = prev + l;
        let (k, v) = (self.keys.as_mut().unwrap(), self.values.as_mut().unwrap());
        k.write(prev..end, &keys)?;
        v.write(prev..end, &values)?;
        self.offset = end as usize;
        Ok((k.cols(0..end), v.cols(0..end)))
    }

    /// Quantizes what it holds, and every position written from now on (mlx-lm's
    /// `to_quantized`).
    pub fn quantize(&mut self, q: KvQuant) -> Result<()> {
        for kv in [&mut self.keys, &mut self.values].into_iter().flatten() {
            *kv = kv.quantized(q)?;
        }
        self.scheme = Some(q);
        Ok(())
    }

    /// A cache holding `keys`/`values` ([1, heads, L, dim]) as its L positions.
    pub fn from_contents(keys: Array, values: Array) -> Self {
        let offset = keys.shape()[2] as usize;
        KvCache { keys: Some(Kv::Plain(keys)), values: Some(Kv::Plain(values)), offset, scheme: None }
    }

    /// The keys and values of the positions cached so far, if any.
    pub fn contents(&self) -> Option<(Kv, Kv)> {
        let end = self.offset as i32;
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) if end > 0 => Some((k.cols(0..end), v.cols(0..end))),
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
        self.keys.iter().chain(self.values.iter()).flat_map(Kv::parts).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops;
    use mlx_rs::ops::indexing::IndexOp;

    #[test]
    fn grows_in_steps_and_returns_all_positions() {
        let mut c = KvCache::default();
        let kv = |l: i32, v: f32| ops::full::<f32>(&[1, 2, l, 4], Array::from_f32(v)).unwrap();
        let (k, _) = c.update_and_fetch(kv(3, 1.0), kv(3, 1.0)).unwrap();
        assert_eq!(k.plain().unwrap().shape(), &[1, 2, 3, 4]);
        assert_eq!(c.keys.as_ref().unwrap().len(), 256);
        let (k, v) = c.update_and_fetch(kv(300, 2.0), kv(300, 3.0)).unwrap();
        let (k, v) = (k.plain().unwrap().clone(), v.plain().unwrap().clone());
        assert_eq!(k.shape(), &[1, 2, 303, 4]);
        assert_eq!(c.offset(), 303);
        let k0: f32 = k.index((0, 0, 2, 0)).item_exact();
        let k1: f32 = k.index((0, 0, 302, 0)).item_exact();
        let v1: f32 = v.index((0, 1, 3, 3)).item_exact();
        assert_eq!((k0, k1, v1), (1.0, 2.0, 3.0));
    }
}
