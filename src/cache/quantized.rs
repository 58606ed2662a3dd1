//! Quantized KV caches, as mlx-lm's QuantizedKVCache: keys and values are stored MLX-affine
//! quantized along the head dimension (packed words, scales, biases), and attention multiplies
//! the queries against them with `quantized_matmul` instead of dequantizing (mlx-lm's
//! `quantized_scaled_dot_product_attention`). A cache starts plain and is converted once it holds
//! `start` positions (`KvPolicy::quantize_due`), which is when mlx-lm converts it too.
use mlx_rs::ops::indexing::{Ellipsis, IndexOp};
use mlx_rs::{fast, ops, Array, Dtype};

use super::{LayerCache, Mask};
use crate::error::{Error, Result};
use crate::mlx::kernels;

/// How one layer's cache is quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvQuant {
    pub bits: i32,
    pub group_size: i32,
}

/// Keys or values as a cache stores them, [B, heads, positions, ·]: every operation on positions
/// (axis 2) applies alike to each stored part.
#[derive(Clone)]
pub enum Kv {
    Plain(Array),
    /// Packed words, scales and biases of the head dimension.
    Quantized([Array; 3], KvQuant),
}

impl Kv {
    /// New keys or values, quantized when the cache is.
    pub fn new(x: Array, scheme: Option<KvQuant>) -> Result<Kv> {
        match scheme {
            None => Ok(Kv::Plain(x)),
            Some(q) => {
                let (w, scales, biases) = ops::quantize(&x, q.group_size, q.bits)?;
                Ok(Kv::Quantized([w, scales, biases], q))
            }
        }
    }

    pub fn parts(&self) -> &[Array] {
        match self {
            Kv::Plain(a) => std::slice::from_ref(a),
            Kv::Quantized(p, _) => p,
        }
    }

    /// Positions (capacity included).
    pub fn len(&self) -> i32 {
        self.parts()[0].shape()[2]
    }

    pub fn plain(&self) -> Option<&Array> {
        match self {
            Kv::Plain(a) => Some(a),
            Kv::Quantized(..) => None,
        }
    }

    /// `f` applied to every part.
    pub fn map(&self, f: impl Fn(&Array) -> Result<Array>) -> Result<Kv> {
        Ok(match self {
            Kv::Plain(a) => Kv::Plain(f(a)?),
            Kv::Quantized([w, s, b], q) => Kv::Quantized([f(w)?, f(s)?, f(b)?], *q),
        })
    }

    /// Positions `range` of every part.
    pub fn cols(&self, range: std::ops::Range<i32>) -> Kv {
        self.map(|a| Ok(a.index((Ellipsis, range.clone(), ..)))).expect("indexing does not fail")
    }

    /// `n` zeroed positions shaped as these.
    pub fn room(&self, n: i32) -> Result<Kv> {
        self.map(|a| {
            let s = a.shape();
            Ok(ops::zeros_dtype(&[s[0], s[1], n, s[3]], a.dtype())?)
        })
    }

    /// The parts of `kvs` (all stored alike) joined along the positions.
    pub fn concat(kvs: &[Kv]) -> Result<Kv> {
        let first = kvs.first().ok_or_else(|| Error::Internal("nothing to concatenate".into()))?;
        let part = |i: usize| -> Result<Array> {
            let arrays: Vec<&Array> = kvs.iter().map(|k| &k.parts()[i]).collect();
            Ok(ops::concatenate(&arrays, 2)?)
        };
        Ok(match first {
            Kv::Plain(_) => Kv::Plain(part(0)?),
            Kv::Quantized(_, q) => Kv::Quantized([part(0)?, part(1)?, part(2)?], *q),
        })
    }

    /// Writes `new` (stored alike) at positions `range`.
    pub fn write(&mut self, range: std::ops::Range<i32>, new: &Kv) -> Result<()> {
        let parts: &mut [Array] = match self {
            Kv::Plain(a) => std::slice::from_mut(a),
            Kv::Quantized(p, _) => p,
        };
        for (dst, src) in parts.iter_mut().zip(new.parts()) {
            // Positions are the second-to-last axis (of the values and of their scales).
            let axis = dst.ndim().checked_sub(2).ok_or_else(|| Error::Internal(format!("a cache part of shape {:?} has no positions axis", dst.shape())))?;
            let (mut start, mut stop) = (vec![0; dst.ndim()], dst.shape().to_vec());
            (start[axis], stop[axis]) = (range.start, range.end);
            *dst = crate::mlx::ops::slice_update(dst, src, &start, &stop)?;
        }
        Ok(())
    }

