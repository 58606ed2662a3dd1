//! GGML blocks as MLX affine groups: `w = scale·q + bias` over 32 consecutive values, with `q`
//! unsigned — the form MLX's quantized products (and our CPU kernel) read.
//!
//! The types below have one scale and one offset per 32 values, so they fit that form: Q4_0,
//! Q4_1 and Q4_K at 4 bits; Q8_0, Q5_0, Q5_1 and Q5_K at 8 bits (5-bit values stored in 8 bits,
//! since our kernel reads 2, 4 and 8 bits). Scales and biases are given in f32, where they are
//! exact: an f16 times a 6-bit integer needs at most 17 bits of mantissa. And `scale·q + bias`
//! computed in f32 is, for finite scales, the value `quants::dequantize` (llama.cpp's reference)
//! gives, bit for bit but for the sign of a zero (`d·8 − 8d` is +0 where `d·(8 − 8)` is −0 for a
//! negative `d`, which changes no sum but one that is exactly zero): `scale·q` is exact (at most
//! 11 + 8 bits), and the one rounding of the sum is the one llama.cpp's `d·(q − 8)`, `d·q + m`
//! or `d·sc·q − dmin·m` makes (the signed types shift `q` up and take the shift back in the bias,
//! `d·q − 8d = d·(q − 8)` exactly). Q2_K, Q3_K and Q6_K scale every 16 values, a group size MLX
//! does not take. The values are unpacked by `quants`' own helpers, as its dequantizers do.
use super::quants::{f16_at, five_bit, k_group, nibbles, scale_min_k4};
use super::GgmlType;

/// Values per group.
pub const GROUP: usize = 32;

/// One group: `w[k] = scale·q[k] + bias`.
pub struct Group {
    pub scale: f32,
    pub bias: f32,
    pub q: [u8; GROUP],
}

/// The bit width of `kind`'s affine form, if it has one.
pub fn bits(kind: GgmlType) -> Option<usize> {
    match kind {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4K => Some(4),
        GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5K => Some(8),
        _ => None,
    }
}

/// The groups of one block of `kind` (one for the 32-value types, eight for Q4_K and Q5_K), in
/// order. `block` must be one whole block of a type `bits` accepts (the caller checked lengths).
pub fn groups(kind: GgmlType, block: &[u8], mut sink: impl FnMut(Group)) {
    let one = |scale: f32, bias: f32, q: [u8; GROUP]| Group { scale, bias, q };
    match kind {
        // w = d·(q − 8)
        GgmlType::Q4_0 => {
            let d = f16_at(block, 0);
            sink(one(d, -8.0 * d, nibbles(&block[2..18])))
        }
        // w = d·q + m
        GgmlType::Q4_1 => sink(one(f16_at(block, 0), f16_at(block, 2), nibbles(&block[4..20]))),
        // w = d·(q − 16)
        GgmlType::Q5_0 => {
            let d = f16_at(block, 0);
            sink(one(d, -16.0 * d, five_bit(&block[2..6], &block[6..22])))
        }
        GgmlType::Q5_1 => sink(one(f16_at(block, 0), f16_at(block, 2), five_bit(&block[4..8], &block[8..24]))),
        // w = d·q with signed q: shifted to unsigned, w = d·(q + 128) − 128·d
        GgmlType::Q8_0 => {
            let d = f16_at(block, 0);
            sink(one(d, -128.0 * d, std::array::from_fn(|k| (block[2 + k] as i8 as i16 + 128) as u8)))
        }
        // Eight groups: w = (d·sc)·q − dmin·m.
        GgmlType::Q4K | GgmlType::Q5K => {
            let (d, dmin, scales) = (f16_at(block, 0), f16_at(block, 2), &block[4..16]);
            let (qh, qs) = if kind == GgmlType::Q5K { (Some(&block[16..48]), &block[48..176]) } else { (None, &block[16..144]) };
            for g in 0..8 {
                let (sc, m) = scale_min_k4(g, scales);
                sink(one(d * sc as f32, -(dmin * m as f32), k_group(qs, qh, g)));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::quants::{dequantize, tests::test_blocks};

    /// For every type with an affine form, `scale·q + bias` in f32 is llama.cpp's value bit for
    /// bit, on random blocks (f16 scales of any finite size, signs, subnormals), and q fits its bits.
    #[test]
    fn affine_groups_give_the_reference_values_bit_for_bit() {
        let kinds = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q5K];
        for kind in kinds {
            let (block_values, size) = (kind.block_size().unwrap() as usize, kind.type_size().unwrap() as usize);
            let blocks = 300;
            let data = test_blocks(kind, 11, blocks);
            let want = dequantize("t", kind, &data, blocks * block_values).unwrap();
            let (mut got, mut max_q) = (Vec::new(), 0);
            for block in data.chunks_exact(size) {
                groups(kind, block, |g| {
                    max_q = max_q.max(*g.q.iter().max().unwrap());
                    got.extend(g.q.iter().map(|&q| g.scale * q as f32 + g.bias));
                });
            }
            assert_eq!(got.len(), want.len(), "{kind}");
            // A zero may lose its sign (d·8 − 8d is +0 where llama.cpp's d·(8 − 8) is −0 for a
            // negative d); every other value is the same bits.
            let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits() && !(**a == 0.0 && **b == 0.0)).count();
            assert_eq!(differ, 0, "{kind}: {differ} values differ");
            let bits = bits(kind).unwrap();
            assert!((max_q as usize) < 1 << bits, "{kind}: q {max_q} needs more than {bits} bits");
        }
        for kind in [GgmlType::Q2K, GgmlType::Q3K, GgmlType::Q6K, GgmlType::F32, GgmlType::BF16] {
            assert_eq!(bits(kind), None, "{kind}");
        }
    }
}
