//! KV caches (plain, rotating, quantized, stacked), the attention masks that go with them, the
//! view one forward step writes through, and the prefix cache.
mod batch;
pub mod file;
mod kv;
mod prefix;
mod quantized;
mod recurrent;
mod rotating;
mod view;

pub use batch::{BatchKvCache, RowSpan, StackedAttention, StackedStep};
pub use view::{CacheView, RowsStep, StepShape};
pub use kv::KvCache;
pub use prefix::{PrefixCache, PrefixHit, PrefixStats};
pub use quantized::{attention, Kv, KvPolicy, KvQuant, KvQuantOptions};
pub use recurrent::RecurrentCache;
pub use rotating::RotatingKvCache;

use mlx_rs::fast::ScaledDotProductAttentionMask;
use mlx_rs::{ops, Array};

use crate::error::{Error, Result};

/// The mask one attention call needs.
pub enum Mask {
    None,
    /// Causal, aligned to the end of the keys (MLX's fused mode).
    Causal,
    /// Explicit boolean mask (true = attend).
    Array(Array),
}

impl Mask {
    pub fn sdpa(&self) -> Option<ScaledDotProductAttentionMask<'_>> {
        match self {
            Mask::None => None,
            Mask::Causal => Some(ScaledDotProductAttentionMask::Causal),
            Mask::Array(a) => Some(ScaledDotProductAttentionMask::Array(a)),
        }
    }
}

/// mlx-lm's create_causal_mask: [n, offset+n], query i (at offset+i) sees key j when
/// j <= offset+i and, with a window, offset+i < j + window.
pub fn causal_mask(n: i32, offset: i32, window: Option<i32>) -> Result<Array> {
    let rows = ops::arange::<_, i32>(offset, offset + n, 1)?.reshape(&[n, 1])?;
    let cols = ops::arange::<_, i32>(0, offset + n, 1)?.reshape(&[1, offset + n])?;
    let mut mask = rows.ge(&cols)?;
    if let Some(w) = window {
        mask = ops::logical_and(&mask, &rows.lt(&ops::add(&cols, Array::from_int(w))?)?)?;
    }
    Ok(mask)
}

/// A layer's cache: plain for full attention, rotating for sliding-window attention, recurrent
/// for linear attention. Cloning one is a snapshot (no copy until either side is written).
#[derive(Clone)]
pub enum LayerCache {
    Plain(KvCache),
    Rotating(RotatingKvCache),
    Recurrent(RecurrentCache),
}

impl LayerCache {
    pub fn offset(&self) -> usize {
        match self {
            LayerCache::Plain(c) => c.offset(),
            LayerCache::Rotating(c) => c.offset(),
            LayerCache::Recurrent(c) => c.offset(),
        }
    }

    pub fn update_and_fetch(&mut self, keys: Array, values: Array) -> Result<(Kv, Kv)> {
        match self {
            LayerCache::Plain(c) => c.update_and_fetch(keys, values),
            LayerCache::Rotating(c) => c.update_and_fetch(keys, values),
            LayerCache::Recurrent(_) => Err(Error::Internal("a linear-attention layer's cache was given keys and values".into())),
        }
    }

    /// How it is quantized, if it is.
    pub fn quantization(&self) -> Option<KvQuant> {
        match self {
            LayerCache::Plain(c) => c.quantization(),
            LayerCache::Rotating(c) => c.quantization(),
            LayerCache::Recurrent(_) => None,
        }
    }

    /// Quantizes what it holds and every position written from now on. A recurrent state is
    /// no KV cache and stays as it is (as in mlx-lm, whose `ArraysCache` has no quantized form).
    pub fn quantize(&mut self, q: KvQuant) -> Result<()> {
        match self {
            LayerCache::Plain(c) => c.quantize(q),
            LayerCache::Rotating(c) => c.quantize(q),
            LayerCache::Recurrent(_) => Ok(()),
        }
    }

    pub fn state(&self) -> Vec<&Array> {
        match self {
            LayerCache::Plain(c) => c.state(),
            LayerCache::Rotating(c) => c.state(),
            LayerCache::Recurrent(c) => c.state(),
        }
    }

    /// Whether `trim` can remove positions: a rotating cache that has wrapped has overwritten
    /// the positions before its window, so it cannot go back; a recurrent one never can.
    pub fn is_trimmable(&self) -> bool {
        match self {
            LayerCache::Plain(_) => true,
            LayerCache::Rotating(c) => c.is_trimmable(),
            LayerCache::Recurrent(_) => false,
        }
    }

    /// Whether, after `n` more positions, the last of them could still be forgotten (a sliding
    /// window cache cannot once it wraps).
    pub fn trimmable_after(&self, n: usize) -> bool {
        match self {
            LayerCache::Plain(_) => true,
            LayerCache::Rotating(c) => c.offset() + n < c.max_size(),
            LayerCache::Recurrent(_) => false,
        }
    }

    /// Forgets the last `n` positions; returns how many it could.
    pub fn trim(&mut self, n: usize) -> usize {
        match self {
            LayerCache::Plain(c) => c.trim(n),
            LayerCache::Rotating(c) => c.trim(n),
            LayerCache::Recurrent(_) => 0,
        }
    }

    /// Bytes of the buffers held (room allocated ahead included).
    pub fn nbytes(&self) -> usize {
        self.state().iter().map(|a| a.nbytes()).sum()
    }

    /// The mask for `n` new positions, computed before they are added (as mlx-lm does).
    pub fn make_mask(&self, n: usize, window: Option<usize>) -> Result<Mask> {
        match self {
            LayerCache::Plain(c) => match window {
                Some(w) => Ok(Mask::Array(causal_mask(n as i32, c.offset() as i32, Some(w as i32))?)),
                None if n == 1 => Ok(Mask::None),
                None => Ok(Mask::Causal),
            },
            LayerCache::Rotating(c) => c.make_mask(n, window),
            LayerCache::Recurrent(_) => Err(Error::Internal("a linear-attention layer has no attention mask".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_mask_with_offset_and_window() {
        let m = causal_mask(2, 3, Some(2)).unwrap();
        m.eval().unwrap();
        let v: Vec<bool> = m.as_slice::<bool>().to_vec();
        // query at 3 sees {2, 3}; query at 4 sees {3, 4}
        assert_eq!(v, [false, false, true, true, false, false, false, false, true, true]);
    }
}