    /// These plain keys or values quantized (a conversion quantizes the room allocated ahead
    /// too, as mlx-lm's `to_quantized` does: each position is quantized on its own, so the
    /// positions in use come out the same).
    pub fn quantized(&self, q: KvQuant) -> Result<Kv> {
        match self {
            Kv::Plain(a) => Kv::new(a.clone(), Some(q)),
            Kv::Quantized(..) => Ok(self.clone()),
        }
    }
}

/// Attention of `q` [B, heads, L, dim] over cached keys and values: MLX's fused kernel for plain
/// ones, mlx-lm's quantized attention (scores and output through `quantized_matmul`, a precise
/// softmax between) for quantized ones. `factored`: a decode step's products in fused
/// multiply-adds (`kernels::sdpa_rows`, the opt-in `f32Matmuls: 'all'`; only where
/// `kernels::fma_kernels`).
pub fn attention(q: &Array, keys: &Kv, values: &Kv, scale: f32, mask: &Mask, factored: bool) -> Result<Array> {
    let (k, v, scheme) = match (keys, values) {
        (Kv::Plain(k), Kv::Plain(v)) => {
            // One query position sees every key whether the mask is causal or none (MLX's causal
            // fallback selects every score), so our one-node kernel gives the same numbers.
            if matches!(mask, Mask::None | Mask::Causal) && kernels::sdpa_rows_fits(q, k, v) {
                return Ok(kernels::sdpa_rows(q, k, v, scale, factored)?);
            }
            return Ok(fast::scaled_dot_product_attention(q, k, v, scale, mask.sdpa(), None)?);
        }
        (Kv::Quantized(k, scheme), Kv::Quantized(v, _)) => (k, v, *scheme),
        _ => return Err(Error::Internal("keys and values stored differently".into())),
    };
    let s = q.shape();
    let (b, heads, l, dim) = (s[0], s[1], s[2], s[3]);
    let kv_heads = k[0].shape()[1];
    let repeats = heads / kv_heads;
    let mut q = ops::multiply(q, Array::from_f32(scale).as_dtype(q.dtype())?)?;
    let grouped = |parts: &[Array; 3]| -> Result<Vec<Array>> {
        parts.iter().map(|p| Ok(if repeats > 1 { ops::expand_dims(p, -3)? } else { p.clone() })).collect()
    };
    let (k, v) = (grouped(k)?, grouped(v)?);
    if repeats > 1 {
        q = q.reshape(&[b, kv_heads, repeats, l, dim])?;
    }
    let mut scores = ops::quantized_matmul(&q, &k[0], &k[1], &k[2], true, scheme.group_size, scheme.bits)?;
    let keys_len = scores.shape()[scores.ndim() - 1];
    let mask = match mask {
        Mask::None => None,
        // The causal mask of the last `l` queries over every key, spelled out.
        Mask::Causal => {
            let rows = ops::arange::<_, i32>(keys_len - l, keys_len, 1)?.reshape(&[l, 1])?;
            let cols = ops::arange::<_, i32>(0, keys_len, 1)?.reshape(&[1, keys_len])?;
            Some(rows.ge(&cols)?)
        }
        Mask::Array(m) => Some(if repeats > 1 && m.ndim() > 3 { ops::expand_dims(m, -3)? } else { m.clone() }),
    };
    if let Some(m) = mask {
        let lowest = Array::from_f32(lowest(scores.dtype())?).as_dtype(scores.dtype())?;
        scores = ops::select(&m, &scores, &lowest)?;
    }
    let scores = ops::softmax_axis(&scores, -1, true)?;
    let out = ops::quantized_matmul(&scores, &v[0], &v[1], &v[2], false, scheme.group_size, scheme.bits)?;
    Ok(if repeats > 1 { out.reshape(&[b, heads, l, -1])? } else { out })
}

/// `mx.finfo(dtype).min`: what masked scores are set to.
fn lowest(dtype: Dtype) -> Result<f32> {
    match dtype {
        Dtype::Float32 => Ok(f32::MIN),
        Dtype::Bfloat16 => Ok(-3.389_531_4e38),
        Dtype::Float16 => Ok(-65504.0),
        d => Err(Error::Internal(format!("attention scores in {d:?}"))),
    }
}

/// What MLX's affine quantization takes.
const BITS: [i32; 6] = [2, 3, 4, 5, 6, 8];
const GROUP_SIZES: [i32; 3] = [32, 64, 128];

/// KV quantization as a request asks for it, with mlx-bun's names and defaults: `kvBits` (off),
/// `kvGroupSize` 64, `quantizedKvStart` 5000 (0 with a `kvConfig`), and `kvConfig`, a scheme per
/// layer (layers it does not list stay plain), which overrides `kvBits`.
#[derive(Debug, Clone, PartialEq)]
pub struct KvQuantOptions {
    pub bits: Option<i32>,
    pub group_size: i32,
    pub start: Option<usize>,
    pub config: Vec<(usize, KvQuant)>,
}

impl Default for KvQuantOptions {
    fn default() -> Self {
        KvQuantOptions { bits: None, group_size: 64, start: None, config: Vec::new() }
    }
}

impl KvQuantOptions {
    pub fn is_on(&self) -> bool {
        self.bits.is_some() || !self.config.is_empty()
    }

    /// Checks the numbers MLX would reject; layer indices are checked by `policy`.
    pub fn validate(&self) -> Result<()> {
        let check = |name: &'static str, bits: i32, group: i32| -> Result<()> {
            if !BITS.contains(&bits) {
                return Err(Error::option(name, format!("bits must be one of 2, 3, 4, 5, 6, 8, got {bits}")));
            }
            if !GROUP_SIZES.contains(&group) {
                return Err(Error::option(name, format!("group size must be one of 32, 64, 128, got {group}")));
            }
            Ok(())
        };
        if let Some(bits) = self.bits {
            check("kvBits", bits, self.group_size)?;
        } else if !GROUP_SIZES.contains(&self.group_size) {
            return Err(Error::option("kvGroupSize", format!("must be one of 32, 64, 128, got {}", self.group_size)));
        }
        for (_, q) in &self.config {
            check("kvConfig", q.bits, q.group_size)?;
        }
        Ok(())
    }

    /// The policy for a model of `layers` layers whose keys have `head_dim` elements per head,
    /// if quantization is on.
    pub fn policy(&self, layers: usize, head_dim: usize) -> Result<Option<KvPolicy>> {
        if !self.is_on() {
            return Ok(None);
        }
        let groups = self.config.iter().map(|(_, q)| q.group_size).chain(self.config.is_empty().then_some(self.group_size));
        for g in groups {
            if head_dim % g as usize != 0 {
                let name = if self.config.is_empty() { "kvGroupSize" } else { "kvConfig" };
                return Err(Error::option(name, format!("group size {g} does not divide the model's head dimension ({head_dim})")));
            }
        }
        let mut schemes = vec![None; layers];
        if self.config.is_empty() {
            let q = KvQuant { bits: self.bits.expect("on"), group_size: self.group_size };
            schemes.iter_mut().for_each(|s| *s = Some(q));
        }
        for &(layer, q) in &self.config {
            let slot = schemes.get_mut(layer).ok_or_else(|| Error::option("kvConfig", format!("layerIdx {layer} is not a layer (the model has {layers})")))?;
            *slot = Some(q);
        }
        let start = self.start.unwrap_or(if self.config.is_empty() { 5000 } else { 0 });
        Ok(Some(KvPolicy { layers: schemes, start }))
    }
}

/// A request's KV quantization: the scheme of each layer (`None`: stays plain), applied once a
/// layer's cache holds `start` positions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KvPolicy {
    pub layers: Vec<Option<KvQuant>>,
    pub start: usize,
}

impl KvPolicy {
    /// Converts the caches that are due: plain, holding at least `start` positions and at least
    /// one (an empty cache is converted after its first prefill, as mlx-bun does), with a
    /// scheme. Each converted layer is evaluated before the next is built, so the plain buffers
    /// of every layer are never held beside their quantized copies at once.
    pub fn quantize_due(&self, caches: &mut [LayerCache]) -> Result<()> {
        for (cache, scheme) in caches.iter_mut().zip(&self.layers) {
            let Some(q) = scheme else { continue };
            let offset = cache.offset();
            if cache.quantization().is_some() || offset == 0 || offset < self.start {
                continue;
            }
            cache.quantize(*q)?;
            mlx_rs::transforms::eval(cache.state())?;
        }
        Ok(())
    }

    /// What names the scheme in a prefix-cache namespace: caches quantized differently are not
    /// interchangeable.
    pub fn tag(&self) -> String {
        let layers: Vec<String> = self.layers.iter().map(|l| l.map_or("-".into(), |q| format!("{}/{}", q.bits, q.group_size))).collect();
        format!("kv[{}]@{}", layers.join(","), self.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::KvCache;

    fn random(shape: &[i32], seed: u64) -> Array {
        let key = mlx_rs::random::key(seed).unwrap();
        mlx_rs::random::normal::<f32>(shape, None, None, &key).unwrap()
    }

    fn max_diff(a: &Array, b: &Array) -> f32 {
        ops::abs(&ops::subtract(a, b).unwrap()).unwrap().max(None).unwrap().item_exact::<f32>()
    }

    /// Our one-node attention of a decode step gives MLX's `fast::scaled_dot_product_attention`
    /// bit for bit: grouped heads or not, one to several hundred keys, keys and values as a
    /// cache holds them (a slice of room allocated ahead), packed, or transposed in memory (each
    /// of MLX's layouts for BLAS), no mask or a causal one, two sequences.
    #[test]
    fn one_position_attention_kernel_equals_mlx_bit_for_bit() {
        if !kernels::affine_rows_fast() {
            return; // the kernel runs on x86_64 CPUs with AVX2 (layers_tests checks which)
        }
        let bits = |a: &Array| {
            a.eval().unwrap();
            a.as_slice::<f32>().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        for (b, heads, kv_heads) in [(1, 9, 3), (2, 4, 4), (1, 8, 1)] {
            for t in [1, 7, 64, 300] {
                let q = random(&[b, heads, 1, 64], 1);
                let room = random(&[b, kv_heads, 512, 64], 2);
                let in_room = room.index((.., .., ..t, ..));
                let packed = random(&[b, kv_heads, t, 64], 3);
                let transposed = random(&[b, kv_heads, 64, t], 4).transpose_axes(&[0, 1, 3, 2]).unwrap();
                let strided = room.index((.., .., ..t, ..32));
                for (k, v) in [(&in_room, &packed), (&packed, &in_room), (&transposed, &transposed), (&in_room, &strided), (&strided, &in_room)] {
                    if k.shape()[3] != 64 {
                        continue; // queries and keys share their width
                    }
                    assert!(kernels::sdpa_rows_fits(&q, k, v));
                    let ours = bits(&kernels::sdpa_rows(&q, k, v, 0.125, false).unwrap());
                    for mask in [Mask::None, Mask::Causal] {
                        let mlx = bits(&fast::scaled_dot_product_attention(&q, k, v, 0.125, mask.sdpa(), None).unwrap());
                        let differ = ours.iter().zip(&mlx).filter(|(a, b)| a != b).count();
                        assert_eq!(differ, 0, "[{b}, {heads}/{kv_heads}] over {t} keys {:?}, values {:?}", k.strides(), v.strides());
                    }
                }
            }
        }
    }

    /// The opt-in form of that attention (`f32Matmuls: 'all'`: products in fused multiply-adds)
    /// stays within f32 rounding of MLX's numbers, is not MLX's numbers everywhere, and gives a
    /// sequence what it gives it alone, over a cache's slice of room or packed keys and values.
    #[test]
    fn factored_one_position_attention_is_within_rounding_of_mlx() {
        if !kernels::fma_kernels() {
            return; // the factored form needs FMA (the kernel's own test checks which CPUs run it)
        }
        let host = |a: &Array| {
            a.eval().unwrap();
            a.as_slice::<f32>().to_vec()
        };
        let mut differ = 0;
        for (heads, kv_heads, t) in [(9, 3, 1), (9, 3, 37), (4, 4, 300), (8, 1, 64)] {
            let q = random(&[2, heads, 1, 64], 5);
            let room = random(&[2, kv_heads, 512, 64], 6);
            let k = room.index((.., .., ..t, ..));
            let v = random(&[2, kv_heads, t, 64], 7);
            let ours = host(&kernels::sdpa_rows(&q, &k, &v, 0.125, true).unwrap());
            let mlx = host(&fast::scaled_dot_product_attention(&q, &k, &v, 0.125, None, None).unwrap());
            for (a, b) in ours.iter().zip(&mlx) {
                assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "[{heads}/{kv_heads}] over {t} keys: {a} against {b}");
            }
            differ += ours.iter().zip(&mlx).filter(|(a, b)| a != b).count();
            let first = |a: &Array| a.index((0..1, .., .., ..));
            let alone = host(&kernels::sdpa_rows(&first(&q), &first(&k), &first(&v), 0.125, true).unwrap());
            assert_eq!(alone, ours[..alone.len()], "[{heads}/{kv_heads}] over {t} keys: a sequence alone");
        }
        assert!(differ > 0, "the factored form gave MLX's numbers everywhere");
    }

    /// Quantized attention is attention over the dequantized keys and values (up to float
    /// rounding), with and without grouped heads, with the causal mask spelled out.
    #[test]
    fn quantized_attention_attends_over_the_dequantized_cache() {
        let q = random(&[1, 4, 3, 64], 1);
        let (k, v) = (random(&[1, 2, 5, 64], 2), random(&[1, 2, 5, 64], 3));
        let scheme = KvQuant { bits: 8, group_size: 64 };
        let (kq, vq) = (Kv::new(k, Some(scheme)).unwrap(), Kv::new(v, Some(scheme)).unwrap());
        let deq = |kv: &Kv| {
            let p = kv.parts();
            let d = ops::dequantize(&p[0], &p[1], &p[2], 64, 8).unwrap();
            // Repeat each KV head for its two query heads, as the fused kernel does.
            Kv::Plain(ops::repeat_axis::<f32>(d, 2, 1).unwrap())
        };
        for mask in [Mask::None, Mask::Causal] {
            let got = attention(&q, &kq, &vq, 0.125, &mask, false).unwrap();
            let want = attention(&q, &deq(&kq), &deq(&vq), 0.125, &mask, false).unwrap();
            assert_eq!(got.shape(), &[1, 4, 3, 64]);
            assert!(max_diff(&got, &want) < 1e-4, "{}", max_diff(&got, &want));
        }
    }

    #[test]
    fn caches_convert_once_due_and_keep_growing_quantized() {
        let policy = KvPolicy { layers: vec![Some(KvQuant { bits: 4, group_size: 64 }), None], start: 4 };
        let mut caches = vec![LayerCache::Plain(KvCache::default()), LayerCache::Plain(KvCache::default())];
        let step = |caches: &mut Vec<LayerCache>, n: i32| {
            for c in caches.iter_mut() {
                c.update_and_fetch(random(&[1, 2, n, 64], 4), random(&[1, 2, n, 64], 5)).unwrap();
            }
            policy.quantize_due(caches).unwrap();
        };
        step(&mut caches, 3);
        assert!(caches[0].quantization().is_none(), "3 positions < start 4");
        step(&mut caches, 1);
        assert_eq!(caches[0].quantization(), Some(KvQuant { bits: 4, group_size: 64 }));
        assert!(caches[1].quantization().is_none(), "a layer without a scheme stays plain");
        let plain_bytes = caches[1].nbytes();
        assert!(caches[0].nbytes() * 4 < plain_bytes, "{} vs {plain_bytes}", caches[0].nbytes());
        for _ in 0..300 {
            step(&mut caches, 1);
        }
        assert_eq!(caches[0].offset(), 304);
        let (k, _) = caches[0].update_and_fetch(random(&[1, 2, 1, 64], 6), random(&[1, 2, 1, 64], 7)).unwrap();
        assert_eq!(k.len(), 305);
        assert_eq!(caches[0].trim(5), 5);
        assert_eq!(caches[0].offset(), 300);
    }
}
